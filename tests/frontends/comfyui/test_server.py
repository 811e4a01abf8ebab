"""ootd's nodes in a real ComfyUI (v0.8.0, headless, CPU), through its HTTP API, on the tiny checkpoints: the nodes
as /object_info lists them, every example workflow to the end, the pictures equal to `ootd run`'s in the same
Python (one garment, an outfit, an adapter at scale 0), Cancel within a step or two with nothing written, bad
inputs as one-line node errors, and the models loaded once for two prompts (the second faster, measured)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.helpers import EXAMPLES, REPO
from tests.helpers.comfyui import Comfy, Finished, api_workflow, for_tests, node_of

pytestmark = [pytest.mark.slow, pytest.mark.comfyui]

NODES = ("OotdLoader", "OotdTryOn", "OotdMask", "OotdClassify")
WORKFLOWS = ("tryon", "outfit", "mask_editing", "lora")


def pictures(comfy: Comfy, done: Finished, node: str) -> list[np.ndarray]:
    files = [comfy.output / image["subfolder"] / image["filename"] for image in done.images(node)]
    return [np.asarray(Image.open(path).convert("RGB")).astype(int) for path in files]


def failure(done: Finished) -> str:
    error = done.message("execution_error") or {}
    return f"{error.get('node_type')}: {error.get('exception_message')}"


def masked_tryon(**settings: Any) -> dict[str, Any]:
    """The adapter example without its adapter: person, garment and mask from files, as `ootd run` gets them."""
    prompt = for_tests(api_workflow("lora"), **{"seed": 7, **settings})
    node_of(prompt, "OotdLoader").update(lora="none", lora_scale=1.0)
    return prompt


def ootd_run(tmp: Path, tiny_tree: Path, threads: int, *args: str) -> list[np.ndarray]:
    """`ootd run` in this Python (the one running ComfyUI), its PNGs in order."""
    out = tmp / "ootd-run"
    command = [sys.executable, "-m", "ootd", "run", "--person", str(EXAMPLES / "person.png"),
               "--checkpoints", str(tiny_tree), "--resolution", "384x512", "--steps", "2", "--seed", "7",
               "--precision", "fp32", "--device", "cpu", "--threads", str(threads), "-o", str(out), "-q", *args]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OOTD_CPU_BF16": "0"})
    assert done.returncode == 0, done.stderr
    paths = sorted(p for p in out.glob("*.png") if re.search(r"__\d+\.png$", p.name))
    return [np.asarray(Image.open(path).convert("RGB")).astype(int) for path in paths]


def threads_of(done: Finished) -> int:
    return int(re.search(r"(\d+) CPU threads", done.text("6"))[1])


def test_object_info_lists_the_nodes_with_their_documented_inputs(comfy: Comfy) -> None:
    from ootd.serve.forms import FILES, TEXT_FIELDS

    documented = documented_inputs(REPO / "docs" / "comfyui.md")
    for name in NODES:
        info = comfy.get(f"/object_info/{name}")[name]
        assert info["category"] == "ootd" and info["description"], name
        inputs = {**info["input"]["required"], **info["input"].get("optional", {})}
        assert set(inputs) == documented[name], (name, set(inputs) ^ documented[name])
        assert all(spec[1].get("tooltip") for spec in inputs.values()), name
    tryon = comfy.get("/object_info/OotdTryOn")["OotdTryOn"]["input"]
    # the API's form fields, less `preservation`: a report on the pictures in the API's answer, which the node's
    # outputs (images) have no place for
    assert set(FILES) | set(TEXT_FIELDS) - {"preservation"} <= {*tryon["required"], *tryon["optional"]}
    assert set(tryon["optional"]) == {"mask", "garment2", "category2", "mask2"}
    assert set(comfy.get("/workflow_templates")["ootd"]) == set(WORKFLOWS)


def documented_inputs(doc: Path) -> dict[str, set[str]]:
    """Each node's inputs as docs/comfyui.md's tables list them (`### ootd Try-On (OotdTryOn)` then rows)."""
    found: dict[str, set[str]] = {}
    node = None
    for line in doc.read_text().splitlines():
        if line.startswith("#"):
            heading = re.match(r"#+ .*\((Ootd\w+)\)", line)
            node = heading[1] if heading else None
            if node:
                found[node] = set()
        elif node and (row := re.match(r"\| `(\w+)` \|", line)):
            found[node].add(row[1])
    return found


@pytest.mark.parametrize("name", WORKFLOWS)
def test_each_example_workflow_runs_to_the_end(comfy: Comfy, name: str) -> None:
    before = set(comfy.output.rglob("*.png"))
    done = comfy.run(for_tests(api_workflow(name)))
    assert done.status == "success", failure(done)
    assert len(set(comfy.output.rglob("*.png")) - before) >= 1
    assert done.text("6").startswith("ootd try-on: ") and "ran on cpu, fp32" in done.text("6")  # ComfyUI's --cpu


@pytest.mark.parametrize(("settings", "flags"), [
    ({"samples": 2}, ["--samples", "2"]),
    ({"keep_unmasked": True, "feather": 6}, ["--keep-unmasked", "--feather", "6"]),  # the photo, its own size
], ids=["two samples", "keep unmasked"])
def test_the_pictures_equal_ootd_runs(comfy: Comfy, tiny_tree: Path, tmp_path: Path, settings: dict,
                                      flags: list[str]) -> None:
    done = comfy.run(masked_tryon(**settings))
    assert done.status == "success", failure(done)
    ours = pictures(comfy, done, "5")
    theirs = ootd_run(tmp_path, tiny_tree, threads_of(done), "--cloth", str(EXAMPLES / "tshirt.png"),
                      "--category", "upper", "--mask", str(EXAMPLES / "person_mask_upper.png"), *flags)
    assert len(ours) == len(theirs) == settings.get("samples", 1)
    for a, b in zip(ours, theirs, strict=True):
        assert a.shape == b.shape and np.abs(a - b).max() <= 1
    if len(ours) == 2:
        assert np.abs(ours[0] - ours[1]).max() > 0  # two samples, two noises
    else:
        assert ours[0].shape[:2] == Image.open(EXAMPLES / "person.png").size[::-1]  # the photo's own size


def test_an_outfit_equals_ootd_runs(comfy: Comfy, tiny_tree: Path, tmp_path: Path) -> None:
    prompt = masked_tryon(garment2=["8", 0], category2="lower", mask2=["9", 0])
    prompt["8"] = {"class_type": "LoadImage", "inputs": {"image": "ootd_trousers.png"}}
    prompt["9"] = {"class_type": "LoadImageMask", "inputs": {"image": "ootd_person_mask_lower.png", "channel": "red"}}
    done = comfy.run(prompt)
    assert done.status == "success", failure(done)
    assert "dc+hd" in done.text("6")
    (ours,) = pictures(comfy, done, "5")
    (theirs,) = ootd_run(tmp_path, tiny_tree, threads_of(done), "--cloth", str(EXAMPLES / "tshirt.png"),
                         "--cloth", str(EXAMPLES / "trousers.png"), "--category", "upper", "--category", "lower",
                         "--mask", str(EXAMPLES / "person_mask_upper.png"),
                         "--mask", str(EXAMPLES / "person_mask_lower.png"))
    assert ours.shape == theirs.shape and np.abs(ours - theirs).max() <= 1


def test_an_adapter_at_scale_zero_gives_the_base_picture(comfy: Comfy) -> None:
    base = comfy.run(masked_tryon())
    runs = {}
    for scale in (0.0, 1.0):
        prompt = for_tests(api_workflow("lora"), seed=7)
        node_of(prompt, "OotdLoader")["lora_scale"] = scale
        runs[scale] = comfy.run(prompt)
        assert runs[scale].status == "success", failure(runs[scale])
    (plain,), (zero,), (one,) = (pictures(comfy, done, "5") for done in (base, runs[0.0], runs[1.0]))
    assert np.abs(zero - plain).max() == 0
    assert np.abs(one - plain).max() > 8  # the adapter does change the pictures at scale 1


def test_cancel_stops_the_denoising_within_two_steps_and_writes_nothing(comfy: Comfy) -> None:
    comfy.run(masked_tryon())  # the model loaded: the long run below is all steps
    before = set(comfy.output.rglob("*"))
    prompt_id = comfy.submit(masked_tryon(steps=400, seed=99))
    node = "4"

    def steps_done() -> int:
        values = [data["value"] for _, kind, data in list(comfy.events)
                  if kind == "progress" and data.get("prompt_id") == prompt_id and data.get("node") == node]
        return max(values, default=0)

    deadline = time.monotonic() + 300
    while steps_done() < 3:
        assert time.monotonic() < deadline, "the denoising did not start"
        time.sleep(0.05)
    at_cancel = steps_done()
    status, _ = comfy.post_json("/interrupt", {})
    assert status == 200
    done = comfy.wait(prompt_id)
    assert done.status == "error" and done.message("execution_interrupted") is not None
    assert steps_done() - at_cancel <= 2, (at_cancel, steps_done())
    assert steps_done() < 400
    assert set(comfy.output.rglob("*")) == before  # no picture written
    assert comfy.run(masked_tryon()).status == "success"  # and the next prompt runs


BAD = {
    "hd with a dress": ({"OotdLoader": {"model_type": "hd"}, "OotdTryOn": {"category": "dress"}},
                        "the hd model only does upper-body garments; use input model_type dc for category dress"),
    "an empty image": ({"EmptyImage": {"width": 1, "height": 1, "batch_size": 1, "color": 0}},
                       "person image: image too small: 1x1 (each side must be at least 64 px)"),
    "a missing checkpoints folder": ({"OotdLoader": {"checkpoints_path": "/nonexistent/ootd-checkpoints"}},
                                     "checkpoints folder /nonexistent/ootd-checkpoints does not exist"),
    "a garment auto cannot tell": ({"OotdTryOn": {"category": "auto"}},  # the tiny CLIP: every category ~1/3
                                   "cannot tell the category of garment"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_input_is_a_one_line_node_error_and_the_next_prompt_runs(comfy: Comfy, case: str) -> None:
    changes, words = BAD[case]
    prompt = masked_tryon()
    if "EmptyImage" in changes:
        prompt["10"] = {"class_type": "EmptyImage", "inputs": changes.pop("EmptyImage")}
        node_of(prompt, "OotdTryOn")["person"] = ["10", 0]
    for class_type, inputs in changes.items():
        node_of(prompt, class_type).update(inputs)
    done = comfy.run(prompt)
    error = done.message("execution_error")
    assert done.status == "error" and error is not None
    message = error["exception_message"].strip()
    assert words in message and "\n" not in message and "Traceback" not in message, message
    assert error["exception_type"].startswith("ootd.errors."), error["exception_type"]
    assert comfy.run(masked_tryon()).status == "success"


def load_seconds(report: str) -> float:
    """The `load` of a performance text's time line (`load 1.27 s` or `load 0 ms`)."""
    found = re.search(r"\bload ([\d.]+) (m?s)\b", report)
    assert found, report
    return float(found[1]) / (1000 if found[2] == "ms" else 1)


def free_models(comfy: Comfy) -> None:
    """ComfyUI's "unload models" (`POST /free`): its prompt worker acts on it once the next prompt is done, so a
    prompt that does nothing new (every node cached) follows it."""
    released = comfy.log.read_text().count("ootd: hd released")
    status, _ = comfy.post_json("/free", {"unload_models": True})
    assert status == 200
    loader = node_of(masked_tryon(), "OotdLoader")
    done = comfy.run({"1": {"class_type": "OotdLoader", "inputs": loader},
                      "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}})
    assert done.status == "success"
    deadline = time.monotonic() + 60
    while comfy.log.read_text().count("ootd: hd released") == released:
        assert time.monotonic() < deadline, comfy.tail()
        time.sleep(0.2)


def test_two_prompts_load_the_models_once_and_the_second_gets_them_at_once(comfy: Comfy) -> None:
    """Also: ComfyUI's "unload models" releases ootd's models (the first prompt after it loads them again)."""
    comfy.run(masked_tryon(steps=1, seed=1))  # loaded by now, whatever ran before
    free_models(comfy)
    loads = comfy.log.read_text().count("ootd: hd loaded in")
    first = comfy.run(masked_tryon(steps=1, scale=0.0, seed=2))  # one step, no guidance: the load shows
    second = comfy.run(masked_tryon(steps=1, scale=0.0, seed=3))
    assert first.status == second.status == "success"
    assert "hd loaded for this prompt" in first.text("6")
    assert "none loaded (all kept from an earlier prompt)" in second.text("6")
    assert comfy.log.read_text().count("ootd: hd loaded in") == loads + 1  # once for the two prompts
    # the seconds each prompt spent getting its model, as the node measured them: the ratio a kept model makes
    # (the whole prompts are printed too: on the tiny checkpoints the load is about a second of a noisy whole)
    getting = [load_seconds(done.text("6")) for done in (first, second)]
    print(f"getting the model: {getting[0]:.4f} s in prompt 1, {getting[1]:.6f} s in prompt 2; whole prompts "
          f"{first.seconds:.2f} s and {second.seconds:.2f} s\n{first.text('6')}\n{second.text('6')}")
    assert getting[0] > 0.1 and getting[0] / max(getting[1], 1e-4) > 20, getting


def test_the_category_node_gives_autos_choice_or_refuses_in_one_line(comfy: Comfy) -> None:
    prompt = {"1": {"class_type": "LoadImage", "inputs": {"image": "ootd_tshirt.png"}},
              "2": {"class_type": "OotdLoader", "inputs": node_of(masked_tryon(), "OotdLoader")},
              "3": {"class_type": "OotdClassify",
                    "inputs": {"model": ["2", 0], "garment": ["1", 0], "category_margin": 0.0}},
              "4": {"class_type": "PreviewAny", "inputs": {"source": ["3", 1]}}}
    done = comfy.run(prompt)
    assert done.status == "success", failure(done)
    assert re.fullmatch(r"(upper|lower|dress) \(auto, p 0\.\d\d\): (\w+ 0\.\d\d, ){2}\w+ 0\.\d\d", done.text("4"))
    chosen = done.text("4").split(" ", 1)[0]
    tryon = masked_tryon(seed=5)  # the category output drives a try-on's category
    tryon["10"] = {"class_type": "OotdClassify",
                   "inputs": {"model": ["3", 0], "garment": ["2", 0], "category_margin": 0.0}}
    node_of(tryon, "OotdTryOn")["category"] = ["10", 0]
    linked = comfy.run(tryon)
    assert linked.status == "success", failure(linked)
    assert linked.text("6").startswith(f"ootd try-on: {'hd' if chosen == 'upper' else 'dc'},")
    prompt["3"]["inputs"]["category_margin"] = 0.2  # the tiny CLIP cannot tell: every category near 1/3
    refused = comfy.run(prompt).message("execution_error")
    assert refused["exception_message"].strip().startswith("cannot tell the category of garment")
    assert "give it with input category" in refused["exception_message"]
