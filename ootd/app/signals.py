"""SIGTERM handled like Ctrl-C, and a full stdout reported like any full device.

A SIGTERM (a service manager stopping ootd, `kill PID`, a cluster's preemption) raises `Terminated` in the main
thread, a KeyboardInterrupt, so every `finally` runs as for Ctrl-C: a PNG being written is removed with its
temporary file, the report keeps its whole lines and is closed; the exit code is 128 + 15 = 143. What a start
that a signal cut short had already started (Ray's processes) is stopped with it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ootd.errors import NoSpaceError, no_space

EXIT_TERMINATED = 128 + signal.SIGTERM
STOP_WAIT_S = 2.0  # how long the processes of a failed start get after SIGTERM, before SIGKILL (Ray gives 1 s)


class Terminated(KeyboardInterrupt):
    """Raised by the SIGTERM handler; exits 143."""

    exit_code = EXIT_TERMINATED
    message = "terminated"


# set by the handler: a library may re-raise `Terminated` as a plain KeyboardInterrupt; counted, so that one raised
# where Python only reports it (a destructor, a fork's hook) is still seen
_received = {"sigterm": False, "count": 0}


def _raise_terminated(signum: int, frame: object) -> None:
    _received["sigterm"] = True
    _received["count"] += 1
    raise Terminated()


def sigterm_received() -> bool:
    """Whether SIGTERM reached this process's handler: a failure that follows may be its doing (a signal sent to
    the process group stops Ray's processes too, and Ray may report that before the driver's stop)."""
    return _received["sigterm"]


def as_terminated(exc: KeyboardInterrupt) -> KeyboardInterrupt:
    """`exc`, or `Terminated` where SIGTERM caused it (Ray turns an exception raised by a signal handler during
    ray.wait into a plain KeyboardInterrupt)."""
    return Terminated() if _received["sigterm"] and not isinstance(exc, Terminated) else exc


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` (main thread only: elsewhere signals cannot be handled)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received["sigterm"] = False
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def sigterm_kept() -> Iterator[None]:
    """Whatever handles SIGTERM before stays after: `ray.init` installs its own (`sys.exit(15)`: no cleanup, a
    batch's page left saying "running", exit 15 instead of 143). A SIGTERM that Ray's handler caught meanwhile
    comes out of here as `Terminated`, when the handler before was ours. A Ctrl-C or SIGTERM whose exception was
    raised where Python only reports it (`ray.init` forks, and logging's fork hook may be what runs when the
    signal comes) comes out at the end, instead of being lost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous, interrupt = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    interrupted, terminated, reporting = [], _received["count"], sys.unraisablehook
    if callable(interrupt):
        def _noted(signum: int, frame: Any) -> None:
            interrupted.append(signum)
            interrupt(signum, frame)

        signal.signal(signal.SIGINT, _noted)

    def _unreported(unraisable: Any) -> None:  # raised again below: a report would be a traceback on the terminal
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            reporting(unraisable)

    sys.unraisablehook = _unreported
    try:
        yield
    except SystemExit as exc:
        if exc.code != signal.SIGTERM or previous is not _raise_terminated:
            raise
        _received["sigterm"] = True
        raise Terminated() from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if callable(interrupt):
            signal.signal(signal.SIGINT, interrupt)
        sys.unraisablehook = reporting
    if _received["count"] != terminated:
        raise Terminated()
    if interrupted:
        raise KeyboardInterrupt()


@contextmanager
def children_stopped_on_failure() -> Iterator[None]:
    """When it fails or is interrupted, the processes started inside (and theirs) that are still running once
    the code inside has cleaned up are stopped: a signal inside `ray.init` while it starts a private instance
    leaves a node that is not yet Ray's, so `ray.shutdown` cannot stop it, and a raylet killed that young leaves
    its agents running once this process is gone. SIGTERM to each, SIGKILL to those still running STOP_WAIT_S
    later. Linux (/proc); elsewhere nothing is stopped."""
    before = set(_descendants())
    try:
        yield
    except BaseException:
        _stop(set(_descendants()) - before)
        raise


def descendants() -> set[int]:
    """The processes running below this one now (a private Ray instance's, its workers among them)."""
    return set(_descendants())


def wait_ended(pids: set[int], timeout: float = 2 * STOP_WAIT_S) -> set[int]:
    """Wait until `pids` have ended (what they held, a lock or an open folder, is then free), at most `timeout`
    seconds; returns those still running."""
    deadline = time.monotonic() + timeout
    while (pids := {pid for pid in pids if _running(pid)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pids


def _descendants() -> list[int]:
    """The running processes below this one (their parents as /proc has them now)."""
    try:
        pids = [int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()]
    except OSError:
        return []
    children: dict[int, list[int]] = {}
    for pid in pids:
        state = _state(pid)
        if state is not None and state[0] not in "ZX":
            children.setdefault(state[1], []).append(pid)
    found, todo = [], [os.getpid()]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent's pid) of a process; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()  # the name before it may hold anything
    except OSError:
        return None
    return fields[0], int(fields[1])


def _running(pid: int) -> bool:
    state = _state(pid)
    return state is not None and state[0] not in "ZX"


def _stop(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    while (pids := {pid for pid in pids if _running(pid)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


RAY_CRASH_HANDLER = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"


def ray_for_a_driver() -> Any:
    """Ray, imported for a process that drives it and keeps its own SIGTERM handling (`ootd batch --engine ray`,
    `ootd serve --engine ray`).

    `ray.init` installs Ray's C++ crash handler for SIGTERM too, under the handler Python reports: a SIGTERM while
    ray.init runs would abort this process with a stack dump, and no cleanup. Ray's switch for it
    (RAY_DISABLE_FAILURE_SIGNAL_HANDLER, read when Ray is first imported) is set for that import only, so the
    processes Ray starts keep their crash reports. Imported earlier by someone else: Ray as it is."""
    if "ray" not in sys.modules:
        saved = os.environ.get(RAY_CRASH_HANDLER)
        os.environ[RAY_CRASH_HANDLER] = "1"
        try:
            import ray  # noqa: F401 - its constants are read now
        finally:
            if saved is None:
                os.environ.pop(RAY_CRASH_HANDLER, None)
            else:
                os.environ[RAY_CRASH_HANDLER] = saved
    import ray

    return ray


def stream_path(stream: object) -> str:
    """Where a standard stream goes (a file's path on Linux), for messages."""
    name = getattr(stream, "name", "<stream>")
    try:
        return os.readlink(f"/proc/self/fd/{stream.fileno()}")  # type: ignore[attr-defined]
    except (OSError, AttributeError, ValueError):
        return str(name)


def flush_stdout() -> None:
    """Flush stdout now, so a full device is reported as one line instead of failing at interpreter exit.

    On failure what cannot be written is dropped (stdout is pointed at the null device), so Python's own final
    flush does not fail again, and a NoSpaceError (or the OSError) is raised.
    """
    stream = sys.stdout
    try:
        stream.flush()
    except OSError as exc:
        path = stream_path(stream)
        _drop_stdout(stream)
        if exc.errno == errno.ENOSPC:
            raise no_space(path) from None
        raise


def _drop_stdout(stream: object) -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())  # type: ignore[attr-defined]
        os.close(devnull)
    except (OSError, AttributeError, ValueError):  # not a real file (tests capture it): nothing to drop
        pass


def as_no_space(exc: OSError) -> NoSpaceError | None:
    """The one-line error for an OSError that is a full device (ENOSPC, or EDQUOT: a full quota)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return no_space(exc.filename if exc.filename is not None else stream_path(sys.stdout))
    return None
