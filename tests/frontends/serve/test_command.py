"""`ootd serve` as a command: it starts, prints its URL, answers, stops on Ctrl-C and removes its temporary
folder; it refuses an exposed address without --auth, and says how to install the extra when it is missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ootd import cli
from tests.helpers import REPO


def invoke(*args: str):  # noqa: ANN201
    return CliRunner().invoke(cli.app, [str(a) for a in args])


def test_serve_command_starts_answers_and_cleans_up(tmp_path: Path, tiny_tree: Path) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(temp)}
    proc = subprocess.Popen([sys.executable, "-m", "ootd", "serve", "--checkpoints", str(tiny_tree), "--port", "0",
                             "--device", "cpu", "--steps", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("ootd serve: open http://127.0.0.1:"), (line, proc.stderr.read())
        url = line.split("open ", 1)[1].split(" ", 1)[0].rstrip(";")
        assert [p.name.startswith("ootd-serve-") for p in temp.iterdir()] == [True]
        deadline = time.monotonic() + 30
        while True:
            try:
                health = httpx.get(url + "api/health", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert health.status_code == 200 and health.json()["models_loaded"] == []
        assert httpx.get(url + "api/options", timeout=5).json()["defaults"]["steps"] == 3
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, proc.stderr.read()
    assert list(temp.iterdir()) == [], "the temporary folder was left behind"


def test_serve_refuses_exposed_host_without_auth(tiny_tree: Path) -> None:
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
    result = invoke("serve", "--checkpoints", tiny_tree, "--host", "0.0.0.0")
    assert result.exit_code == 2
    assert "--auth" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_serve_without_the_extra_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tiny_tree: Path) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fastapi" else real(name, *a))
    result = invoke("serve", "--checkpoints", tiny_tree)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'ootd[serve]'" in lines[0]


def test_serve_bad_limits_are_usage_errors(tiny_tree: Path) -> None:
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
    for args, word in ((["--max-queue", "0"], "queue"), (["--max-upload", "1KiB"], "upload"),
                       (["--auth", "ann:"], "--auth"), (["--steps", "0"], "steps")):
        result = invoke("serve", "--checkpoints", tiny_tree, *args)
        assert result.exit_code == 2, (args, result.output)
        assert word in result.stderr
    missing = invoke("serve", "--checkpoints", tiny_tree / "nowhere")
    assert missing.exit_code == 1 and "does not exist" in missing.stderr
