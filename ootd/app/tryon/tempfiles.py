"""Stale temporary files of our own naming: what a kill -9 (or a power cut) during a write leaves behind.

`ootd.imaging.atomic.write_atomic` writes each file to a hidden `.NAME.<12 hex>.tmp` next to it and holds an
exclusive lock (flock) on it until it is renamed, so a temporary file is stale exactly when nobody holds its
lock, whatever its age: a rerun right after a kill removes what the kill left. The next run in that folder
removes stale ones: only names of our own pattern (`TEMP_FILE_NAME`), only regular files, only when their lock
can be taken (the writer is gone), and unlinked while that lock is held. A writer that created its file but had
not locked it yet when a cleaner took it finds its file unlinked once it gets the lock and starts again under a
new name (`write_atomic`), so no live write is lost. Another process writing in the same folder (another shard)
keeps its files.

Without locks (Windows) age is the only sign a writer is gone: files younger than `UNLOCKED_MIN_AGE_S` stay.

A run sweeps its own too, as it goes: a writer in another process that died (a Ray worker killed while it wrote a
picture) cleans nothing, so the process that hands out the work (the batch's driver, the server) removes the stale
temporary files of a pair once the pair is settled (`Sweeper`: one listing of the folder for every pair settled
since the last, at most one per `SWEEP_EVERY_S`, the rest when the run ends), and the batch sweeps its folder when it
ends.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Collection, Iterable
from pathlib import Path

from ootd.imaging.atomic import TEMP_FILE_NAME

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no locks, so age alone decides
    fcntl = None

logger = logging.getLogger(__name__)

UNLOCKED_MIN_AGE_S = 60.0  # without locks: a file this young may still be written
SWEEP_EVERY_S = 30.0  # a run's sweeps of a folder during the run: at most one listing per this many seconds


def _remove_if_stale(path: Path, now: float) -> bool:
    """Unlink `path` when it is a regular file of ours whose lock is free (its writer is gone); the lock is
    held while unlinking, so no writer can take the file over in between. True when it was removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:  # gone already (renamed by its writer), or not ours to open
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        if fcntl is None:
            if now - os.fstat(fd).st_mtime < UNLOCKED_MIN_AGE_S:
                return False
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a live process is writing it
                return False
            if os.fstat(fd).st_nlink == 0:  # removed by another cleaner meanwhile
                return False
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            logger.warning("could not remove the stale temporary file %s: %s", path, exc)
            return False
        return True
    finally:
        os.close(fd)


def clean_stale_temps(folder: str | Path, targets: Collection[str] | None = None) -> list[Path]:
    """Remove our stale temporary files from `folder` (not recursive); with `targets` (file names), only those of
    these files. Returns what was removed.

    Never fails a run: a file that cannot be checked or removed is left alone (and logged).
    """
    folder = Path(folder)
    try:
        names = [entry.name for entry in os.scandir(folder) if TEMP_FILE_NAME.match(entry.name)
                 and (targets is None or _target_of(entry.name) in targets)]
    except OSError:
        return []
    now = time.time()
    removed = [folder / name for name in names if _remove_if_stale(folder / name, now)]
    if removed:
        logger.info("removed %d stale temporary file(s) left by an interrupted run in %s", len(removed), folder)
    return removed


def _target_of(temp_name: str) -> str:
    """The file a temporary file of ours was to become (`.NAME.<12 hex>.tmp` -> NAME)."""
    return temp_name[1:].rsplit(".", 2)[0]


class Sweeper:
    """A run's sweeps of the temporary files its dead writers left (module docstring): `settled(paths)` once a
    pair whose writer died is settled, `finish()` when the run ends."""

    def __init__(self, every: float = SWEEP_EVERY_S) -> None:
        self.every = every
        self.pending: dict[Path, set[str]] = {}  # folder -> the names whose temporary files are to go
        self.last = -float("inf")
        self.removed: list[Path] = []

    def settled(self, paths: Iterable[Path]) -> None:
        for path in paths:
            self.pending.setdefault(Path(path).parent, set()).add(Path(path).name)
        if time.monotonic() - self.last >= self.every:
            self.finish()

    def finish(self) -> list[Path]:
        """Sweep every folder with pending names now; returns what this sweeper removed in all."""
        pending, self.pending = self.pending, {}
        for folder, names in pending.items():
            self.removed += clean_stale_temps(folder, names)
        self.last = time.monotonic()
        return self.removed
