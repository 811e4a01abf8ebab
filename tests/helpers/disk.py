"""A disk that fills up, both ways a test can have one:

- `small_filesystem`: a real one, a tmpfs of a few MB mounted where the test says (as root, where mounting is
  allowed: this machine and CI's; else the test is skipped, saying why), with `fill_leaving` to leave exactly so
  many bytes free and `free_up` to give the space back;
- `disk_fills_at(n)`: an injected one, the n-th write of ootd's (every file goes through ootd/imaging/atomic.py:
  `write_atomic`, or `append_line` for a log's line) failing with ENOSPC part-way through its data, as a full
  device fails a write; with n None it only counts them, so a test can fail each one in turn.

`leftovers` lists what a failed write must never leave: our temporary files and hidden temporary folders.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ootd.imaging import atomic
from tests.helpers.handles import FailingHandle

FILLER = ".filler"  # the file `fill_leaving` writes (hidden: a folder listing of images skips it)
PAGE = 4096


@contextmanager
def small_filesystem(path: Path, size: str = "16m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (created), unmounted afterwards; skipped where it cannot be mounted."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root (the injected full-disk tests cover the same writes)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode}); the injected "
                    "full-disk tests cover the same writes")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def fill_leaving(path: Path, free: int) -> None:
    """Fill the filesystem of `path` until `free` bytes are left (to the page): a filler file in `path`."""
    filler = path / FILLER
    filler.unlink(missing_ok=True)
    size = free_bytes(path) - free
    assert size >= 0, f"only {free_bytes(path)} bytes free, asked to leave {free}"
    with open(filler, "wb") as handle:
        chunk = b"\0" * (1 << 20)
        while size > 0:
            handle.write(chunk[: min(size, len(chunk))])
            size -= len(chunk)
    assert abs(free_bytes(path) - free) <= PAGE, (free_bytes(path), free)


def free_up(path: Path) -> None:
    (path / FILLER).unlink(missing_ok=True)


@dataclass
class Writes:
    """The files written through `write_atomic` while counting, in order; `failed`: the one made to fail."""

    paths: list[Path] = field(default_factory=list)
    failed: Path | None = None


@contextmanager
def disk_fills_at(n: int | None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Writes]:
    """Count every file written through `write_atomic` and every line added by `append_line` (a log); the `n`-th
    (from 0; None: none) fails with ENOSPC after half of its first block of data is written, as on a device that
    fills up during that write."""
    log = Writes()
    real_fdopen = os.fdopen

    def counted(path: Path, handle):  # noqa: ANN001, ANN202
        log.paths.append(path)
        if n is None or len(log.paths) - 1 != n:
            return handle
        log.failed = path
        return _Filling(handle)

    def fdopen(fd: int, *args: object, **kwargs: object):  # noqa: ANN202
        handle = real_fdopen(fd, *args, **kwargs)
        try:
            target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return handle
        if not atomic.TEMP_FILE_NAME.match(target.name):
            return handle
        return counted(target.parent / re.sub(r"^\.(.+)\.[0-9a-f]{12}\.tmp$", r"\1", target.name), handle)

    def appending(path: str | Path, mode: str = "r", *args: object, **kwargs: object):  # noqa: ANN202
        handle = open(path, mode, *args, **kwargs)  # noqa: SIM115 - the caller closes it
        return counted(Path(path), handle) if "a" in mode else handle

    monkeypatch.setattr(atomic.os, "fdopen", fdopen)
    monkeypatch.setattr(atomic, "open", appending, raising=False)
    try:
        yield log
    finally:
        monkeypatch.setattr(atomic.os, "fdopen", real_fdopen)
        monkeypatch.delattr(atomic, "open", raising=False)


class _Filling(FailingHandle):
    """A file whose device is full: the first write lands half its data, then ENOSPC."""

    def write(self, data) -> int:  # noqa: ANN001
        part = data[: len(data) // 2] if isinstance(data, str | bytes) else memoryview(data).cast("B")[
            : len(memoryview(data).cast("B")) // 2]
        self._handle.write(part)
        self._handle.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def leftovers(root: Path) -> list[Path]:
    """Our temporary files and hidden temporary folders under `root` (what a failed write must not leave)."""
    return [p for p in root.rglob(".*") if p.name != FILLER and (atomic.TEMP_FILE_NAME.match(p.name)
                                                                   or p.name.endswith(".tmp"))]
