"""ComfyUI's own page, in a real headless Chromium, with ootd's example workflows: each UI-format workflow loads
with every node drawn as the node it is (no red "missing" boxes, no missing-nodes dialog) and queues exactly its
API-format twin. A screenshot of each graph is kept (in the test's folder, and in $OOTD_SCREENSHOTS when set:
docs/images/comfyui_*.png come from there)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from tests.helpers.comfyui import WORKFLOWS, Comfy, api_workflow
from tests.helpers.comfyui_page import (
    CHROMIUM,
    DRIVER,
    chromium,
    fit,
    load_workflow,
    open_page,
    queued_prompt,
    screenshot,
)

pytestmark = [pytest.mark.slow, pytest.mark.comfyui]
pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e .[serve-test])")

NAMES = ("tryon", "outfit", "mask_editing", "lora")


@pytest.fixture(scope="module")
def page(comfy: Comfy):  # noqa: ANN201
    if CHROMIUM is None or DRIVER is None:
        pytest.fail("Debian's chromium and chromium-driver are needed (scripts/install_browser.sh installs them)")
    with chromium() as driver:
        open_page(driver, comfy)
        yield driver


def as_queued(prompt: dict, comfy: Comfy) -> dict:
    """Each node's class and the inputs its definition declares (the page also sends its display widgets, such
    as Preview as Text's, which the server ignores)."""
    out = {}
    for key, node in prompt.items():
        spec = comfy.get(f"/object_info/{node['class_type']}")[node["class_type"]]["input"]
        declared = {*spec.get("required", {}), *spec.get("optional", {})}
        out[key] = {"class_type": node["class_type"],
                    "inputs": {k: v for k, v in node["inputs"].items() if k in declared}}
    return out


@pytest.mark.parametrize("name", NAMES)
def test_the_page_draws_each_example_with_ootds_nodes_and_queues_its_api_twin(page, comfy: Comfy,  # noqa: ANN001
                                                                           name: str, tmp_path: Path) -> None:
    workflow = json.loads((WORKFLOWS / f"{name}.json").read_text())
    graph = load_workflow(page, workflow)
    fit(page)
    for folder in (tmp_path, os.environ.get("OOTD_SCREENSHOTS")):
        if folder:
            screenshot(page, Path(folder) / f"comfyui_{name}.png")
    assert graph["unknown"] == [] and graph["errors"] == [] and not graph["missingDialog"], graph
    assert graph["alerts"] == [], graph["alerts"]
    assert "OotdTryOn" in graph["types"] and "OotdLoader" in graph["types"]
    assert as_queued(queued_prompt(page), comfy) == as_queued(api_workflow(name), comfy)


def test_a_node_the_page_does_not_know_is_reported(page, comfy: Comfy) -> None:  # noqa: ANN001
    """The control: the check above does see a missing node."""
    workflow = copy.deepcopy(json.loads((WORKFLOWS / "tryon.json").read_text()))
    next(n for n in workflow["nodes"] if n["type"] == "OotdTryOn")["type"] = "OotdNoSuchNode"
    graph = load_workflow(page, workflow)
    assert "OotdNoSuchNode" in graph["unknown"] or graph["missingDialog"], graph
    page.refresh()  # no dialog left for the next test
    open_page(page, comfy)
