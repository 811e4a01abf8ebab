"""A real `ootd` process (or script) that gets a real signal at a chosen moment of its work: a `patch` run before
the command wraps the function that marks the moment and starts a timer that sends the signal a little later,
so it lands in the middle of the work, as one from a terminal or a service manager would. The process runs in
a process group of its own; what is left of that group afterwards (Ray's processes) is reported and killed.

Two bounds, because only the second is the behaviour under test: the work before the signal (a Ray start, a pair
of 200 steps) takes what the machine gives it, minutes on a loaded 2-core machine, so it gets its own generous
bound; the stop after the signal gets `limit`. A process still running past either is made to print every
thread's stack (faulthandler, SIGUSR1) before it is killed, and the failure says which bound it passed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import REPO

# Run first in the process: wraps OWNER.NAME so that its call number AT starts a timer sending SIG to TARGET
# ("self": this process; "group": its whole process group, as Ctrl-C at a terminal) DELAY seconds later (None:
# the moment that call returns); the time it was sent goes to MARK.
SEND_DURING = """
import importlib, os, pathlib, signal, threading, time
def _send():
    pathlib.Path(MARK).write_text(repr(time.time()))
    if TARGET == "group":
        os.killpg(os.getpgid(0), SIG)
    else:
        os.kill(os.getpid(), SIG)
_delay = DELAY
def _arm(owner, name):
    original, calls = getattr(owner, name), [0]
    def marked(*args, **kwargs):
        calls[0] += 1
        if calls[0] != AT:
            return original(*args, **kwargs)
        if _delay is None:  # at once when the call returns, before its caller goes on
            value = original(*args, **kwargs)
            _send()
            time.sleep(2)  # where the signal is handled
            return value
        threading.Timer(_delay, _send).start()
        return original(*args, **kwargs)
    setattr(owner, name, marked)
_module, _, _path = OWNER.partition(":")
_owner = importlib.import_module(_module)
for _part in _path.split(".")[:-1]:
    _owner = getattr(_owner, _part)
_arm(_owner, _path.split(".")[-1])
"""


@dataclass
class Stopped:
    code: int
    stdout: str
    stderr: str
    seconds: float | None  # from the signal to the exit (None: it was never sent)
    left: list[int]  # processes of its group still running 20 s after it exited (killed since)


def send_during(owner: str, sig: int, mark: Path, at: int = 1, delay: float | None = 0.2,
                target: str = "self") -> str:
    """The patch: `owner` is `module:function` or `module:Class.method`; the signal goes `delay` s after the
    `at`-th call starts (None: as it returns)."""
    values = {"OWNER": repr(owner), "SIG": int(sig), "MARK": repr(str(mark)), "AT": at, "DELAY": delay,
              "TARGET": repr(target)}
    code = SEND_DURING
    for name, value in values.items():
        code = code.replace(name, str(value))
    return code


STACKS = "import faulthandler, signal; faulthandler.register(signal.SIGUSR1, all_threads=True)\n"


def run_signalled(argv: list[str], patch: str, mark: Path, *, limit: float = 240, before: float = 900,
                  script: Path | None = None, env: dict[str, str] | None = None, cwd: Path | None = None) -> Stopped:
    """`ootd ARGV` (or `script ARGV`) with `patch` run first, in a session of its own; waits at most `before` s
    for the signal to be sent, then at most `limit` s from the signal to the exit."""
    runner = (f"import runpy, sys; sys.argv = [{str(script)!r}, *sys.argv[1:]]; runpy.run_path({str(script)!r}, "
              "run_name='__main__')" if script is not None else "import sys; from ootd.cli import main; "
              "sys.exit(main(sys.argv[1:]))")
    environment = {**os.environ, "PYTHONPATH": str(REPO), "RAY_memory_monitor_refresh_ms": "0", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-c", f"{STACKS}{patch}\n{runner}", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=environment,
                            cwd=cwd or REPO, start_new_session=True)
    started = time.monotonic()
    while True:
        try:
            out, err = proc.communicate(timeout=1.0)  # retried: no output is lost
            break
        except subprocess.TimeoutExpired:
            sent = _sent(mark)
            if sent is None and time.monotonic() - started > before:
                _fail(proc, f"the signal was never sent: its moment was not reached within {before:.0f} s")
            if sent is not None and time.time() - sent > limit:
                _fail(proc, f"still running {limit:.0f} s after the signal")
    ended = time.time()
    sent = _sent(mark)
    return Stopped(proc.returncode, out, err, ended - sent if sent is not None else None, _left(proc.pid))


def _sent(mark: Path) -> float | None:
    try:
        return float(mark.read_text())
    except (OSError, ValueError):  # not yet written (or being written)
        return None


def _fail(proc: subprocess.Popen, why: str) -> None:
    """Every thread's stack of the process to its stderr, then its group killed and the failure raised."""
    with contextlib.suppress(OSError):
        os.kill(proc.pid, signal.SIGUSR1)
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGKILL)
    _, err = proc.communicate()
    raise AssertionError(f"{why}; its stderr ends: {err[-6000:]}") from None


def _left(group: int, wait: float = 20.0) -> list[int]:
    deadline = time.monotonic() + wait
    while True:
        found = subprocess.run(["pgrep", "-g", str(group)], capture_output=True, text=True).stdout.split()
        if not found or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if found:
        os.killpg(group, signal.SIGKILL)
    return [int(pid) for pid in found]


def left_in_group(group: int, wait: float = 20.0) -> list[int]:
    """The processes of process group `group` still running `wait` s on (killed since): for a test that starts
    its own process (in a session of its own) and signals it by hand."""
    return _left(group, wait)
