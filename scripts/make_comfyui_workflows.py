"""Write the UI format of ootd's example ComfyUI workflows (ootd/comfyui/example_workflows/NAME.json, what a user
opens or picks among ComfyUI's templates) from their API format (example_workflows/api/NAME.json, the source of
truth, what a script posts), by ComfyUI's own page: each API workflow is loaded into the graph as ComfyUI loads
one, its seed fixed, its nodes laid out in columns, and the graph saved as the page saves it.

Needs a running ComfyUI with ootd's nodes installed (`ootd comfyui install`) and Debian's chromium +
chromium-driver with selenium (`pip install -e .[serve-test]`):

    python main.py --cpu --listen 127.0.0.1 --port 8188     # in the ComfyUI folder
    python scripts/make_comfyui_workflows.py --url http://127.0.0.1:8188

tests/frontends/comfyui/test_page.py loads each UI workflow into the page and checks that it queues exactly its
API workflow, so the two formats cannot drift apart.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.comfyui_page import chromium, lay_out, load_api_workflow, open_page  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "ootd" / "comfyui" / "example_workflows"
FIX_SEEDS = """
for (const n of app.graph.nodes) {
  const control = (n.widgets || []).find((w) => w.name === 'control_after_generate');
  if (control) control.value = 'fixed';
}
"""
SAVE = """
const graph = app.graph.serialize();
graph.extra = {...(graph.extra || {}), ds: {scale: app.canvas.ds.scale, offset: [...app.canvas.ds.offset]}};
return JSON.parse(JSON.stringify(graph));  // as a saved file has it: no undefined fields (WebDriver makes them null)
"""


class Page:
    """What open_page needs of a ComfyUI: its address and the settings call."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def post_json(self, path: str, body: object) -> None:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=30).close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="a running ComfyUI with ootd's nodes")
    args = parser.parse_args()
    page = Page(args.url)
    with chromium() as driver:
        for source in sorted((EXAMPLES / "api").glob("*.json")):
            open_page(driver, page)
            load_api_workflow(driver, json.loads(source.read_text()), source.stem)
            driver.execute_script(FIX_SEEDS)
            lay_out(driver)
            graph = driver.execute_script(SAVE)
            target = EXAMPLES / source.name
            target.write_text(json.dumps(graph, indent=1) + "\n")
            print(f"{target}: {len(graph['nodes'])} nodes, {len(graph['links'])} links")


if __name__ == "__main__":
    main()
