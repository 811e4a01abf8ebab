"""A real `ootd serve --engine ray` process (its own private Ray instance, one CPU replica) stopped by SIGTERM or
SIGINT while a try-on runs: it exits 0, the deployment and Ray are gone, and so is every temporary folder, the
server's and the replica's; stopped while it starts (ray.init, the replicas starting): 143 or 130, the same left.
Option errors are one line and exit 2, before Ray starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
pytest.importorskip("ray.serve", reason="the ray-serve extra is not installed (pip install -e .[ray-serve])")
httpx = pytest.importorskip("httpx")

from tests.helpers import REPO  # noqa: E402
from tests.helpers.cli import assert_one_line_error, invoke  # noqa: E402
from tests.helpers.serving import kill_process, served_url, stop_process, tryon_files  # noqa: E402

LONG = {"category": "upper", "steps": "400", "resolution": "384x512", "seed": "3"}


def test_ray_options_need_the_ray_engine_and_sane_values(tiny_tree: Path) -> None:
    for args, words in ((["--replicas", "2"], "need --engine ray"), (["--address", "auto"], "need --engine ray"),
                        (["--engine", "ray", "--replicas", "0"], "--replicas"),
                        (["--engine", "ray", "--max-queued-per-replica", "-1"], "--max-queued-per-replica"),
                        (["--engine", "spark"], "engine")):
        assert_one_line_error(invoke("serve", "--checkpoints", tiny_tree, *args), 2, words)


def ray_env(temp: Path) -> dict[str, str]:
    ray_temp = Path(f"/tmp/ootd-ray-{os.getpid()}")  # Ray's sockets need a short path; its own logs stay there
    return {"PYTHONPATH": str(REPO), "TMPDIR": str(temp), "RAY_TMPDIR": str(ray_temp),
            "RAY_memory_monitor_refresh_ms": "0"}  # as ray_deployment: no Ray OOM killer on a shared machine


EXITS = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "owner", "delay"), [
    (signal.SIGTERM, "ray:init", None),  # the moment ray.init returns: Ray's own handlers, not yet replaced
    (signal.SIGINT, "ray:init", 0.3),
    (signal.SIGTERM, "ray.serve:run", 1.0),  # while the replicas start
], ids=["SIGTERM-as-ray-init-returns", "SIGINT-while-ray-starts", "SIGTERM-while-replicas-start"])
def test_a_signal_while_the_ray_engine_starts_stops_it_and_leaves_nothing(tmp_path: Path, tiny_tree: Path,
                                                                          sig: int, owner: str,
                                                                          delay: float | None) -> None:
    """Before it serves, a signal ends `ootd serve --engine ray` as any command: 130 or 143, one line, the
    deployment, Ray and every temporary folder gone."""
    from tests.helpers.signals import run_signalled, send_during

    temp = tmp_path / "tmp"
    temp.mkdir()
    mark = tmp_path / "sent"
    patch = ("from ootd.app.signals import ray_for_a_driver\nray_for_a_driver()\n"  # as the command imports Ray
             + send_during(owner, sig, mark, delay=delay))
    stopped = run_signalled(["serve", "--engine", "ray", "--replicas", "1", "--checkpoints", str(tiny_tree), "--port",
                             "0", "--device", "cpu"], patch, mark, env=ray_env(temp))
    code, last = EXITS[sig]
    print(f"{signal.Signals(sig).name} while starting: exit {stopped.code} {stopped.seconds:.1f} s after it")
    assert stopped.code == code, (stopped.code, stopped.stderr[-3000:])
    assert stopped.stderr.strip().splitlines()[-1] == last, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "SIGTERM received" not in stopped.stderr, stopped.stderr[-3000:]
    assert "ootd serve: open" not in stopped.stdout
    assert stopped.seconds is not None and stopped.seconds < 60
    assert stopped.left == [], f"processes left behind: {stopped.left}"
    assert list(temp.glob("ootd-serve-*")) == [], "a temporary folder was left behind"


# On the path of every process of the server (its Ray workers included): a replica holds inside its constructor,
# once it has made its temporary folder, until it is stopped; it says so in HELD.
HOLD_IN_THE_REPLICA = """
import os, pathlib, sys, time
if "default_worker" in sys.argv[0]:
    import ootd.serve.workspace as workspace
    _made = workspace.Workspace.__init__
    def _held(self, *args, **kwargs):
        _made(self, *args, **kwargs)
        pathlib.Path(HELD).write_text(str(self.path))
        time.sleep(120)
    workspace.Workspace.__init__ = _held
"""

# Run first in the server: SIG to itself once the replica holds.
WHEN_THE_REPLICA_HOLDS = """
import os, pathlib, threading, time
def _send():
    while not pathlib.Path(HELD).exists():
        time.sleep(0.05)
    pathlib.Path(MARK).write_text(repr(time.time()))
    os.kill(os.getpid(), SIG)
threading.Thread(target=_send, daemon=True).start()
"""


@pytest.mark.slow
def test_a_signal_while_a_replica_is_inside_its_constructor_leaves_no_folder(tmp_path: Path,
                                                                            tiny_tree: Path) -> None:
    """A replica stopped inside its constructor cannot remove the folder it made there: the server removes it once
    the replica's process is gone."""
    from tests.helpers.signals import run_signalled

    temp, site, held, mark = tmp_path / "tmp", tmp_path / "site", tmp_path / "held", tmp_path / "sent"
    temp.mkdir()
    site.mkdir()
    (site / "sitecustomize.py").write_text(HOLD_IN_THE_REPLICA.replace("HELD", repr(str(held))))
    patch = WHEN_THE_REPLICA_HOLDS.replace("HELD", repr(str(held))).replace("MARK", repr(str(mark))).replace(
        "SIG", str(int(signal.SIGTERM)))
    env = {**ray_env(temp), "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    stopped = run_signalled(["serve", "--engine", "ray", "--replicas", "1", "--checkpoints", str(tiny_tree), "--port",
                             "0", "--device", "cpu"], patch, mark, env=env)
    assert stopped.seconds is not None, f"never sent: {stopped.stderr[-3000:]}"
    print(f"SIGTERM in the replica's constructor: exit {stopped.code} {stopped.seconds:.1f} s after it")
    assert stopped.code == 143, (stopped.code, stopped.stderr[-3000:])
    assert "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    assert stopped.seconds < 60
    assert stopped.left == [], f"processes left behind: {stopped.left}"
    assert Path(held.read_text()).parent == temp
    assert list(temp.glob("ootd-serve-*")) == [], "the replica's temporary folder was left behind"


# Run first in the server: SIG to itself from inside ray.init, once the raylet it starts has started its own
# children (its agents), so the node is still being built; the time it was sent goes to MARK.
WHILE_THE_RAYLET_STARTS = """
import os, pathlib, subprocess, time
from ootd.app.signals import ray_for_a_driver
ray_for_a_driver()
import ray._private.services as services
_start_raylet = services.start_raylet
def _signalled(*args, **kwargs):
    started = _start_raylet(*args, **kwargs)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not subprocess.run(["pgrep", "-P", str(started.process.pid)],
                                                             capture_output=True).stdout:
        time.sleep(0.1)
    pathlib.Path(MARK).write_text(repr(time.time()))
    os.kill(os.getpid(), SIG)
    time.sleep(2)  # where the signal is handled
    return started
services.start_raylet = _signalled
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_ray_starts_its_processes_stops_every_one_and_leaves_tmpdir_empty(tmp_path: Path,
                                                                                         tiny_tree: Path,
                                                                                         sig: int) -> None:
    """Inside ray.init, the raylet and its agents running but the node not yet Ray's (ray.shutdown knows nothing
    of it): 143 or 130, and no process of its group left (the raylet's agents included), nothing in TMPDIR
    (Ray's own session folder is not the server's temporary folder)."""
    from tests.helpers.signals import run_signalled

    temp = tmp_path / "tmp"
    temp.mkdir()
    mark = tmp_path / "sent"
    patch = WHILE_THE_RAYLET_STARTS.replace("SIG", str(int(sig))).replace("MARK", repr(str(mark)))
    stopped = run_signalled(["serve", "--engine", "ray", "--replicas", "1", "--checkpoints", str(tiny_tree), "--port",
                             "0", "--device", "cpu"], patch, mark, env={"TMPDIR": str(temp)})
    code, last = EXITS[sig]
    assert stopped.seconds is not None, f"never sent: {stopped.stderr[-3000:]}"
    print(f"{signal.Signals(sig).name} while the raylet starts: exit {stopped.code} {stopped.seconds:.1f} s after it")
    assert stopped.code == code, (stopped.code, stopped.stderr[-3000:])
    assert stopped.stderr.strip().splitlines()[-1] == last, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    assert stopped.seconds < 60
    assert stopped.left == [], f"processes left behind: {stopped.left}"
    assert sorted(path.name for path in temp.iterdir()) == [], "left in TMPDIR"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_deployment_and_removes_every_temporary_folder(tmp_path: Path, tiny_tree: Path, sig: int,
                                                                          example_images: dict[str, Path]) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, **ray_env(temp)}
    err = tmp_path / "stderr.txt"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ootd", "serve", "--engine", "ray", "--replicas", "1", "--checkpoints",
             str(tiny_tree), "--port", "0", "--device", "cpu", "--max-steps", "1000"],
            stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("ootd serve: open http://127.0.0.1:"), (line, err.read_text()[-3000:])
        url = served_url(line)
        job = httpx.post(url + "api/jobs", files=tryon_files(example_images), data=LONG, timeout=30).json()
        deadline = time.monotonic() + 240
        while (status := httpx.get(url + f"api/jobs/{job['id']}", timeout=10).json())["done"] < 1:
            assert status["state"] in ("queued", "running") and time.monotonic() < deadline, status
            time.sleep(0.2)
        assert len(list(temp.glob("ootd-serve-*"))) == 2  # the server's folder and the replica's
        out, seconds = stop_process(proc, sig, 120)
    finally:
        kill_process(proc)
    text = err.read_text()
    print(f"{signal.Signals(sig).name} with a running try-on on a Ray replica: exited {proc.returncode} "
          f"{seconds:.1f} s after it")
    assert proc.returncode == 0, text[-3000:]
    assert out.strip().endswith("ootd serve: stopped"), out
    assert "Traceback" not in text, text[-3000:]
    assert list(temp.glob("ootd-serve-*")) == [], "a temporary folder was left behind"
