"""`ootd train` at the command line: bad input is one line and an exit code; `--explain` prints the same memory
estimate on both engines; `--epochs` runs its steps; SIGTERM during training leaves a loadable checkpoint of the
last finished step and nothing half-written, and exits 143; `ootd train distill` takes the run's options."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ootd.app.train import loop, ray_engine
from ootd.app.train.checkpoints import checkpoints, load_checkpoint
from tests.helpers import REPO
from tests.helpers.cli import assert_one_line_error, invoke
from tests.helpers.serving import kill_process, stop_process, wait_until
from tests.helpers.training import prepared_cache


def test_bad_input_is_one_line(tmp_path: Path, tiny_tree: Path) -> None:
    assert_one_line_error(invoke("train", "prepare", tmp_path / "nothing", "-o", tmp_path / "c",
                                 "--checkpoints", tiny_tree), 2, "not found")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(invoke("train", "prepare", tmp_path / "empty", "-o", tmp_path / "c"), 2,
                          "none of the layouts")
    assert_one_line_error(invoke("train", "run", tmp_path / "empty", "-o", tmp_path / "r"), 2,
                          "is not a training cache")
    assert_one_line_error(invoke("train", "run", tmp_path / "empty", "-o", tmp_path / "r", "--rank", "0"), 2,
                          "--rank must be 1 to 1024")
    # the library names the setting (`learning_rate`); the command words it with its own flag
    assert_one_line_error(invoke("train", "run", tmp_path / "empty", "-o", tmp_path / "r", "--lr", "5"), 2,
                          "--lr must be above 0 and at most 1, got 5.0")
    assert_one_line_error(invoke("train", "run", tmp_path / "empty", "-o", tmp_path / "r", "--mixed-precision",
                                 "fp8"), 2, "unknown mixed precision")


def test_distill_words_its_settings_with_its_own_flags(tmp_path: Path) -> None:
    """`ootd train distill` takes `ootd train run`'s settings (--lr) and its own; the library's errors name them
    (`ema_decay`, `teacher_lora`) and the command words them with its flags."""
    (tmp_path / "empty").mkdir()
    distill = ("train", "distill", tmp_path / "empty", "-o", tmp_path / "r")
    assert_one_line_error(invoke(*distill, "--lr", "5"), 2, "--lr must be above 0 and at most 1, got 5.0")
    assert_one_line_error(invoke(*distill, "--ema-decay", "1"), 2,
                          "--ema-decay must be from 0 up to (not including) 1, got 1.0")
    assert_one_line_error(invoke(*distill, "--sampler", "unipc"), 2, "--sampler must be one of lcm, tcd")
    assert_one_line_error(invoke(*distill, "--teacher-lora-scale", "2"), 2,
                          "--teacher-lora-scale needs --teacher-lora FILE")
    assert_one_line_error(invoke(*distill, "--teacher-lora", tmp_path / "shop.safetensors"), 2,
                          "--teacher-lora ", "shop.safetensors: not found")
    assert_one_line_error(invoke(*distill), 2, "is not a training cache")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory, tiny_tree: Path, example_images: dict) -> Path:
    return prepared_cache(tmp_path_factory.mktemp("train-cli"), tiny_tree, example_images, split=0.0)


def _estimate(stderr: str) -> list[str]:
    """--explain's memory estimate: the total and its parts, without the headline's wording."""
    lines = stderr.splitlines()
    (start,) = [n for n, line in enumerate(lines) if line.startswith("memory estimate for training")]
    return [lines[start].split(": ", 1)[1], *lines[start + 1:start + 4]]


def test_explain_prints_the_memory_estimate_on_both_engines(cache: Path, tiny_tree: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The Ray engine's estimate (from the configs on the driver, no weights loaded) is the local engine's, per
    worker; training itself is stubbed out on both."""
    started: list[str] = []

    def no_loop(trainer: loop.Trainer, progress: object = None) -> loop.TrainReport:
        started.append("local")
        return loop.TrainReport(0, 0, [], trainer.options.output / "lora.safetensors", [], 0.0)

    def no_fit(options: loop.TrainOptions, workers: int, gpus: bool) -> float:
        started.append(f"ray x{workers}")
        return 0.0

    monkeypatch.setattr(loop, "run_loop", no_loop)
    monkeypatch.setattr(ray_engine, "_fit", no_fit)
    common = ("--checkpoints", tiny_tree, "--device", "cpu", "--batch-size", "2", "--train-garment", "--explain")
    local = invoke("train", "run", cache, "-o", tmp_path / "local", *common)
    ray = invoke("train", "run", cache, "-o", tmp_path / "ray", *common, "--engine", "ray", "--workers", "2")
    assert (local.exit_code, ray.exit_code, started) == (0, 0, ["local", "ray x2"]), local.output + ray.output
    assert "device: cpu" in local.stderr and "engine: ray, 2 worker(s), CPUs each" in ray.stderr
    assert "memory estimate for training, per worker: " in ray.stderr
    assert "= 2 pairs per step" in local.stderr and "= 4 pairs per step" in ray.stderr
    estimate = _estimate(local.stderr)
    assert estimate == _estimate(ray.stderr)
    assert [line.split()[0] for line in estimate[1:]] == ["weights", "adapter", "activations"]


def test_epochs_run_their_steps(cache: Path, tiny_tree: Path, tmp_path: Path) -> None:
    """3 training pairs at a global batch of 3 are one step an epoch: --epochs 2 is 2 steps (the arithmetic of
    partial batches: tests/library/training/test_settings.py)."""
    run = tmp_path / "run"
    result = invoke("train", "run", cache, "-o", run, "--checkpoints", tiny_tree, "--device", "cpu", "--epochs", "2",
                    "--batch-size", "3", "--validation-pairs", "0", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["from_step"], summary["steps"]) == (0, 2)
    assert summary["loss_plot"] == str(run / "loss.png") and summary["no_loss_plot"] is None  # matplotlib here
    assert [json.loads(line)["step"] for line in (run / "loss.jsonl").read_text().splitlines()] == [1, 2]
    assert [c.step for c in checkpoints(run)] == [2]


def test_without_matplotlib_the_run_says_there_is_no_loss_plot(cache: Path, tiny_tree: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/training.md lists RUN/loss.png: where matplotlib (the train extra) is missing the run says why there
    is none and where the losses are, instead of nothing."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed
    run = tmp_path / "run"
    result = invoke("train", "run", cache, "-o", run, "--checkpoints", tiny_tree, "--device", "cpu", "--steps", "1",
                    "--validation-pairs", "0")
    assert result.exit_code == 0, result.output
    assert "no loss.png: the loss plot needs matplotlib" in result.stdout and "pip install -e '.[train]'" in \
        result.stdout
    assert not (run / "loss.png").exists() and (run / "loss.jsonl").is_file()


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_143(tmp_path: Path, tiny_tree: Path, example_images: dict) -> None:
    cache = prepared_cache(tmp_path / "data", tiny_tree, example_images, split=0.0)
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "ootd", "train", "run", str(cache), "-o", str(run), "--checkpoints",
                             str(tiny_tree), "--steps", "1000", "--checkpoint-every", "1000", "--device", "cpu",
                             "--validation-pairs", "0", "-q"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        log = run / "loss.jsonl"
        wait_until(lambda: log.is_file() and len(log.read_text().splitlines()) >= 2, 120, "two training steps")
        out, _ = stop_process(proc, signal.SIGTERM, 120)
    finally:
        kill_process(proc)
    assert proc.returncode == 143, out
    assert "terminated" in out and "Traceback" not in out
    (saved,) = checkpoints(run)
    restored = load_checkpoint(saved)  # the adapter passes --lora's checks; the optimizer state reads back
    assert restored.step == saved.step >= 2 and restored.optimizer_state["state"]
    assert not [p for p in run.rglob("*") if p.name.startswith(".")]
    started = time.perf_counter()
    assert invoke("train", "run", cache, "-o", run, "--checkpoints", tiny_tree, "--steps", str(saved.step + 1),
                  "--validation-pairs", "0", "--resume", "--device", "cpu").exit_code == 0
    assert time.perf_counter() - started < 120


@pytest.mark.slow
def test_distill_takes_the_run_options(cache: Path, tiny_tree: Path, tmp_path: Path) -> None:
    """`ootd train distill` takes the run's options as `ootd train run` does (--checkpoints, --device, --json here)
    and its settings (--steps, --validation-pairs) beside them: a one-step distillation's JSON summary."""
    run = tmp_path / "fast"
    result = invoke("train", "distill", cache, "-o", run, "--checkpoints", tiny_tree, "--device", "cpu", "--steps",
                    "1", "--validation-pairs", "0", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["run"], summary["from_step"], summary["steps"]) == (str(run), 0, 1)
    assert (run / "lora.safetensors").is_file()
