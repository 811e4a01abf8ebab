"""`ootd` end to end on the tiny checkpoints tree: run (hd, dc, both resolutions, JSON, metadata, seeds,
overwrite, intermediates, automatic mask), download, checkpoints verify, doctor, help."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ootd import __version__
from ootd.app.tryon.config import build_config
from tests.helpers.cli import invoke
from tests.helpers.images import pixels
from tests.helpers.synthetic import counted_preprocessor

RUN = ["--steps", "1", "--resolution", "384x512"]


@pytest.fixture
def use_pipes(models, pipe_hd, pipe_dc):  # noqa: ANN001, ANN201
    """Serve the session's loaded tiny pipelines instead of loading them again."""
    pipes = {"hd": pipe_hd, "dc": pipe_dc}
    models.use(lambda model_type: pipes[model_type.value])
    return pipe_hd, pipe_dc


def test_run_hd_json_metadata_seed_overwrite(tmp_path: Path, tiny_tree: Path, example_images: dict[str, Path],
                                             pipe_hd, models) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    args = ["run", "--model", example_images["person"], "--cloth", example_images["tshirt"], "--category", "upper",
            "--mask", example_images["mask"], "--checkpoints", tiny_tree, "-o", out, "--seed", "7", *RUN,
            "--json", "--explain"]
    result = invoke(*args)  # through the real loader
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    target = out / "person__tshirt__0.png"
    assert summary["outputs"] == [str(target)]
    assert summary["seed"] == 7 and summary["seed_random"] is False
    assert (summary["model_type"], summary["category"]) == ("hd", "upper")
    assert summary["device"] == "cpu" and summary["precision"] == "fp32" and summary["attention"]
    assert {"load", "preprocess", "garment_unet", "denoise", "decode", "total"} <= set(summary["timings"])
    assert summary["peak_memory"]["host_rss_bytes"] > 0
    assert summary["settings"]["steps"] == 1 and summary["describe"]["device"] == "cpu"
    with Image.open(target) as im:
        assert im.size == (384, 512)
        meta = dict(im.text)
    assert meta["seed"] == "7" and meta["steps"] == "1" and meta["model_type"] == "hd"
    assert (meta["person"], meta["garment"], meta["mask"]) == ("person.png", "tshirt.png", "person_mask_upper.png")
    assert meta["resolution"] == "384x512" and meta["software"] == f"ootd {__version__}"
    assert meta["threads"] == str(torch.get_num_threads())  # the default: this process's count, recorded
    first = pixels(target)
    mtime = target.stat().st_mtime_ns

    # no overwrite without --overwrite: refused before any model work, file untouched
    models.forbid()
    refused = invoke(*args)
    assert refused.exit_code == 1
    assert refused.stderr.startswith("error: ") and "already exists" in refused.stderr
    assert "--overwrite" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and refused.stdout == ""
    assert target.stat().st_mtime_ns == mtime

    # with --overwrite, the same seed gives the same image
    models.use(pipe_hd)
    again = invoke(*args[:-2], "--overwrite")
    assert again.exit_code == 0, again.output
    assert target.stat().st_mtime_ns != mtime
    np.testing.assert_array_equal(pixels(target), first)
    assert sorted(p.name for p in out.iterdir()) == ["person__tshirt__0.png"]  # no temporary files left


def test_run_dc_lower_with_mask_prints_random_seed(tmp_path: Path, tiny_tree: Path,
                                                   example_images: dict[str, Path], use_pipes) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    result = invoke("run", "-m", example_images["person"], "-c", example_images["trousers"], "-k", "lowerbody",
                    "--mask", example_images["mask"], "--checkpoints", tiny_tree, "-o", out, *RUN)
    assert result.exit_code == 0, result.output
    target = out / "person__trousers__0.png"
    lines = result.stdout.splitlines()
    assert lines[0] == str(target)
    seed_line = next(line for line in lines if line.startswith("seed: "))
    seed = int(seed_line.split()[1])
    assert "random" in seed_line and f"--seed {seed}" in seed_line
    with Image.open(target) as im:
        assert im.text["seed"] == str(seed) and im.text["model_type"] == "dc" and im.text["category"] == "lower"


def test_run_768x1024_one_step(tmp_path: Path, tiny_tree: Path, example_images: dict[str, Path], use_pipes) -> None:  # noqa: ANN001
    result = invoke("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "0",
                    "--mask", example_images["mask"], "--checkpoints", tiny_tree, "-o", tmp_path,
                    "--steps", "1", "--resolution", "768x1024", "--seed", "1", "-q")
    assert result.exit_code == 0, result.output
    with Image.open(tmp_path / "person__tshirt__0.png") as im:
        assert im.size == (768, 1024) and im.text["resolution"] == "768x1024"


def test_save_intermediates_with_automatic_mask(tmp_path: Path, tiny_tree: Path, example_images: dict[str, Path],
                                                pipe_hd, models) -> None:  # noqa: ANN001
    counted, runs = counted_preprocessor()
    # pose + parsing run before the pipeline loads, once: the mask made then is the one the try-on uses
    models.use(pipe_hd, preprocessor=counted)
    result = invoke("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper",
                    "--checkpoints", tiny_tree, "-o", tmp_path, "--save-intermediates", "--seed", "2", *RUN)
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(f"person__tshirt__{k}.png" for k in ("0", "pose", "parsing", "mask", "masked_person"))
    with Image.open(tmp_path / "person__tshirt__mask.png") as im:
        mask = np.asarray(im)
        assert im.text["mask"] == "auto" and im.text["seed"] == "2"
    assert set(np.unique(mask)) == {0, 255} and 0.02 < (mask > 0).mean() < 0.8
    for name in names:
        assert str(tmp_path / name) in result.stdout
    assert runs == {"pose": 1, "parsing": 1}


def test_automatic_mask_on_tiny_tree_finds_no_person(tmp_path: Path, tiny_tree: Path,
                                                     example_images: dict[str, Path], use_pipes,  # noqa: ANN001
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pipe_hd, _ = use_pipes
    monkeypatch.setattr(pipe_hd, "_preprocessor", None)  # the tiny tree's random pose weights
    monkeypatch.setattr(pipe_hd, "parsing_provider", "cpu")
    out = tmp_path / "out"
    result = invoke("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper",
                    "--checkpoints", tiny_tree, "-o", out, *RUN)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: no person detected in {example_images['person']}")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert list(out.iterdir()) == []


def test_verbose_logs_ootd_debug_lines(models, tmp_path: Path, tiny_tree: Path, example_images: dict[str, Path],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    models.fake()
    base = ["run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper", "--mask",
            example_images["mask"], "--checkpoints", tiny_tree]
    loud = invoke(*base, "-o", tmp_path / "a", "-v")
    assert loud.exit_code == 0 and "debug: saved" in loud.stderr
    quiet = invoke(*base, "-o", tmp_path / "b")
    assert quiet.exit_code == 0 and quiet.stderr == ""


# ---------------------------------------------------------------------------------------------- other commands


def test_help_everywhere_has_examples_and_version() -> None:
    for command in (["run"], ["batch"], ["download"], ["doctor"], ["checkpoints", "verify"], ["bench"], ["compare"]):
        result = invoke(*command, "--help")
        assert result.exit_code == 0, command
        assert "Example" in result.stdout and "ootd " + command[0] in result.stdout, command
    top = invoke("--help")
    assert top.exit_code == 0 and all(c in top.stdout for c in ("run", "batch", "download", "doctor", "checkpoints"))
    version = invoke("--version")
    assert version.exit_code == 0 and version.stdout.strip() == f"ootd {__version__}"
    module = subprocess.run([sys.executable, "-m", "ootd", "--version"], capture_output=True, text=True)
    assert module.returncode == 0 and module.stdout.strip() == f"ootd {__version__}"


def test_download_offline_is_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    result = invoke("download", "--dest", tmp_path / "ck", "--models", "hd")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot download") and "offline" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    bad = invoke("download", "--dest", tmp_path / "ck", "--models", "xl")
    assert bad.exit_code == 2 and "unknown model type" in bad.stderr


def test_checkpoints_verify_ok_and_damaged(tmp_path: Path, tiny_tree: Path) -> None:
    ok = invoke("checkpoints", "verify", tiny_tree)
    assert ok.exit_code == 0, ok.output
    assert "all" in ok.stdout and "files ok" in ok.stdout and "vae weights" in ok.stdout

    damaged = tmp_path / "ck"
    shutil.copytree(tiny_tree, damaged)
    (damaged / "ootd" / "ootd_hd" / "checkpoint-36000" / "unet_vton" / "diffusion_pytorch_model.safetensors").unlink()
    vae = damaged / "ootd" / "vae" / "diffusion_pytorch_model.bin"
    vae.write_bytes(vae.read_bytes()[: vae.stat().st_size // 2])
    result = invoke("checkpoints", "verify", damaged, "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    bad = {f["component"]: f for f in report["files"] if not f["ok"]}
    assert set(bad) == {"unet_vton (hd) weights", "vae weights"}
    assert "truncated" in bad["vae weights"]["problem"] and "ootd download" in bad["vae weights"]["fix"]
    table = invoke("checkpoints", "verify", damaged)
    assert table.exit_code == 1 and "2 of" in table.stdout and "have problems" in table.stdout


def test_doctor_runs(tmp_path: Path, tiny_tree: Path) -> None:
    result = invoke("doctor", "--checkpoints", tiny_tree, "--no-kernels", "--quick")
    assert result.exit_code == 0, result.output
    assert "try-ons can run" in result.stdout and "onnxruntime" in result.stdout
    missing = invoke("doctor", "--checkpoints", tmp_path / "nowhere", "--no-kernels", "--json")
    assert missing.exit_code == 1
    report = json.loads(missing.stdout)
    assert report["can_run"] is False and any(i["section"] == "checkpoints" for i in report["items"])


def test_speed_flags_reach_the_pipeline(tmp_path: Path, tiny_tree: Path, example_images: dict[str, Path]) -> None:
    """--channels-last through the real loader: reported in --json and applied to the models."""
    result = invoke("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper",
                    "--mask", example_images["mask"], "--checkpoints", tiny_tree, "-o", tmp_path, "--seed", "3",
                    "--channels-last", "--json", "--explain", *RUN)
    assert result.exit_code == 0, result.output
    describe = json.loads(result.stdout)["describe"]
    assert describe["channels_last"] is True and describe["compile"] is False
    config = build_config(
        checkpoints=tiny_tree, output=tmp_path, model_type=None, samples=1, steps=1, scale=2.0, seed=1,
        resolution="384x512", scheduler="unipc", precision="auto", attention="auto", device="cpu",
        parsing_provider="cpu", max_memory=None, fit="pad", mask_grow=0, save_intermediates=False,
        overwrite=False, channels_last=False, compile=True,
    )
    assert (config.speed.channels_last, config.speed.compile) == (False, True)
    default = build_config(
        checkpoints=tiny_tree, output=tmp_path, model_type=None, samples=1, steps=1, scale=2.0, seed=1,
        resolution="384x512", scheduler="unipc", precision="auto", attention="auto", device="cpu",
        parsing_provider="cpu", max_memory=None, fit="pad", mask_grow=0, save_intermediates=False, overwrite=False,
    )
    assert (default.speed.channels_last, default.speed.compile) == (None, None)  # the device profile decides
    for command in ("run", "batch", "bench"):
        help_text = invoke(command, "--help").stdout
        assert "--channels-last" in help_text and "--compile" in help_text, command
