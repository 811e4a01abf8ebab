// The try-on page: pick inputs, submit a job, follow its progress, show results, edit the mask and rerun.
"use strict";

const $ = (id) => document.getElementById(id);
const chosen = { person: null, garment: null };  // Blob/File per role
let options = null;       // GET api/options
let editedMask = null;    // Blob: the painted mask, sent with the next run
let lastJob = null;       // the latest finished job's JSON (for the editor's automatic mask)
let personURL = null;

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
  return `request failed: HTTP ${response.status}`;
}

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
  $("model-type").textContent = model ? `model: ${model}` : "this category needs the dc model (the server runs hd only)";
}

async function loadOptions() {
  const response = await fetch("api/options");
  options = await response.json();
  fillSelect($("category"), options.categories, options.categories[0]);
  fillSelect($("resolution"), options.resolutions, options.defaults.resolution);
  fillSelect($("scheduler"), options.schedulers, options.defaults.scheduler);
  fillSelect($("fit"), options.fits, options.defaults.fit);
  $("samples").value = options.defaults.samples;
  $("steps").value = options.defaults.steps;
  $("scale").value = options.defaults.scale;
  showModelType();
}

async function refreshHealth() {
  try {
    const health = await (await fetch("api/health")).json();
    const loaded = health.models_loaded.length ? health.models_loaded.join(", ") : "none yet";
    $("server-status").textContent =
      `${health.device} · ${health.precision} · attention ${health.attention} · models loaded: ${loaded}`;
  } catch (_) {
    $("server-status").textContent = "server not answering";
  }
}

function choose(role, blob) {
  chosen[role] = blob;
  const preview = $(`${role}-preview`);
  preview.onerror = () => { preview.hidden = true; };
  preview.src = URL.createObjectURL(blob);
  preview.hidden = false;
  if (role === "person") {
    personURL = preview.src;
    editedMask = null;
    $("mask-note").hidden = true;
    $("editor").hidden = true;
  }
  showError("");
}

async function useExample(button) {
  const response = await fetch(`static/examples/${button.dataset.example}.png`);
  const blob = await response.blob();
  choose(button.dataset.for, new File([blob], `${button.dataset.example}.png`, { type: "image/png" }));
  if (button.dataset.category) { $("category").value = button.dataset.category; showModelType(); }
}

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

function setBusy(busy) {
  $("run").disabled = busy;
  $("mask-rerun").disabled = busy;
  $("progress").hidden = !busy;
}

function describeProgress(job) {
  if (job.state === "queued") {
    const ahead = job.position - 1;
    return [0, ahead > 0 ? `waiting: ${ahead} request(s) ahead` : "starting..."];
  }
  const labels = { load: "loading the model", person: "preparing the person", garment: "preparing the garment",
                   denoise: "denoising", decode: "decoding" };
  if (job.stage && job.total) return [job.done / job.total, `${labels[job.stage] || job.stage} ${job.done}/${job.total}`];
  return [0, job.stage ? (labels[job.stage] || job.stage) : "preparing inputs..."];
}

async function run(mask) {
  if (!chosen.person || !chosen.garment) { showError("choose a person photo and a garment photo first"); return; }
  showError("");
  setBusy(true);
  $("progress-bar").value = 0;
  $("progress-text").textContent = "uploading...";
  try {
    const response = await fetch("api/jobs", { method: "POST", body: formData(mask) });
    if (!response.ok) { showError(await readError(response)); return; }
    const { id } = await response.json();
    for (;;) {
      const poll = await fetch(`api/jobs/${id}`);
      if (!poll.ok) { showError(await readError(poll)); return; }
      const job = await poll.json();
      if (job.state === "done") { showResult(job); return; }
      if (job.state === "failed") { showError(job.error); return; }
      const [fraction, text] = describeProgress(job);
      $("progress-bar").value = fraction;
      $("progress-text").textContent = text;
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  } catch (error) {
    showError(`the server did not answer (${error.message})`);
  } finally {
    setBusy(false);
    refreshHealth();
  }
}

function showResult(job) {
  lastJob = job;
  const gallery = $("gallery");
  gallery.innerHTML = "";
  job.images.forEach((url, i) => {
    const figure = document.createElement("figure");
    const img = document.createElement("img");
    img.src = url;
    img.alt = `result ${i}`;
    img.className = "result";
    const link = document.createElement("a");
    link.href = url;
    link.download = job.names[i];
    link.textContent = `download ${job.names[i]}`;
    const caption = document.createElement("figcaption");
    caption.appendChild(link);
    figure.append(img, caption);
    gallery.appendChild(figure);
  });
  $("seed-used").textContent = `seed ${job.seed} · model ${job.settings.model_type} · ${job.timings.run.toFixed(1)} s`;
  $("seed").placeholder = `random (last: ${job.seed})`;
  $("mask-preview").src = job.mask;
  $("masked-preview").src = job.masked_person;
  $("mask-row").hidden = false;
  if (!editedMask) startEditor(job.person_mask);
}

// ---- mask editor: the mask is kept as a red layer with alpha (opaque = repaint) at the photo's own size

const editor = { mask: document.createElement("canvas"), person: new Image(), drawing: false };

function loadImage(url) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = reject;
    img.src = url;
  });
}

async function startEditor(maskURL) {
  const [person, mask] = await Promise.all([loadImage(personURL), loadImage(maskURL)]);
  const canvas = $("mask-canvas");
  canvas.width = editor.mask.width = person.naturalWidth;
  canvas.height = editor.mask.height = person.naturalHeight;
  editor.person = person;
  const ctx = editor.mask.getContext("2d");
  ctx.drawImage(mask, 0, 0, canvas.width, canvas.height);
  const pixels = ctx.getImageData(0, 0, canvas.width, canvas.height);
  for (let i = 0; i < pixels.data.length; i += 4) {
    const on = pixels.data[i] >= 127;
    pixels.data.set(on ? [230, 40, 40, 255] : [0, 0, 0, 0], i);
  }
  ctx.putImageData(pixels, 0, 0);
  $("editor").hidden = false;
  redraw();
}

function redraw() {
  const canvas = $("mask-canvas");
  const ctx = canvas.getContext("2d");
  ctx.globalAlpha = 1;
  ctx.drawImage(editor.person, 0, 0);
  ctx.globalAlpha = 0.5;
  ctx.drawImage(editor.mask, 0, 0);
  ctx.globalAlpha = 1;
}

function paint(event) {
  const canvas = $("mask-canvas");
  const box = canvas.getBoundingClientRect();
  const x = (event.clientX - box.left) * canvas.width / box.width;
  const y = (event.clientY - box.top) * canvas.height / box.height;
  const radius = Number($("brush").value) * canvas.width / Math.max(box.width, 1) / 2;
  const ctx = editor.mask.getContext("2d");
  const erase = document.querySelector('input[name="tool"]:checked').value === "erase";
  ctx.globalCompositeOperation = erase ? "destination-out" : "source-over";
  ctx.fillStyle = "rgb(230, 40, 40)";
  ctx.beginPath();
  ctx.arc(x, y, radius, 0, 2 * Math.PI);
  ctx.fill();
  ctx.globalCompositeOperation = "source-over";
  redraw();
}

function maskBlob() {
  const out = document.createElement("canvas");
  out.width = editor.mask.width;
  out.height = editor.mask.height;
  const source = editor.mask.getContext("2d").getImageData(0, 0, out.width, out.height);
  const ctx = out.getContext("2d");
  const pixels = ctx.createImageData(out.width, out.height);
  for (let i = 0; i < source.data.length; i += 4) {
    const value = source.data[i + 3] >= 127 ? 255 : 0;
    pixels.data.set([value, value, value, 255], i);
  }
  ctx.putImageData(pixels, 0, 0);
  return new Promise((resolve) => out.toBlob(resolve, "image/png"));
}

function wire() {
  for (const role of ["person", "garment"]) {
    $(`${role}-file`).addEventListener("change", (event) => {
      const file = event.target.files[0];
      if (file) choose(role, file);
    });
  }
  document.querySelectorAll("[data-example]").forEach((b) => b.addEventListener("click", () => useExample(b)));
  $("category").addEventListener("change", showModelType);
  $("run").addEventListener("click", () => run(editedMask));
  $("mask-rerun").addEventListener("click", async () => {
    editedMask = await maskBlob();
    $("mask-note").hidden = false;
    run(editedMask);
  });
  $("mask-reset").addEventListener("click", () => {
    editedMask = null;
    $("mask-note").hidden = true;
    if (lastJob) startEditor(lastJob.person_mask);
  });
  const canvas = $("mask-canvas");
  canvas.addEventListener("pointerdown", (e) => { editor.drawing = true; canvas.setPointerCapture(e.pointerId); paint(e); });
  canvas.addEventListener("pointermove", (e) => { if (editor.drawing) paint(e); });
  canvas.addEventListener("pointerup", () => { editor.drawing = false; });
}

wire();
loadOptions().catch((error) => showError(`could not load the page's options: ${error.message}`));
refreshHealth();
