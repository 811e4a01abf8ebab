"""A real `ootd serve` process stopped by signals: SIGTERM or SIGINT while a job runs cancels it at its next step
and exits 0 within seconds, folder removed, nothing written afterwards; a client waiting on /api/tryon gets a JSON
503; after kill -9 the next server removes the folder the killed one left. Every wait is bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
httpx = pytest.importorskip("httpx")

from tests.helpers import REPO  # noqa: E402
from tests.helpers.serving import kill_process, served_url, stop_process, tryon_files, wait_until  # noqa: E402

LONG = {"category": "upper", "steps": "400", "resolution": "384x512", "seed": "3"}
STOP_WITHIN_S = 15  # generous for a loaded machine; the figure printed is what it took
ORT_TELEMETRY = ".ses"  # ONNX Runtime 1.32 writes it into $TMPDIR when it loads a model; not the server's


class Served:
    """`ootd serve` on a free port with its own TMPDIR; stderr to a file (never a full pipe)."""

    def __init__(self, root: Path, tiny_tree: Path, temp: Path | None = None) -> None:
        self.temp = temp or root / "tmp"
        self.temp.mkdir(exist_ok=True)
        self.stderr_path = root / f"stderr-{time.monotonic_ns()}.txt"
        env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(self.temp)}
        with self.stderr_path.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ootd", "serve", "--checkpoints", str(tiny_tree), "--port", "0",
                 "--device", "cpu", "--max-steps", "1000"],
                stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True, env=env)
        line = self.proc.stdout.readline()
        assert line.startswith("ootd serve: open http://127.0.0.1:"), (line, self.stderr())
        self.url = served_url(line)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def get(self, path: str) -> dict:
        return httpx.get(self.url + path, timeout=10).json()

    def folders(self) -> list[str]:
        """What the server left in its TMPDIR, less ONNX Runtime's own telemetry file (`.ses`, 51 bytes, written
        there by the library whenever a process loads the parsing model, as measuring preservation does)."""
        return sorted(p.name for p in self.temp.iterdir() if p.name != ORT_TELEMETRY)

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, float, str]:
        """Send `sig`; (exit code, seconds to exit, the rest of stdout)."""
        try:
            out, seconds = stop_process(self.proc, sig, 60)
        except AssertionError as error:
            raise AssertionError(f"{error}: {self.stderr()[-2000:]}") from None
        return self.proc.returncode, seconds, out

    def kill(self) -> None:
        kill_process(self.proc)


def assert_clean_exit(served: Served, code: int, seconds: float, out: str) -> None:
    err = served.stderr()
    assert code == 0, (code, err[-3000:])
    assert seconds < STOP_WITHIN_S, f"took {seconds:.1f} s to stop"
    assert out.strip().endswith("ootd serve: stopped"), out
    for bad in ("Traceback", "terminate called", "Exception in ASGI application", "ERROR"):
        assert bad not in err, err[-3000:]
    assert served.folders() == [], "the temporary folder was left behind"
    time.sleep(1.5)
    assert served.folders() == [], "files were written after the server stopped"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_cancels_the_running_job_and_exits_0(tmp_path: Path, tiny_tree: Path, sig: int,
                                                      example_images: dict[str, Path]) -> None:
    served = Served(tmp_path, tiny_tree)
    try:
        job = httpx.post(served.url + "api/jobs", files=tryon_files(example_images), data=LONG, timeout=30).json()
        waiting = httpx.post(served.url + "api/jobs", files=tryon_files(example_images), data=LONG, timeout=30).json()
        wait_until(lambda: (s := served.get(f"api/jobs/{job['id']}"))["stage"] == "denoise" and s["done"] >= 1,
                   180, "the first denoising step")
        code, seconds, out = served.stop(sig)
    finally:
        served.kill()
    print(f"{signal.Signals(sig).name}: exited {code} {seconds:.1f} s after the signal")
    assert waiting["state"] == "queued"
    assert_clean_exit(served, code, seconds, out)


@pytest.mark.slow
def test_waiting_clients_get_a_json_503_and_abandoned_work_stops(tmp_path: Path, tiny_tree: Path,
                                                                  example_images: dict[str, Path]) -> None:
    served = Served(tmp_path, tiny_tree)
    answers: list[httpx.Response] = []
    try:
        warm = httpx.post(served.url + "api/tryon", files=tryon_files(example_images), timeout=300,
                          data={**LONG, "steps": "1"})  # loads the model: a load has no step to stop at
        assert warm.status_code == 200, warm.text
        # a client that gives up: its try-on stops, the device is free again
        with pytest.raises(httpx.TimeoutException):
            httpx.post(served.url + "api/tryon", files=tryon_files(example_images), data=LONG, timeout=4)
        wait_until(lambda: not served.get("api/health")["queue"]["running"], 30, "the abandoned try-on to stop")
        # a client that waits while the server is told to stop
        client = threading.Thread(target=lambda: answers.append(httpx.post(
            served.url + "api/tryon", files=tryon_files(example_images), data=LONG, timeout=60)))
        client.start()
        wait_until(lambda: served.get("api/health")["queue"]["running"], 30, "the try-on to run")
        time.sleep(1)
        code, seconds, out = served.stop(signal.SIGTERM)
        client.join(30)
    finally:
        served.kill()
    assert len(answers) == 1, "the waiting client got no answer"
    answer = answers[0]
    assert answer.status_code == 503 and answer.headers["content-type"] == "application/json", answer.text
    assert "shutting down" in answer.json()["error"] and answer.headers["retry-after"]
    print(f"SIGTERM with a waiting client: exited {code} {seconds:.1f} s after the signal")
    assert_clean_exit(served, code, seconds, out)


def test_the_next_server_removes_a_killed_servers_folder(tmp_path: Path, tiny_tree: Path) -> None:
    killed = Served(tmp_path, tiny_tree)
    left = killed.folders()
    assert len(left) == 1 and left[0].startswith("ootd-serve-")
    killed.proc.send_signal(signal.SIGKILL)
    killed.proc.wait(30)
    assert killed.folders() == left, "kill -9 runs no cleanup: the folder is still there"
    restarted = Served(tmp_path, tiny_tree, temp=killed.temp)
    try:
        now = restarted.folders()
        assert len(now) == 1 and now != left, now
        code, _, _ = restarted.stop(signal.SIGTERM)
    finally:
        restarted.kill()
    assert code == 0 and restarted.folders() == []


STUCK = textwrap.dedent("""
    import sys, time
    from ootd.app.tryon.config import build_config
    from ootd.models import use_models
    from ootd.serve.limits import Limits
    from ootd.serve.server import serve

    def slow_model(model_type):  # a model that takes minutes to load: no step to stop at
        time.sleep(300)

    with use_models(slow_model):
        serve(build_config(checkpoints=sys.argv[1], device="cpu"), "127.0.0.1", 0, Limits(max_steps=1000),
              announce=lambda line: print(line, flush=True))
""")


@pytest.mark.slow
def test_a_stage_with_no_step_to_stop_at_still_ends_in_seconds(tmp_path: Path, tiny_tree: Path,
                                                               example_images: dict[str, Path]) -> None:
    """SIGTERM while a model loads: the process exits 0 once the wait for the next step is over (STOP_S),
    its folder removed, without aborting in torch's destructors."""
    from ootd.serve.server import STOP_S

    temp = tmp_path / "tmp"
    temp.mkdir()
    err = tmp_path / "stderr.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(temp)}
    with err.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", STUCK, str(tiny_tree)], stdout=subprocess.PIPE,
                                stderr=stderr, stdin=subprocess.DEVNULL, text=True, env=env)
    try:
        url = served_url(proc.stdout.readline())
        job = httpx.post(url + "api/jobs", files=tryon_files(example_images), data=LONG, timeout=30).json()
        wait_until(lambda: httpx.get(url + f"api/jobs/{job['id']}", timeout=10).json()["stage"] == "load", 60,
                   "the model to start loading")
        out, seconds = stop_process(proc, signal.SIGTERM, 60)
    finally:
        kill_process(proc)
    text = err.read_text()
    print(f"SIGTERM during a load: exited {proc.returncode} {seconds:.1f} s after the signal")
    assert proc.returncode == 0, text[-2000:]
    assert seconds < STOP_S + 8 and out.strip().endswith("ootd serve: stopped"), (seconds, out)
    assert "did not stop within" in text and "(load)" in text, text[-2000:]
    assert "terminate called" not in text and "Traceback" not in text
    assert list(temp.iterdir()) == []
