"""`ootd train` at the command line: bad input is one line and an exit code; SIGTERM during training leaves a
loadable checkpoint of the last finished step and nothing half-written, and exits 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
    assert_one_line_error(invoke("train", "run", tmp_path / "empty", "-o", tmp_path / "r", "--mixed-precision",
                                 "fp8"), 2, "unknown mixed precision")


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
