"""SIGTERM as an interrupt that keeps its exit code, even where a library re-raises it as a plain one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ootd.app.signals import Terminated, as_terminated, children_stopped_on_failure, sigterm_as_interrupt, sigterm_kept


def test_a_sigterm_re_raised_as_a_plain_interrupt_is_still_terminated() -> None:
    with pytest.raises(Terminated), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
    assert isinstance(as_terminated(KeyboardInterrupt()), Terminated)  # what Ray's ray.wait raises instead


def test_ctrl_c_stays_ctrl_c_in_the_next_command() -> None:
    with pytest.raises(Terminated), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
    with sigterm_as_interrupt():  # a new command: what happened before is forgotten
        plain = KeyboardInterrupt()
        assert as_terminated(plain) is plain


def test_a_library_replacing_the_handler_does_not_keep_it() -> None:
    with sigterm_as_interrupt():
        ours = signal.getsignal(signal.SIGTERM)
        with sigterm_kept():
            signal.signal(signal.SIGTERM, lambda *_: None)  # as ray.init does
        assert signal.getsignal(signal.SIGTERM) is ours


def test_a_sigterm_caught_by_a_library_handler_that_exits_is_still_terminated() -> None:
    """Ray's handler, installed by ray.init, exits with 15 at once; under ours it is `Terminated` (exit 143)."""
    with pytest.raises(Terminated), sigterm_as_interrupt(), sigterm_kept():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # as ray.init does
        os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(SystemExit), sigterm_kept():  # without ours: the library's exit stays its own
        raise SystemExit(signal.SIGTERM)
    with pytest.raises(SystemExit), sigterm_as_interrupt(), sigterm_kept():  # another exit code: not a signal
        raise SystemExit(2)


class _SignalledWhenDropped:
    """Sends a signal from its destructor: what the signal raises there Python only reports, as in logging's fork
    hook, which may be what runs when a signal comes during ray.init."""

    def __init__(self, sig: int) -> None:
        self.sig = sig

    def __del__(self) -> None:
        os.kill(os.getpid(), self.sig)


class _Failing:
    def __del__(self) -> None:
        raise ValueError("reported as before")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_whose_exception_python_only_reported_still_stops_the_start(monkeypatch: pytest.MonkeyPatch,
                                                                             sig: int) -> None:
    """... and is not reported there (a traceback on the terminal); other such reports still are."""
    reported: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(unraisable.exc_value))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(Terminated if sig == signal.SIGTERM else KeyboardInterrupt), sigterm_as_interrupt():
            with sigterm_kept():
                _SignalledWhenDropped(sig)  # dropped at once: the exception goes to sys.unraisablehook
                reached_the_end = True
        assert reached_the_end
        assert reported == [] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with sigterm_kept():
            _Failing()
        assert [type(exc) for exc in reported] == [ValueError]
    finally:
        signal.signal(signal.SIGINT, previous)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in "ZX"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="processes are found through /proc")
def test_what_an_interrupted_start_started_is_stopped_with_its_children_and_nothing_else() -> None:
    """As ray.init cut short while it starts Ray's processes: they and their own children (a raylet's agents)
    are stopped; a process started before stays."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    before = subprocess.Popen(sleeper)
    try:
        with pytest.raises(KeyboardInterrupt), children_stopped_on_failure():
            started = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; child = subprocess.Popen("
                                        f"{sleeper!r}); print(child.pid, flush=True); child.wait()"],
                                       stdout=subprocess.PIPE, text=True)
            grandchild = int(started.stdout.readline())
            raise KeyboardInterrupt
        assert started.wait(timeout=10) is not None
        deadline = time.monotonic() + 10
        while _running(grandchild) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(grandchild)
        assert before.poll() is None
    finally:
        before.kill()
        before.wait()


def test_a_ray_failure_after_sigterm_is_the_stop_not_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM to the process group reaches Ray's processes too; when Ray reports their end before the driver's
    own stop surfaces, the batch is still stopped by the signal (exit 143), not failed (exit 1)."""
    from ootd.app import signals
    from ootd.app.batch.ray_engine import _stopped_by_sigterm

    monkeypatch.setitem(signals._received, "sigterm", False)
    _stopped_by_sigterm()  # no signal: the failure is the cluster's, reported as such by the caller
    monkeypatch.setitem(signals._received, "sigterm", True)
    with pytest.raises(signals.Terminated):
        _stopped_by_sigterm()
