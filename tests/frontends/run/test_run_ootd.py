"""run/run_ootd.py: the original script's flags and fixed output names, on ootd."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from ootd.settings import Category
from tests.helpers import REPO
from tests.helpers.synthetic import synthetic_preprocessor

SCRIPT = REPO / "run" / "run_ootd.py"


@pytest.fixture(scope="module")
def run_ootd():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("run_ootd", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_original_flags_end_to_end(models, run_ootd, pipe_hd, tiny_tree: Path, example_images: dict[str, Path],  # noqa: ANN001
                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Automatic mask (pose + parsing, as the original always does), fixed names, replaced with a notice."""
    monkeypatch.chdir(tmp_path)
    models.use(pipe_hd, preprocessor=synthetic_preprocessor())
    args = ["--model_path", str(example_images["person"]), "--cloth_path", str(example_images["tshirt"]),
            "--model_type", "hd", "--category", "0", "--scale", "2.0", "--step", "1", "--sample", "1",
            "--seed", "5", "--gpu_id", "0", "--checkpoints", str(tiny_tree), "--resolution", "384x512"]
    assert run_ootd.main(args) == 0
    out = capsys.readouterr()
    folder = tmp_path / "images_output"
    assert sorted(p.name for p in folder.iterdir()) == ["mask.jpg", "out_hd_0.png"]
    assert "seed: 5" in out.out and out.err == ""
    listed = [Path(line) for line in out.out.splitlines() if not line.startswith("seed: ")]
    assert listed == [Path("images_output") / "out_hd_0.png", Path("images_output") / "mask.jpg"]  # all it wrote
    with Image.open(folder / "out_hd_0.png") as im:
        assert im.size == (384, 512) and im.text["seed"] == "5" and im.text["mask"] == "auto"
    with Image.open(folder / "mask.jpg") as im:
        assert im.format == "JPEG" and im.size == (384, 512)

    # the original overwrites its fixed names; we do too, but say so (a fake pipeline is enough here)
    made = models.fake(preprocessor=synthetic_preprocessor())
    assert run_ootd.main([*args, "--seed", "-1"]) == 0
    out = capsys.readouterr()
    assert "replacing" in out.err and "out_hd_0.png" in out.err and "mask.jpg" in out.err
    assert made["hd"][0].calls["generate"] == 1
    seed_line = next(line for line in out.out.splitlines() if line.startswith("seed: "))
    assert int(seed_line.split()[1]) >= 0  # -1 drew a random seed, printed


def test_category_and_model_type_flags(models, run_ootd, tiny_tree: Path, example_images: dict[str, Path],  # noqa: ANN001
                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    made = models.fake()
    base = ["--model_path", str(example_images["person"]), "--cloth_path", str(example_images["trousers"]),
            "--checkpoints", str(tiny_tree), "--mask_path", str(example_images["mask"]),
            "--output_dir", str(tmp_path / "o")]
    assert run_ootd.main([*base, "--model_type", "hd", "--category", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: model_type 'hd' requires category 0 (upperbody); use --model_type dc"
    flags = ["--model_type", "dc", "-c", "2", "--sample", "3", "--step", "4", "--scale", "1.5"]
    assert run_ootd.main([*base, *flags]) == 0
    pipe = made["dc"][0]
    assert pipe.calls == {"person": 1, "garment": 1, "generate": 1}
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["mask.jpg"] + [f"out_dc_{i}.png" for i in range(3)]
    with Image.open(tmp_path / "o" / "out_dc_0.png") as im:
        assert im.text["steps"] == "4"
    assert run_ootd.main([*base, "--model_type", "sd"]) == 2
    assert "model_type must be 'hd' or 'dc'" in capsys.readouterr().err
    # ootd's errors worded with this script's own flags (--sample, --step), not ootd run's
    assert run_ootd.main([*base, "--model_type", "dc", "--sample", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --sample must be between 1 and 64, got 0"
    assert run_ootd.main([*base, "--model_type", "dc", "--step", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --step must be between 1 and 1000, got 0"
    assert Category.parse("2") is Category.DRESS


def test_script_in_a_fresh_process(tmp_path: Path, example_images: dict[str, Path]) -> None:
    help_text = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert help_text.returncode == 0
    for flag in ("--model_path", "--cloth_path", "--model_type", "--category", "--scale", "--step", "--sample",
                 "--seed", "--gpu_id", "--checkpoints"):
        assert flag in help_text.stdout
    missing = subprocess.run([sys.executable, str(SCRIPT), "--model_path", "nobody.jpg", "--cloth_path",
                              str(example_images["tshirt"])], capture_output=True, text=True, cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "error: person image nobody.jpg: file not found"
    assert not (tmp_path / "images_output").exists()
