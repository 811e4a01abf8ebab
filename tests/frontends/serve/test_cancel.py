"""Abandoned work stops: a /api/tryon whose client hangs up is cancelled at its next denoising step, a job can be
cancelled with DELETE, a client that leaves mid-upload is one info line (no traceback), and every request is one
access-log line with its status and time. Live server on 127.0.0.1, bounded waits."""

from __future__ import annotations

import logging
import re
import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
httpx = pytest.importorskip("httpx")

from ootd.models import ModelSource  # noqa: E402
from ootd.serve.limits import Limits  # noqa: E402
from tests.helpers.serving import (  # noqa: E402
    StepCounter,
    host_port,
    live_server,
    raw_request,
    tiny_config,
    tryon_files,
    wait_until,
)

STEPS = 60  # far more than the test waits for: a job that ran to the end was not cancelled
LONG = {"category": "upper", "steps": str(STEPS), "resolution": "384x512", "seed": "3"}


def idle(live) -> bool:  # noqa: ANN001
    return not httpx.get(live.url + "api/health", timeout=10).json()["queue"]["running"]


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture):  # noqa: ANN201
    """Every record of ootd and of uvicorn (whose loggers do not propagate to the root)."""
    uvicorn = logging.getLogger("uvicorn")
    uvicorn.addHandler(caplog.handler)
    caplog.set_level(logging.INFO)
    try:
        yield caplog
    finally:
        uvicorn.removeHandler(caplog.handler)


def test_a_client_that_hangs_up_is_cancelled_at_the_next_step(tiny_tree: Path, pipe_hd, logs,  # noqa: ANN001
                                                              example_images: dict[str, Path]) -> None:
    counter = StepCounter(pipe_hd)
    with live_server(tiny_config(tiny_tree), limits=Limits(max_steps=1000),
                     models=ModelSource(lambda model_type: counter)) as live:
        request, _ = raw_request(live.url, "POST", "/api/tryon", files=tryon_files(example_images), data=LONG)
        with socket.create_connection(host_port(live.url), timeout=30) as sock:
            sock.sendall(request)
            assert counter.started.wait(120), "the try-on never started"
        left = time.monotonic()
        assert counter.ended.wait(60), "the abandoned try-on ran on"
        stopped_after = time.monotonic() - left
        assert counter.steps < STEPS and type(counter.error).__name__ == "Cancelled", (counter.steps, counter.error)
        wait_until(lambda: idle(live), 30, "the worker to be free")
        ok = httpx.post(live.url + "api/tryon", files=tryon_files(example_images), timeout=120,
                        data={**LONG, "steps": "1"})
        assert ok.status_code == 200, ok.text
    print(f"cancelled after step {counter.steps} of {STEPS}, {stopped_after:.1f} s after the client left")
    messages = [r.getMessage() for r in logs.records]
    assert any("went away" in m and "cancelled" in m for m in messages), messages
    assert not [r for r in logs.records if r.levelno >= logging.ERROR], [r.getMessage() for r in logs.records]
    assert any(re.fullmatch(r'127\.0\.0\.1:\d+ - "POST /api/tryon HTTP/1\.1" 499 Client Closed Request \d+ ms', m)
               for m in messages), messages


def test_delete_cancels_a_waiting_or_running_job(tiny_tree: Path, pipe_hd,  # noqa: ANN001
                                                 example_images: dict[str, Path]) -> None:
    counter = StepCounter(pipe_hd)
    with live_server(tiny_config(tiny_tree), limits=Limits(max_steps=1000),
                     models=ModelSource(lambda model_type: counter)) as live:
        running = httpx.post(live.url + "api/jobs", files=tryon_files(example_images), data=LONG, timeout=30).json()
        waiting = httpx.post(live.url + "api/jobs", files=tryon_files(example_images), data=LONG, timeout=30).json()
        assert counter.started.wait(120)
        answer = httpx.delete(live.url + f"api/jobs/{waiting['id']}", timeout=10)
        assert answer.status_code == 202 and answer.json()["state"] == "cancelled"  # left the line at once
        assert httpx.delete(live.url + f"api/jobs/{running['id']}", timeout=10).status_code == 202
        assert counter.ended.wait(60) and counter.steps < STEPS
        stopped = live.app.state.worker.get(running["id"])
        wait_until(lambda: stopped.state == "cancelled", 30, "the job to stop, cancelled")
        assert "cancelled" in str(stopped.error) and stopped.result is None
        gone = httpx.get(live.url + f"api/jobs/{running['id']}", timeout=10)  # for its client, the job is gone
        assert gone.status_code == 410 and "cancelled" in gone.json()["error"], gone.text
        assert not (live.workdir / "jobs" / running["id"] / "results").exists() or not any(
            (live.workdir / "jobs" / running["id"] / "results").iterdir())
        assert httpx.delete(live.url + "api/jobs/nope", timeout=10).status_code == 404


def test_a_client_leaving_mid_upload_is_an_info_line(tiny_tree: Path, pipe_hd, logs,  # noqa: ANN001
                                                     example_images: dict[str, Path]) -> None:
    with live_server(tiny_config(tiny_tree), models=ModelSource(lambda model_type: pipe_hd)) as live:
        request, _ = raw_request(live.url, "POST", "/api/jobs", files=tryon_files(example_images), data=LONG)
        for _ in range(3):
            with socket.create_connection(host_port(live.url), timeout=30) as sock:
                sock.sendall(request[: len(request) // 2])  # half the body, then gone
            time.sleep(0.3)
        wait_until(lambda: sum("went away during POST /api/jobs" in r.getMessage() for r in logs.records) == 3,
                   20, "three info lines")
        assert list((live.workdir / "jobs").iterdir()) == []  # nothing kept of the half uploads
        assert httpx.get(live.url + "api/health", timeout=10).status_code == 200
    errors = [r for r in logs.records if r.levelno >= logging.WARNING or r.exc_info]
    assert errors == [], [(r.name, r.getMessage()) for r in errors]


def test_every_request_is_one_access_line(tiny_tree: Path, pipe_hd, logs) -> None:  # noqa: ANN001
    with live_server(tiny_config(tiny_tree), models=ModelSource(lambda model_type: pipe_hd)) as live:
        httpx.get(live.url + "api/health?x=1", timeout=10)
        httpx.get(live.url + "api/jobs/nope", timeout=10)
        httpx.get(live.url + "api/health", headers={"Host": "evil.example"}, timeout=10)
    lines = [r.getMessage() for r in logs.records if r.name == "ootd.serve.access"]
    assert len(lines) == 3, lines
    pattern = r'127\.0\.0\.1:\d+ - "GET {} HTTP/1\.1" {} \d+ ms'
    assert re.fullmatch(pattern.format(r"/api/health\?x=1", "200 OK"), lines[0]), lines[0]
    assert re.fullmatch(pattern.format("/api/jobs/nope", "404 Not Found"), lines[1]), lines[1]
    assert re.fullmatch(pattern.format("/api/health", "421 Misdirected Request"), lines[2]), lines[2]
