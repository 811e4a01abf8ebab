// The try-on page: pick the inputs (checked here at once; the server checks again), optionally paint or upload a
// mask over the person photo (one per garment for an outfit: editor.js), run a job and follow it, keep every
// result of this visit, edit a run's masks and run again with that run's seed, download everything as one zip
// (zip.js).
"use strict";

const $ = (id) => document.getElementById(id);
const chosen = { person: null, garment: null, garment2: null };  // File per role (garment2: an outfit)
const WHAT = { person: "the person photo", garment: "the garment photo", garment2: "the second garment photo" };
const MASK_OF = { garment: "the garment", garment2: "the second garment" };
const MASK_LABEL = { garment: "Garment", garment2: "Second garment" };  // the labels of #mask-for's choices
let options = null;  // GET api/options: choices, defaults, limits
const runs = [];     // this visit's finished runs, oldest first: {number, job, files: [{name, url, blob}]}
let current = null;  // the job being followed: {id}
let editing = null;  // the run whose masks are in the editor ("Edit this mask"), until they are replaced
let busy = false;

// ---- messages

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

async function readError(response) {
  try {
    const body = await response.json();
    if (body && body.error) return body.error;
  } catch (_) { /* not JSON */ }
  return `the server answered HTTP ${response.status}`;
}

function sizeWords(bytes) {
  return bytes < 2 ** 20 ? `${Math.round(bytes / 1024)} KB` : `${(bytes / 2 ** 20).toFixed(1)} MB`;
}

// ---- server state

function fillSelect(select, words, value) {
  select.innerHTML = "";
  for (const word of words) {
    const option = document.createElement("option");
    option.value = option.textContent = word;
    select.appendChild(option);
  }
  select.value = value;
}

function showModelType() {
  const category = $("category").value;
  const model = options.model_types[category];
  $("model-type").textContent = category === "auto" ? "category and model: chosen from the garment photo"
    : model ? `model: ${model}` : "this category needs the dc model, which this server does not run";
}

async function loadOptions() {
  const response = await fetch("api/options");
  if (!response.ok) throw new Error(await readError(response));
  options = await response.json();
  fillSelect($("category"), options.categories, options.categories[0]);
  fillSelect($("category2"), options.categories, "lower");
  fillSelect($("resolution"), options.resolutions, options.defaults.resolution);
  fillSelect($("scheduler"), options.schedulers, options.defaults.scheduler);
  fillSelect($("fit"), options.fits, options.defaults.fit);
  $("samples").value = options.defaults.samples;
  $("samples").max = options.limits.samples;
  $("steps").value = options.defaults.steps;
  $("steps").max = options.limits.steps;
  $("scale").value = options.defaults.scale;
  showModelType();
}

async function refreshHealth() {
  try {
    const health = await (await fetch("api/health")).json();
    const loaded = health.models_loaded.length ? health.models_loaded.join(", ") : "none yet";
    $("server-status").textContent =
      `${health.device} · precision ${health.precision} · attention ${health.attention} · models loaded: ${loaded}`;
    const note = health.checkpoints && health.checkpoints.note;
    $("notice").textContent = note ? "This server does not run the released OOTDiffusion checkpoints: its pictures "
      + "only show that the chain runs, not a real try-on." : "";
    $("notice").title = note || "";  // the differences themselves (also in api/health)
    $("notice").hidden = !note;
  } catch (_) {
    $("server-status").textContent = "server not answering";
  }
}

// ---- inputs, checked as soon as they are chosen

function loadImage(url) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error("not an image"));
    img.src = url;
  });
}

const IMAGE_NAME = /\.(png|jpe?g|webp|bmp|gif|tiff?)$/i;

// The file as an image, or an error worded for this page; the server checks the same things again.
async function checkUpload(what, file) {
  const name = file.name || what;
  if (!(file.type || "").startsWith("image/") && !IMAGE_NAME.test(name)) {
    throw new Error(`${what} ${name} is not an image: choose a PNG, JPEG or WebP photo`);
  }
  const limit = options ? options.max_upload_bytes : Infinity;
  if (file.size > limit) {
    throw new Error(`${what} ${name} is ${sizeWords(file.size)}: this server takes at most ${sizeWords(limit)} `
                    + "for all files of a run together");
  }
  const url = URL.createObjectURL(file);
  try {
    const img = await loadImage(url);
    if (img.naturalWidth < 64 || img.naturalHeight < 64) {
      throw new Error(`${what} ${name} is ${img.naturalWidth}x${img.naturalHeight}: at least 64 px a side`);
    }
    return { img, url };
  } catch (error) {
    URL.revokeObjectURL(url);
    if (error.message === "not an image") throw new Error(`${what} ${name} cannot be read as an image`);
    throw error;
  }
}

async function choose(role, file) {
  showError("");
  let checked;
  try {
    checked = await checkUpload(WHAT[role], file);
  } catch (error) {
    showError(error.message);
    return;
  }
  chosen[role] = file;
  const preview = $(`${role}-preview`);
  preview.src = checked.url;
  preview.hidden = false;
  if (role === "person") usePerson(checked.img);
  if (role === "garment2") showOutfit();
}

// A second garment makes an outfit: its category, a mask of its own, and a way back to one garment.
function showOutfit() {
  $("category2-label").hidden = !chosen.garment2;
  $("garment2-clear").hidden = !chosen.garment2;
  if (!chosen.garment2) {
    $("garment2-preview").hidden = true;
    clearLayer("garment2", false);
    if (editor.active === "garment2") showLayer("garment");
  }
  showMaskState();
}

function removeGarment2() {
  chosen.garment2 = null;
  showOutfit();
}

async function useExample(button) {
  const response = await fetch(`static/examples/${button.dataset.example}.png`);
  const blob = await response.blob();
  await choose(button.dataset.for, new File([blob], `${button.dataset.example}.png`, { type: "image/png" }));
  const select = button.dataset.for === "garment2" ? "category2" : "category";
  if (button.dataset.category) { $(select).value = button.dataset.category; showModelType(); }
}

// ---- the masks: the editor (editor.js) holds a layer per garment; this says which is shown and what is sent

function usePerson(personImage) {  // a new photo: empty masks over it
  editing = null;
  startEditor(personImage);
  $("editor-empty").hidden = true;
  $("editor-tools").hidden = false;
  $("mask-canvas").hidden = false;
}

function maskRoles() {  // the garments that take a mask: the API's `mask`, and `mask2` for an outfit
  return chosen.garment2 ? MASK_ROLES : ["garment"];
}

function showMaskState() {
  const roles = maskRoles();
  const mine = roles.filter((role) => editor.painted[role]);
  const outfit = roles.length > 1;
  const run = editing;
  const active = outfit ? editor.active : "garment";
  $("mask-for").hidden = !outfit;
  for (const role of MASK_ROLES) {
    $(`mask-for-${role}`).checked = role === active;
    $(`mask-for-${role}-state`).textContent = editor.painted[role] ? "yours" : "automatic";
  }
  const missing = roles.find((role) => !editor.painted[role]);
  const pending = outfit && mine.length === 1
    ? ` ${MASK_OF[missing].replace("the", "The")} needs one too: choose “${MASK_LABEL[missing]}”.` : "";
  $("mask-state").textContent = !mine.length
    ? (outfit ? "Automatic: pose and parsing find each garment's area. Or paint a mask for each garment over the "
                + "person photo (choose “Garment” or “Second garment” above it; or upload one, white = repaint), "
                + "then run."
              : "Automatic: pose and parsing find the garment's area. Or paint it over the person photo (or upload a "
                + "mask, white = repaint), then run.")
    : run ? `Editing the mask${outfit ? "s" : ""} of run ${run.number} (seed ${run.job.seed}, kept in the Seed `
            + `field: change it for new noise). Paint where ${MASK_OF[active]} goes, erase where the person `
            + `stays.${pending}`
    : `Your mask${outfit ? ` of ${MASK_OF[active]}` : ""}: red is repainted. Paint where `
      + `${outfit ? "it" : "the garment"} goes, erase where the person stays.${pending}`;
  $("mask-note").textContent = !outfit ? `mask: ${mine.length ? "yours" : "automatic"}`
    : `masks: ${mine.length === 2 ? "yours" : mine.length ? "one of two painted" : "automatic"}`;
  $("mask-rerun").textContent = outfit ? "Run with these masks" : "Run with this mask";
  $("mask-rerun").disabled = busy || !mine.length;
}

async function uploadMask(file) {
  showError("");
  if (!editor.person) { showError("choose the person photo first: a mask goes with its photo"); return; }
  try {
    const { img, url } = await checkUpload("the mask", file);
    URL.revokeObjectURL(url);
    const person = editor.person;
    const off = Math.abs(img.naturalWidth / img.naturalHeight - person.naturalWidth / person.naturalHeight);
    if (off > 0.01) {
      throw new Error(`the mask ${file.name} is ${img.naturalWidth}x${img.naturalHeight} but the person photo is `
                      + `${person.naturalWidth}x${person.naturalHeight}: a mask must have the photo's shape`);
    }
    editing = null;
    maskIntoLayer(img, maskRoles().includes(editor.active) ? editor.active : "garment");
  } catch (error) {
    showError(error.message);
  }
}

function automaticMask() {  // the shown garment's mask goes back to automatic
  clearLayer(maskRoles().includes(editor.active) ? editor.active : "garment");
  if (!maskRoles().some((role) => editor.painted[role])) { editing = null; showMaskState(); }
}

// A run's photos, categories and masks back in the inputs (its seed in the Seed field): only what is changed
// then differs in the next run.
async function editRun(run) {
  showError("");
  const { inputs } = run;
  for (const role of ["person", "garment", "garment2"]) {
    chosen[role] = inputs[role];
    if (inputs[role]) $(`${role}-preview`).src = inputs[`${role}URL`];
    $(`${role}-preview`).hidden = !inputs[role];
  }
  $("category").value = inputs.category;
  $("category2").value = inputs.category2;
  showModelType();
  if (editor.person !== inputs.personImage) usePerson(inputs.personImage);
  for (const [role, kind] of [["garment", "person_mask"], ["garment2", "person_mask2"]]) {
    const file = run.files.find((f) => f.kind === kind);
    if (file) maskIntoLayer(await loadImage(file.url), role);
    else clearLayer(role, false);
  }
  editing = run;
  showLayer("garment");
  showOutfit();
  $("seed").value = run.job.seed;
  $("editor").scrollIntoView({ block: "start" });
}

// ---- running a job

function formData(masks) {  // masks: none (automatic), or one per garment
  const form = new FormData();
  form.append("person", chosen.person, chosen.person.name || "person.png");
  form.append("garment", chosen.garment, chosen.garment.name || "garment.png");
  if (masks[0]) form.append("mask", masks[0], "mask.png");
  form.append("category", $("category").value);
  if (chosen.garment2) {
    form.append("garment2", chosen.garment2, chosen.garment2.name || "garment2.png");
    form.append("category2", $("category2").value);
    if (masks[1]) form.append("mask2", masks[1], "mask2.png");
  }
  for (const field of ["samples", "steps", "scale", "seed", "resolution", "scheduler", "fit"]) {
    const value = $(field).value.trim();
    if (value !== "") form.append(field, value);
  }
  form.append("keep_unmasked", $("keep-unmasked").checked ? "true" : "false");
  return form;
}

function setBusy(now) {
  busy = now;
  $("run").disabled = busy;
  $("mask-rerun").disabled = busy || !maskRoles().some((role) => editor.painted[role]);
  $("cancel").hidden = !busy;
  $("progress").hidden = !busy;
}

function describeProgress(job) {
  if (job.state === "queued") {
    const ahead = job.position - 1;
    return [0, ahead > 0 ? `waiting: ${ahead} request(s) ahead` : "starting..."];
  }
  const labels = { load: "loading the model", pose: "finding the person", person: "preparing the person",
                   garment: "preparing the garment", denoise: "denoising", decode: "decoding" };
  if (job.stage && job.total) return [job.done / job.total, `${labels[job.stage] || job.stage} ${job.done}/${job.total}`];
  return [0, job.stage ? (labels[job.stage] || job.stage) : "preparing inputs..."];
}

function pageError(job, outfit) {
  if (job.needs_mask) {
    $("editor").scrollIntoView({ block: "start" });
    return outfit
      ? "No person was found in this photo. Paint each garment's area over the photo in the Mask section (choose "
        + "“Garment”, paint, then “Second garment”; or upload a mask for each), then run again."
      : "No person was found in this photo. Paint the garment's area over the photo in the Mask section "
        + "(or upload a mask), then run again.";
  }
  return job.error;
}

// The masks to send: none (automatic), or one per garment; null (and the error shown) for an outfit with one.
async function masksToSend() {
  const roles = maskRoles();
  const mine = roles.filter((role) => !maskIsEmpty(role));
  if (mine.length && mine.length < roles.length) {
    const [missing, given] = mine[0] === "garment" ? ["garment2", "garment"] : ["garment", "garment2"];
    showError(`an outfit takes a mask for each garment or for neither: paint or upload ${MASK_OF[missing]}'s mask `
              + `too (choose “${MASK_LABEL[missing]}” in the Mask section), or choose “${MASK_LABEL[given]}” and `
              + "press “Automatic mask”");
    return null;
  }
  return mine.length ? Promise.all(roles.map((role) => maskBlob(role))) : [];
}

async function run() {
  if (!chosen.person || !chosen.garment) { showError("choose a person photo and a garment photo first"); return; }
  showError("");
  const inputs = { person: chosen.person, garment: chosen.garment, garment2: chosen.garment2,
                   personImage: editor.person, personURL: $("person-preview").src,
                   garmentURL: $("garment-preview").src, garment2URL: $("garment2-preview").src,
                   category: $("category").value, category2: $("category2").value };
  const masks = await masksToSend();
  if (masks === null) return;
  setBusy(true);
  $("progress-bar").value = 0;
  $("progress-text").textContent = "uploading...";
  try {
    const response = await fetch("api/jobs", { method: "POST", body: formData(masks) });
    if (!response.ok) { showError(await readError(response)); return; }
    current = await response.json();
    for (;;) {
      const poll = await fetch(`api/jobs/${current.id}`);
      if (poll.status === 410) { showError("cancelled"); return; }  // cancelled here (DELETE): gone
      if (!poll.ok) { showError(await readError(poll)); return; }
      const job = await poll.json();
      if (job.state === "done") { await addRun(job, inputs); return; }
      if (job.state === "cancelled") { showError("cancelled"); return; }
      if (job.state === "failed") { showError(pageError(job, Boolean(inputs.garment2))); return; }
      const [fraction, text] = describeProgress(job);
      $("progress-bar").value = fraction;
      $("progress-text").textContent = text;
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  } catch (error) {
    showError(`the server did not answer (${error.message})`);
  } finally {
    current = null;
    setBusy(false);
    refreshHealth();
  }
}

function cancelRun() {
  if (current) fetch(`api/jobs/${current.id}`, { method: "DELETE", keepalive: true }).catch(() => {});
}

// ---- the history of this visit: every run kept, with its files held here (the server forgets old jobs)

async function fetchFile(url, name, kind) {
  const blob = await (await fetch(url)).blob();
  return { name, kind, blob, url: URL.createObjectURL(blob) };
}

async function addRun(job, inputs) {
  const files = await Promise.all([
    ...job.images.map((url, i) => fetchFile(url, job.names[i], "result")),
    fetchFile(job.mask, decodeURIComponent(job.mask.split("/").pop()), "mask"),
    fetchFile(job.masked_person, decodeURIComponent(job.masked_person.split("/").pop()), "masked_person"),
    fetchFile(job.person_mask, decodeURIComponent(job.person_mask.split("/").pop()), "person_mask"),
    ...(job.person_mask2  // an outfit's: the second garment's mask
      ? [fetchFile(job.person_mask2, decodeURIComponent(job.person_mask2.split("/").pop()), "person_mask2")] : []),
  ]);
  const entry = { number: runs.length + 1, job, files, inputs };
  runs.push(entry);
  const card = renderRun(entry);
  $("history").prepend(card);
  const box = card.getBoundingClientRect();
  if (box.top > window.innerHeight || box.bottom < 0) card.scrollIntoView({ block: "start" });
  $("history-empty").hidden = true;
  $("run-count").textContent = `(${runs.length})`;
  $("download-all").disabled = false;
  $("seed").placeholder = `random (last: ${job.seed})`;
}

function figure(file, className, caption) {
  const fig = document.createElement("figure");
  const img = document.createElement("img");
  img.src = file.url;
  img.alt = caption;
  img.className = className;
  const link = document.createElement("a");
  link.href = file.url;
  link.download = file.name;
  link.textContent = caption;
  const cap = document.createElement("figcaption");
  cap.appendChild(link);
  fig.append(img, cap);
  return fig;
}

function renderRun(entry) {
  const { job, files } = entry;
  const box = document.createElement("article");
  box.className = "run";
  box.dataset.number = entry.number;
  const head = document.createElement("div");
  head.className = "run-head";
  const title = document.createElement("strong");
  title.textContent = `Run ${entry.number}`;
  const about = document.createElement("span");
  about.className = "muted run-about";
  const steps = job.settings.steps === 1 ? "1 step" : `${job.settings.steps} steps`;
  const outfit = Boolean(job.person_mask2);
  about.textContent = `${outfit ? "outfit · " : ""}seed ${job.seed} · model ${job.model_type} · ${steps} · `
    + `mask${outfit ? "s" : ""} ${job.settings.mask === "uploaded" ? "yours" : "automatic"} · `
    + `${job.timings.run.toFixed(1)} s`
    + (job.preservation ? ` · ${job.preservation.summary}` : "");  // what it changed outside the mask
  const edit = document.createElement("button");
  edit.type = "button";
  edit.className = "edit-mask";
  edit.textContent = outfit ? "Edit these masks" : "Edit this mask";
  edit.addEventListener("click", () => editRun(entry));
  head.append(title, about, edit);
  const images = document.createElement("div");
  images.className = "run-images";
  for (const file of files.filter((f) => f.kind === "result")) images.append(figure(file, "result", `download ${file.name}`));
  images.append(figure(files.find((f) => f.kind === "mask"), "thumb", "mask"),
                figure(files.find((f) => f.kind === "masked_person"), "thumb", "masked person"));
  box.append(head, images);
  return box;
}

// ---- "download all": a zip of every run's files (zip.js)

function allFiles() {
  return runs.flatMap((entry) => entry.files.filter((f) => !f.kind.startsWith("person_mask")).map((f) => ({
    name: `run-${String(entry.number).padStart(2, "0")}-seed${entry.job.seed}/${f.name}`, blob: f.blob })));
}

async function downloadAll() {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(await zipBlob(allFiles()));
  link.download = "ootd-results.zip";
  document.body.appendChild(link);
  link.click();
  link.remove();
}

// ---- wiring

function wire() {
  for (const role of ["person", "garment", "garment2"]) {
    $(`${role}-file`).addEventListener("change", (event) => {
      const file = event.target.files[0];
      if (file) choose(role, file);
      event.target.value = "";
    });
  }
  $("mask-file").addEventListener("change", (event) => {
    const file = event.target.files[0];
    if (file) uploadMask(file);
    event.target.value = "";
  });
  document.querySelectorAll("[data-example]").forEach((b) => b.addEventListener("click", () => useExample(b)));
  $("category").addEventListener("change", showModelType);
  $("garment2-clear").addEventListener("click", removeGarment2);
  for (const role of MASK_ROLES) $(`mask-for-${role}`).addEventListener("change", () => showLayer(role));
  $("run").addEventListener("click", run);
  $("mask-rerun").addEventListener("click", run);
  $("cancel").addEventListener("click", cancelRun);
  $("mask-reset").addEventListener("click", automaticMask);
  $("download-all").addEventListener("click", downloadAll);
  editor.onChange = showMaskState;
  wireEditor();
  window.addEventListener("pagehide", cancelRun);  // a page closed mid-run frees the device
}

wire();
loadOptions().catch((error) => showError(`could not load the page's options: ${error.message}`));
refreshHealth();
