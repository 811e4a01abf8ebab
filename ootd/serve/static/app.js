// The try-on page: pick the inputs (checked here at once; the server checks again), optionally paint or upload a
// mask over the person photo, run a job and follow it, keep every result of this visit, edit a run's mask and
// run again with that run's seed, download everything as one zip.
"use strict";

const $ = (id) => document.getElementById(id);
const chosen = { person: null, garment: null };  // File per role
let options = null;  // GET api/options: choices, defaults, limits
const runs = [];     // this visit's finished runs, oldest first: {number, job, files: [{name, url, blob}]}
let current = null;  // the job being followed: {id}
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
  const model = options.model_types[$("category").value];
  $("model-type").textContent = model ? `model: ${model}`
    : "this category needs the dc model, which this server does not run";
}

async function loadOptions() {
  const response = await fetch("api/options");
  if (!response.ok) throw new Error(await readError(response));
  options = await response.json();
  fillSelect($("category"), options.categories, options.categories[0]);
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
    checked = await checkUpload(role === "person" ? "the person photo" : "the garment photo", file);
  } catch (error) {
    showError(error.message);
    return;
  }
  chosen[role] = file;
  const preview = $(`${role}-preview`);
  preview.src = checked.url;
  preview.hidden = false;
  if (role === "person") startEditor(checked.img);
}

async function useExample(button) {
  const response = await fetch(`static/examples/${button.dataset.example}.png`);
  const blob = await response.blob();
  await choose(button.dataset.for, new File([blob], `${button.dataset.example}.png`, { type: "image/png" }));
  if (button.dataset.category) { $("category").value = button.dataset.category; showModelType(); }
}

// ---- mask editor: a red layer (opaque = repaint) at the person photo's own size, drawn over the photo

const editor = { layer: document.createElement("canvas"), person: null, drawing: false, painted: false,
                 editing: null };

function startEditor(personImage) {
  const canvas = $("mask-canvas");
  editor.person = personImage;
  canvas.width = editor.layer.width = personImage.naturalWidth;
  canvas.height = editor.layer.height = personImage.naturalHeight;
  clearMask();
  $("editor-empty").hidden = true;
  $("editor-tools").hidden = false;
  canvas.hidden = false;
}

function clearMask() {
  editor.layer.getContext("2d").clearRect(0, 0, editor.layer.width, editor.layer.height);
  editor.painted = false;
  editor.editing = null;
  showMaskState();
  redraw();
}

// A mask image (white = repaint) into the layer, stretched to the photo (it has the photo's shape).
function maskIntoLayer(img) {
  const ctx = editor.layer.getContext("2d");
  const { width, height } = editor.layer;
  ctx.clearRect(0, 0, width, height);
  ctx.drawImage(img, 0, 0, width, height);
  const pixels = ctx.getImageData(0, 0, width, height);
  for (let i = 0; i < pixels.data.length; i += 4) {
    const d = pixels.data;
    const on = (d[i] * 0.299 + d[i + 1] * 0.587 + d[i + 2] * 0.114) >= 127 && d[i + 3] >= 127;
    d.set(on ? [230, 40, 40, 255] : [0, 0, 0, 0], i);
  }
  ctx.putImageData(pixels, 0, 0);
  editor.painted = true;
  redraw();
}

function maskIsEmpty() {
  if (!editor.painted) return true;
  const { data } = editor.layer.getContext("2d").getImageData(0, 0, editor.layer.width, editor.layer.height);
  for (let i = 3; i < data.length; i += 4) if (data[i] >= 127) return false;
  return true;
}

function showMaskState() {
  const mine = editor.painted;
  const run = editor.editing;
  $("mask-state").textContent = !mine
    ? "Automatic: pose and parsing find the garment's area. Or paint it over the person photo (or upload a mask, white = repaint), then run."
    : run ? `Editing the mask of run ${run.number} (seed ${run.job.seed}, kept in the Seed field: change it for new noise). Paint where the garment goes, erase where the person stays.`
    : "Your mask: red is repainted. Paint where the garment goes, erase where the person stays.";
  $("mask-note").textContent = mine ? "mask: yours" : "mask: automatic";
  $("mask-rerun").disabled = busy || !mine;
}

function redraw() {
  const canvas = $("mask-canvas");
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  if (editor.person) ctx.drawImage(editor.person, 0, 0);
  ctx.globalAlpha = 0.5;
  ctx.drawImage(editor.layer, 0, 0);
  ctx.globalAlpha = 1;
}

function paint(event) {
  const canvas = $("mask-canvas");
  const box = canvas.getBoundingClientRect();
  const x = (event.clientX - box.left) * canvas.width / box.width;
  const y = (event.clientY - box.top) * canvas.height / box.height;
  const radius = Number($("brush").value) * canvas.width / Math.max(box.width, 1) / 2;
  const ctx = editor.layer.getContext("2d");
  const erase = document.querySelector('input[name="tool"]:checked').value === "erase";
  ctx.globalCompositeOperation = erase ? "destination-out" : "source-over";
  ctx.fillStyle = "rgb(230, 40, 40)";
  ctx.beginPath();
  ctx.arc(x, y, radius, 0, 2 * Math.PI);
  ctx.fill();
  ctx.globalCompositeOperation = "source-over";
  if (!editor.painted) { editor.painted = true; showMaskState(); }
  redraw();
}

// The layer as a black-and-white PNG at the photo's size, what the API's `mask` field takes.
function maskBlob() {
  const out = document.createElement("canvas");
  out.width = editor.layer.width;
  out.height = editor.layer.height;
  const source = editor.layer.getContext("2d").getImageData(0, 0, out.width, out.height);
  const ctx = out.getContext("2d");
  const pixels = ctx.createImageData(out.width, out.height);
  for (let i = 0; i < source.data.length; i += 4) {
    const value = source.data[i + 3] >= 127 ? 255 : 0;
    pixels.data.set([value, value, value, 255], i);
  }
  ctx.putImageData(pixels, 0, 0);
  return new Promise((resolve) => out.toBlob(resolve, "image/png"));
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
    editor.editing = null;
    maskIntoLayer(img);
    showMaskState();
  } catch (error) {
    showError(error.message);
  }
}

async function editRun(run) {
  showError("");
  for (const role of ["person", "garment"]) {  // the run's own photos: only the mask (and seed, if changed) differ
    chosen[role] = run.inputs[role];
    $(`${role}-preview`).src = run.inputs[`${role}URL`];
  }
  if (editor.person !== run.inputs.personImage) startEditor(run.inputs.personImage);
  const maskFile = run.files.find((f) => f.kind === "person_mask");
  const img = await loadImage(maskFile.url);
  maskIntoLayer(img);
  editor.editing = run;
  $("seed").value = run.job.seed;
  showMaskState();
  $("editor").scrollIntoView({ block: "start" });
}

// ---- running a job

function formData(mask) {
  const form = new FormData();
  form.append("person", chosen.person, chosen.person.name || "person.png");
  form.append("garment", chosen.garment, chosen.garment.name || "garment.png");
  if (mask) form.append("mask", mask, "mask.png");
  form.append("category", $("category").value);
  for (const field of ["samples", "steps", "scale", "seed", "resolution", "scheduler", "fit"]) {
    const value = $(field).value.trim();
    if (value !== "") form.append(field, value);
  }
  return form;
}

function setBusy(now) {
  busy = now;
  $("run").disabled = busy;
  $("mask-rerun").disabled = busy || !editor.painted;
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

function pageError(job) {
  if (job.needs_mask) {
    $("editor").scrollIntoView({ block: "start" });
    return "No person was found in this photo. Paint the garment's area over the photo in the Mask section "
      + "(or upload a mask), then run again.";
  }
  return job.error;
}

async function run() {
  if (!chosen.person || !chosen.garment) { showError("choose a person photo and a garment photo first"); return; }
  showError("");
  const inputs = { person: chosen.person, garment: chosen.garment, personImage: editor.person,
                   personURL: $("person-preview").src, garmentURL: $("garment-preview").src };
  const mask = maskIsEmpty() ? null : await maskBlob();
  setBusy(true);
  $("progress-bar").value = 0;
  $("progress-text").textContent = "uploading...";
  try {
    const response = await fetch("api/jobs", { method: "POST", body: formData(mask) });
    if (!response.ok) { showError(await readError(response)); return; }
    current = await response.json();
    for (;;) {
      const poll = await fetch(`api/jobs/${current.id}`);
      if (!poll.ok) { showError(await readError(poll)); return; }
      const job = await poll.json();
      if (job.state === "done") { await addRun(job, inputs); return; }
      if (job.state === "cancelled") { showError("cancelled"); return; }
      if (job.state === "failed") { showError(pageError(job)); return; }
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
  about.textContent = `seed ${job.seed} · model ${job.model_type} · ${steps} · `
    + `mask ${job.settings.mask === "uploaded" ? "yours" : "automatic"} · ${job.timings.run.toFixed(1)} s`;
  const edit = document.createElement("button");
  edit.type = "button";
  edit.className = "edit-mask";
  edit.textContent = "Edit this mask";
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

// ---- "download all": a zip (stored, not compressed: PNGs do not shrink) made here from the files held above

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

function crc32(bytes) {
  let crc = 0xffffffff;
  for (let i = 0; i < bytes.length; i++) crc = CRC_TABLE[(crc ^ bytes[i]) & 0xff] ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

async function zipBlob(files) {
  const parts = [];
  const central = [];
  let offset = 0;
  const now = new Date();
  const time = (now.getHours() << 11) | (now.getMinutes() << 5) | (now.getSeconds() >> 1);
  const date = ((now.getFullYear() - 1980) << 9) | ((now.getMonth() + 1) << 5) | now.getDate();
  for (const file of files) {
    const data = new Uint8Array(await file.blob.arrayBuffer());
    const name = new TextEncoder().encode(file.name);
    const crc = crc32(data);
    const local = new DataView(new ArrayBuffer(30));
    const head = new DataView(new ArrayBuffer(46));
    [[0, 0x04034b50, 4], [4, 20, 2], [6, 0x0800, 2], [8, 0, 2], [10, time, 2], [12, date, 2], [14, crc, 4],
     [18, data.length, 4], [22, data.length, 4], [26, name.length, 2], [28, 0, 2]]
      .forEach(([at, value, size]) => (size === 4 ? local.setUint32(at, value, true) : local.setUint16(at, value, true)));
    [[0, 0x02014b50, 4], [4, 20, 2], [6, 20, 2], [8, 0x0800, 2], [10, 0, 2], [12, time, 2], [14, date, 2],
     [16, crc, 4], [20, data.length, 4], [24, data.length, 4], [28, name.length, 2], [30, 0, 2], [32, 0, 2],
     [34, 0, 2], [36, 0, 2], [38, 0, 4], [42, offset, 4]]
      .forEach(([at, value, size]) => (size === 4 ? head.setUint32(at, value, true) : head.setUint16(at, value, true)));
    parts.push(local.buffer, name, data);
    central.push(head.buffer, name);
    offset += 30 + name.length + data.length;
  }
  const size = central.reduce((sum, part) => sum + part.byteLength, 0);
  const end = new DataView(new ArrayBuffer(22));
  end.setUint32(0, 0x06054b50, true);
  end.setUint16(8, files.length, true);
  end.setUint16(10, files.length, true);
  end.setUint32(12, size, true);
  end.setUint32(16, offset, true);
  return new Blob([...parts, ...central, end.buffer], { type: "application/zip" });
}

function allFiles() {
  return runs.flatMap((entry) => entry.files.filter((f) => f.kind !== "person_mask").map((f) => ({
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
  for (const role of ["person", "garment"]) {
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
  $("run").addEventListener("click", run);
  $("mask-rerun").addEventListener("click", run);
  $("cancel").addEventListener("click", cancelRun);
  $("mask-reset").addEventListener("click", clearMask);
  $("download-all").addEventListener("click", downloadAll);
  const canvas = $("mask-canvas");
  canvas.addEventListener("pointerdown", (e) => { editor.drawing = true; canvas.setPointerCapture(e.pointerId); paint(e); });
  canvas.addEventListener("pointermove", (e) => { if (editor.drawing) paint(e); });
  canvas.addEventListener("pointerup", () => { editor.drawing = false; });
  window.addEventListener("pagehide", cancelRun);  // a page closed mid-run frees the device
}

wire();
loadOptions().catch((error) => showError(`could not load the page's options: ${error.message}`));
refreshHealth();
