"""The server's temporary folder: one `ootd-serve-XXXX` per process, locked while it lives, and the folders of
dead servers removed when the next one starts.

A server holds an exclusive lock (flock) on `ootd-serve-XXXX/.lock` for as long as it runs; the kernel drops it
when the process ends, however it ends (kill -9 included). So a folder is dead exactly when its lock can be
taken. The lock file is created under a temporary name, locked, then renamed into place: a `.lock` that exists
is locked or dead, never the unlocked file of a server still starting. A folder without a `.lock` is one whose
server died between making the folder and locking it (or an older server's); it is removed once it is older
than `UNLOCKED_AGE_S`. Only folders of our prefix that belong to this user are touched; a folder that cannot be
checked or removed is left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no locks, so no cleanup of other folders
    fcntl = None

logger = logging.getLogger(__name__)

PREFIX = "ootd-serve-"
LOCK = ".lock"
UNLOCKED_AGE_S = 60.0  # a folder without a lock file younger than this may belong to a server starting now


class Workspace:
    """This process's folder and the lock that says it is alive; `close` removes both."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=root))
        self._fd: int | None = None
        if fcntl is not None:
            self._fd = _locked(self.path)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _locked(folder: Path) -> int:
    """The lock file, locked before it gets its name (so no other server ever sees it unlocked)."""
    staging = folder / f"{LOCK}.new"
    fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(staging, folder / LOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _dead(folder: Path, now: float) -> bool:
    """True when `folder` is a server folder of this user whose server is gone."""
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    if not os.path.isdir(folder) or os.path.islink(folder) or info.st_uid != os.getuid():
        return False
    try:
        fd = os.open(folder / LOCK, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return now - info.st_mtime >= UNLOCKED_AGE_S
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # a live server holds it
        return False
    finally:
        os.close(fd)
    return True


def remove_dead(root: str | Path | None = None) -> list[Path]:
    """Remove the folders that dead servers left in `root` (the temporary folder); returns what was removed."""
    if fcntl is None:
        return []
    root = Path(root if root is not None else tempfile.gettempdir())
    try:
        names = [entry.name for entry in os.scandir(root) if entry.name.startswith(PREFIX)]
    except OSError:
        return []
    removed, now = [], time.time()
    for name in names:
        folder = root / name
        if not _dead(folder, now):
            continue
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            continue
        except OSError as exc:
            logger.warning("could not remove %s, left by a server that stopped: %s", folder, exc)
            continue
        removed.append(folder)
    if removed:
        logger.info("removed %d temporary folder(s) left by servers that were killed", len(removed))
    return removed
