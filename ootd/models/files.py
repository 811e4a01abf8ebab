"""The state of the files a load read, known without reading them, and a failed load remembered against it.

The owner remembers a load that failed, so that a server does not read (and, for a few-step adapter, hash) a
large damaged file again on every request and gives every request the same error; a user who then repairs or
replaces the file expects the next request to load it, without a restart. `files_state` is what tells the two
apart: one `stat` per file, never its contents (its size, modification and change times in nanoseconds and its
inode: a file copied over in place, or another moved onto its name, changes at least one of them), and for a
folder the same of everything in it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ootd.errors import OotdError

FileStat = tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, inode
FilesState = tuple[tuple[str, FileStat | None], ...]  # each path (folders: and all in them), None where absent

_DEPTH = 4  # a component folder is flat; a download's own bookkeeping (.cache/huggingface/download/) is below


def files_state(paths: Iterable[Path]) -> FilesState:
    """The state of `paths` (files or folders, present or not), for comparing with a later one."""
    found: list[tuple[str, FileStat | None]] = []
    for path in paths:
        _add(str(path), found, _DEPTH)
    return tuple(found)


def _add(path: str, found: list[tuple[str, FileStat | None]], depth: int) -> None:
    try:
        st = os.stat(path)
    except OSError:  # absent or unreadable: that is its state (a file put there later is a change)
        found.append((path, None))
        return
    found.append((path, (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)))
    if not stat.S_ISDIR(st.st_mode) or depth == 0:
        return
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return
    for name in names:
        _add(os.path.join(path, name), found, depth - 1)


@dataclass(frozen=True)
class Failure:
    """A load's error, with the files it read and their state when it began (a repair made while it ran is a
    change): it stands while that state is unchanged. A load that read no files (models handed in by a source)
    stands for the owner's life."""

    error: OotdError
    paths: tuple[Path, ...]
    state: FilesState

    def stands(self) -> bool:
        """Whether the files are as they were when the load that failed began."""
        return files_state(self.paths) == self.state
