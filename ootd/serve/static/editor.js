// The mask editor: one red layer per garment (opaque = repaint), each at the person photo's own size, the chosen
// one drawn over the photo; painted, erased, or read from a mask image; sent as black-and-white PNGs, the API's
// `mask` (the garment's) and `mask2` (the second garment's). It knows nothing of runs: the page (app.js) tells it
// the photo, which garment's mask to show, and hears each change through `editor.onChange`.
"use strict";

const MASK_ROLES = ["garment", "garment2"];

const editor = {
  person: null,          // the person photo (an Image) the layers belong to
  active: "garment",     // whose layer is shown and painted
  drawing: false,
  layers: Object.fromEntries(MASK_ROLES.map((role) => [role, document.createElement("canvas")])),
  painted: Object.fromEntries(MASK_ROLES.map((role) => [role, false])),
  onChange: () => {},
};

function editorCanvas() {
  return document.getElementById("mask-canvas");
}

// A new photo: every layer empty, at its size (a mask belongs to its photo).
function startEditor(personImage) {
  const canvas = editorCanvas();
  editor.person = personImage;
  canvas.width = personImage.naturalWidth;
  canvas.height = personImage.naturalHeight;
  for (const role of MASK_ROLES) {
    editor.layers[role].width = canvas.width;
    editor.layers[role].height = canvas.height;
    clearLayer(role, false);
  }
  redraw();
  editor.onChange();
}

function clearLayer(role, tell = true) {
  const layer = editor.layers[role];
  layer.getContext("2d").clearRect(0, 0, layer.width, layer.height);
  editor.painted[role] = false;
  if (tell) { redraw(); editor.onChange(); }
}

function showLayer(role) {
  editor.active = role;
  redraw();
  editor.onChange();
}

// A mask image (white = repaint) into a layer, stretched to the photo (it has the photo's shape).
function maskIntoLayer(img, role) {
  const ctx = editor.layers[role].getContext("2d");
  const { width, height } = editor.layers[role];
  ctx.clearRect(0, 0, width, height);
  ctx.drawImage(img, 0, 0, width, height);
  const pixels = ctx.getImageData(0, 0, width, height);
  for (let i = 0; i < pixels.data.length; i += 4) {
    const d = pixels.data;
    const on = (d[i] * 0.299 + d[i + 1] * 0.587 + d[i + 2] * 0.114) >= 127 && d[i + 3] >= 127;
    d.set(on ? [230, 40, 40, 255] : [0, 0, 0, 0], i);
  }
  ctx.putImageData(pixels, 0, 0);
  editor.painted[role] = true;
  redraw();
  editor.onChange();
}

function maskIsEmpty(role) {
  if (!editor.painted[role]) return true;
  const layer = editor.layers[role];
  const { data } = layer.getContext("2d").getImageData(0, 0, layer.width, layer.height);
  for (let i = 3; i < data.length; i += 4) if (data[i] >= 127) return false;
  return true;
}

function redraw() {
  const canvas = editorCanvas();
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  if (editor.person) ctx.drawImage(editor.person, 0, 0);
  ctx.globalAlpha = 0.5;
  ctx.drawImage(editor.layers[editor.active], 0, 0);
  ctx.globalAlpha = 1;
}

function paint(event) {
  const canvas = editorCanvas();
  const box = canvas.getBoundingClientRect();
  const x = (event.clientX - box.left) * canvas.width / box.width;
  const y = (event.clientY - box.top) * canvas.height / box.height;
  const radius = Number(document.getElementById("brush").value) * canvas.width / Math.max(box.width, 1) / 2;
  const ctx = editor.layers[editor.active].getContext("2d");
  const erase = document.querySelector('input[name="tool"]:checked').value === "erase";
  ctx.globalCompositeOperation = erase ? "destination-out" : "source-over";
  ctx.fillStyle = "rgb(230, 40, 40)";
  ctx.beginPath();
  ctx.arc(x, y, radius, 0, 2 * Math.PI);
  ctx.fill();
  ctx.globalCompositeOperation = "source-over";
  redraw();
  if (!editor.painted[editor.active]) { editor.painted[editor.active] = true; editor.onChange(); }
}

// A layer as a black-and-white PNG at the photo's size, what the API's `mask` and `mask2` fields take.
function maskBlob(role) {
  const layer = editor.layers[role];
  const out = document.createElement("canvas");
  out.width = layer.width;
  out.height = layer.height;
  const source = layer.getContext("2d").getImageData(0, 0, out.width, out.height);
  const ctx = out.getContext("2d");
  const pixels = ctx.createImageData(out.width, out.height);
  for (let i = 0; i < source.data.length; i += 4) {
    const value = source.data[i + 3] >= 127 ? 255 : 0;
    pixels.data.set([value, value, value, 255], i);
  }
  ctx.putImageData(pixels, 0, 0);
  return new Promise((resolve) => out.toBlob(resolve, "image/png"));
}

function wireEditor() {
  const canvas = editorCanvas();
  canvas.addEventListener("pointerdown", (e) => { editor.drawing = true; canvas.setPointerCapture(e.pointerId); paint(e); });
  canvas.addEventListener("pointermove", (e) => { if (editor.drawing) paint(e); });
  canvas.addEventListener("pointerup", () => { editor.drawing = false; });
}
