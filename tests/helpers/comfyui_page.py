"""ComfyUI's own page in a real headless Chromium (Debian's chromium + chromium-driver, driven by Selenium): open
it on a running ComfyUI (tests/helpers/comfyui.py), load a workflow into its graph, read the graph back (which
node types the page knows, the API-format prompt it would queue), lay a graph out in columns, take screenshots."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
# the flags that work on a machine with no network: no background connections, no first-run work
FLAGS = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--hide-scrollbars",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
         "--window-size=1600,1000")

READY = """return !!(window.app && window.app.graph && window.LiteGraph
                     && window.LiteGraph.registered_node_types['OotdTryOn'])"""
# what the page made of the loaded graph: every node's type, the ones it has no definition for (drawn as red
# "missing" boxes), the ones it marks as errors, the missing-nodes dialog if it opened, and its alerts (a file
# that does not match its workflow schema raises one)
GRAPH = """
const nodes = app.graph.nodes;
return {types: nodes.map((n) => n.type),
        unknown: nodes.filter((n) => !LiteGraph.registered_node_types[n.type]).map((n) => n.type),
        errors: nodes.filter((n) => n.has_errors).map((n) => n.type),
        missingDialog: [...document.querySelectorAll('.p-dialog')].some((d) => /missing/i.test(d.textContent)),
        alerts: [...document.querySelectorAll('.p-toast-message')].map((t) => t.textContent.slice(0, 300))};
"""
# columns by the longest path from a node without inputs; each column as wide as its widest node
LAYOUT = """
const nodes = app.graph.nodes, gap = 40, depth = new Map();
const inputsOf = (n) => (n.inputs || []).filter((i) => i.link != null).map((i) => app.graph.links[i.link].origin_id);
const level = (n) => {
  if (depth.has(n.id)) return depth.get(n.id);
  depth.set(n.id, 0);
  const d = Math.max(-1, ...inputsOf(n).map((id) => level(app.graph.getNodeById(id)))) + 1;
  depth.set(n.id, d);
  return d;
};
nodes.forEach(level);
for (const n of nodes) {
  const needed = n.computeSize();
  n.size = [Math.max(n.size[0], needed[0], 300), Math.max(n.size[1], needed[1])];
  if (n.type === 'LoadImage' || n.type === 'LoadImageMask') n.size[1] = Math.max(n.size[1], 360);
  if (n.type === 'PreviewImage' || n.type === 'PreviewAny') n.size = [Math.max(n.size[0], 320), 300];
}
let x = 20;
const columns = Math.max(...depth.values()) + 1;
for (let c = 0; c < columns; c++) {
  const column = nodes.filter((n) => depth.get(n.id) === c).sort((a, b) => a.id - b.id);
  let y = 40;
  for (const n of column) { n.pos = [x, y]; y += n.size[1] + gap + 30; }
  x += Math.max(...column.map((n) => n.size[0])) + gap;
}
"""
# the whole graph in view, clear of the page's side bar (left) and tool bars (top)
FIT = """
const nodes = app.graph.nodes, left = 80, top = 110, margin = 20;
const x0 = Math.min(...nodes.map((n) => n.pos[0])), y0 = Math.min(...nodes.map((n) => n.pos[1] - 30));
const x1 = Math.max(...nodes.map((n) => n.pos[0] + n.size[0]));
const y1 = Math.max(...nodes.map((n) => n.pos[1] + n.size[1]));
const width = app.canvas.canvas.width / devicePixelRatio, height = app.canvas.canvas.height / devicePixelRatio;
const scale = Math.min(1, (width - left - margin) / (x1 - x0), (height - top - margin) / (y1 - y0));
app.canvas.ds.scale = scale;
app.canvas.ds.offset = [left / scale - x0, top / scale - y0];
app.graph.setDirtyCanvas(true, true);
"""


@contextmanager
def chromium() -> Iterator[Any]:
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    driver.set_page_load_timeout(120)
    driver.set_script_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()


def open_page(driver: Any, comfy: Any, timeout: float = 120) -> None:
    """ComfyUI's page, once it knows ootd's nodes; the first-run template browser is declared seen."""
    comfy.post_json("/settings/Comfy.TutorialCompleted", True)
    comfy.post_json("/settings/Comfy.Minimap.Visible", False)
    driver.get(comfy.url + "/")
    deadline = time.monotonic() + timeout
    while not driver.execute_script(READY):
        assert time.monotonic() < deadline, "ComfyUI's page did not load ootd's nodes"
        time.sleep(0.25)


def load_workflow(driver: Any, workflow: dict[str, Any]) -> dict[str, Any]:
    """A UI-format workflow into the page's graph, as opening the file does; what the page made of it."""
    driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                "app.loadGraphData(arguments[0]).then(() => done(true));", workflow)
    time.sleep(1.5)  # the image previews and the canvas
    return driver.execute_script(GRAPH)


def load_api_workflow(driver: Any, prompt: dict[str, Any], name: str) -> None:
    driver.execute_script("app.loadApiJson(arguments[0], arguments[1])", prompt, name)
    time.sleep(1.5)


def queued_prompt(driver: Any) -> dict[str, Any]:
    """The API-format prompt the page would queue for its graph."""
    return driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                       "app.graphToPrompt().then((p) => done(p.output));")


def lay_out(driver: Any) -> None:
    driver.execute_script(LAYOUT)
    driver.execute_script(FIT)
    time.sleep(0.5)


def fit(driver: Any) -> None:
    """The whole graph in view (for a screenshot)."""
    driver.execute_script(FIT)
    time.sleep(0.5)


def screenshot(driver: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(driver.get_screenshot_as_png())
    return path
