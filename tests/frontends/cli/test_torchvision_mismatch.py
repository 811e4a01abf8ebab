"""A torchvision that does not fit the installed torch (PyPI's beside a CPU build: `operator torchvision::nms does
not exist` at import) breaks every model, because transformers imports it with CLIP: each command says so in one
line naming both versions and the fix, never an internal error; `ootd eval` still computes SSIM; the doctor
lists it. The broken torchvision is a stand-in package of the test's own, failing as the real one does."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ootd.hardware import torch_builds
from tests.helpers.cli import assert_one_line_error, invoke
from tests.helpers.evaluation import blurred, write_photos

RUN = ["--steps", "1", "--resolution", "384x512"]


@pytest.fixture
def broken_torchvision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """torchvision 0.29.1 installed where this torch cannot load its operators; yields the fix's pin."""
    from importlib.metadata import version

    site = tmp_path / "site"
    (site / "torchvision").mkdir(parents=True)
    (site / "torchvision" / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n')
    (site / "torchvision-0.29.1.dist-info").mkdir()
    (site / "torchvision-0.29.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.29.1\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    torch_builds.torchvision_mismatch.cache_clear()
    torch = version("torch")  # as pip sees it
    label = f"+{torch.split('+')[1]}" if "+" in torch else ""
    yield f"torchvision=={torch_builds.torchvision_for(torch)}{label}"
    torch_builds.torchvision_mismatch.cache_clear()


def mismatch_line(result, pin: str) -> None:  # noqa: ANN001
    assert_one_line_error(result, 3, "torchvision 0.29.1 does not fit torch ", "operator torchvision::nms", pin,
                          "python -m pip uninstall torchvision")


def test_run_with_auto_category_and_without(broken_torchvision: str, tiny_tree: Path, example_images,  # noqa: ANN001
                                            tmp_path: Path) -> None:
    for category in ("auto", "upper"):
        result = invoke("run", "--model", example_images["person"], "--cloth", example_images["tshirt"],
                        "--category", category, "--mask", example_images["mask"], "--checkpoints", tiny_tree,
                        "-o", tmp_path / category, *RUN)
        mismatch_line(result, broken_torchvision)
        assert not (tmp_path / category).exists() or not any((tmp_path / category).iterdir())


def test_classify_mask_and_batch(broken_torchvision: str, tiny_tree: Path, example_images,  # noqa: ANN001
                                 tmp_path: Path) -> None:
    mismatch_line(invoke("classify", example_images["tshirt"].parent, "--checkpoints", tiny_tree), broken_torchvision)
    mismatch_line(invoke("mask", "--model", example_images["person"], "--category", "upper", "--checkpoints",
                         tiny_tree, "-o", tmp_path / "masks"), broken_torchvision)
    people = tmp_path / "people"
    people.mkdir()
    (people / "p.png").write_bytes(example_images["person"].read_bytes())
    result = invoke("batch", "--models", people, "--cloths", example_images["tshirt"].parent, "-k", "upper",
                    "--checkpoints", tiny_tree, "-o", tmp_path / "out", *RUN)
    mismatch_line(result, broken_torchvision)


def test_eval_computes_ssim_and_names_the_mismatch(broken_torchvision: str, tmp_path: Path) -> None:
    photos = write_photos(tmp_path / "photos", ["a.png", "b.png"])
    results = tmp_path / "results"
    results.mkdir()
    for name, image in photos.items():
        blurred(image, 2).save(results / name)
    result = invoke("eval", results, "--truth", tmp_path / "photos", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ssim"] > 0 and data["lpips"] is None
    assert data["not_computed"].startswith("torchvision 0.29.1 does not fit torch ") and broken_torchvision in \
        data["not_computed"]


def test_the_doctor_lists_it_as_blocking(broken_torchvision: str, tmp_path: Path) -> None:
    result = invoke("doctor", "--checkpoints", tmp_path, "--quick", "--no-kernels", "--json")
    (item,) = [i for i in json.loads(result.stdout)["items"] if i["item"] == "torchvision"]
    assert item["status"] == "fail" and item["blocking"] and broken_torchvision in item["fix"]


def test_an_unforeseen_failure_beside_it_is_the_mismatch_line(broken_torchvision: str,
                                                               capsys: pytest.CaptureFixture) -> None:
    """Where a model is loaded by a path no check covers, transformers' own error ("Could not import module
    'CLIPTextModel'") is replaced by the line that names the cause."""
    from ootd.app.console import run_guarded

    def load() -> None:
        raise ModuleNotFoundError("Could not import module 'CLIPTextModel'. Are this object's requirements defined "
                                  "correctly?")

    assert run_guarded(load) == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: torchvision 0.29.1 does not fit torch") and "internal error" not in line
