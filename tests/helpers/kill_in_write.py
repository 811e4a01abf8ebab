"""A Ray worker killed (SIGKILL) inside its write of a picture, for tests/app/batch/test_ray_sweep.py: `arm` is the
workers' setup hook (Ray's runtime_env `worker_process_setup_hook`); in a worker whose environment names a marker
file (KILL_IN_WRITE), the first picture of a person named `KILL_PERSON` it writes is cut off half-way - half its data
in the temporary file, flushed to disk - and the process kills itself, leaving that file as a kill -9 does. The
marker file, made just before, keeps the retried attempt (in a new worker) from dying too."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.helpers.handles import FailingHandle

KILL_IN_WRITE = "OOTD_TEST_KILL_IN_WRITE"  # the marker file's path
KILL_PERSON = "OOTD_TEST_KILL_PERSON"  # the start of the picture's name whose write is cut off


def arm() -> None:
    marker = os.environ.get(KILL_IN_WRITE)
    if not marker:
        return
    from ootd.imaging import atomic

    prefix = "." + os.environ.get(KILL_PERSON, "")
    real = os.fdopen

    def fdopen(fd: int, *args: object, **kwargs: object):  # noqa: ANN202
        handle = real(fd, *args, **kwargs)
        try:
            name = Path(os.readlink(f"/proc/self/fd/{fd}")).name
        except OSError:
            return handle
        if atomic.TEMP_FILE_NAME.match(name) and name.startswith(prefix) and not Path(marker).exists():
            return _Dying(handle, Path(marker))
        return handle

    atomic.os.fdopen = fdopen


class _Dying(FailingHandle):
    def __init__(self, handle, marker: Path) -> None:  # noqa: ANN001
        super().__init__(handle)
        self._marker = marker

    def write(self, data) -> int:  # noqa: ANN001
        self._handle.write(bytes(data)[: len(data) // 2])
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)
        return 0
