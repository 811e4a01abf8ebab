"""Stale temporary files of our own naming: what a kill -9 (or a power cut) during a write leaves behind.

`ootd.imaging.files.save_png_atomic` writes each PNG to a hidden `.NAME.png.<12 hex>.tmp` next to it and holds an
exclusive lock (flock) on it until it is renamed, so a temporary file is stale exactly when nobody holds its
lock. The next run in that folder removes stale ones: only names of our own pattern (`TEMP_FILE_NAME`), only
regular files, only when their lock can be taken (the writer is gone) and they are older than `MIN_AGE_S` (which
covers the instant between a writer creating the file and locking it). Another process writing in the same
folder (another shard) keeps its files.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path

from ootd.imaging.files import TEMP_FILE_NAME

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no locks, so age alone decides
    fcntl = None

logger = logging.getLogger(__name__)

MIN_AGE_S = 10.0  # a temporary file younger than this may be one whose writer has not locked it yet


def _stale(path: Path, now: float, min_age_s: float) -> bool:
    """True when `path` is a regular file of ours, old enough, and its lock is free (its writer is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:  # gone already (renamed by its writer), or not ours to open
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or now - info.st_mtime < min_age_s:
            return False
        if fcntl is None:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live process is writing it
            return False
        return True
    finally:
        os.close(fd)


def clean_stale_temps(folder: str | Path, min_age_s: float = MIN_AGE_S) -> list[Path]:
    """Remove our stale temporary files from `folder` (not recursive); returns what was removed.

    Never fails a run: a file that cannot be checked or removed is left alone (and logged).
    """
    folder = Path(folder)
    try:
        names = [entry.name for entry in os.scandir(folder) if TEMP_FILE_NAME.match(entry.name)]
    except OSError:
        return []
    removed = []
    now = time.time()
    for name in names:
        path = folder / name
        if not _stale(path, now, min_age_s):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            logger.warning("could not remove the stale temporary file %s: %s", path, exc)
            continue
        removed.append(path)
    if removed:
        logger.info("removed %d stale temporary file(s) left by an interrupted run in %s", len(removed), folder)
    return removed
