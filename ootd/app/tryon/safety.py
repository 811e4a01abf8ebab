"""Never lose a file: an output that would replace an input, or a file that is not ours, is refused before any
work.

Ours: a PNG carrying ootd's record (ootd/app/tryon/provenance.py: every output and intermediate has it), or a
file another part of ootd vouches for (a batch report, through `Other`). An output path that names an input of
the same run (the pairs CSV, a person, garment or mask photo, also through another name: a hard or symbolic
link) is refused even with --overwrite; an existing file at an output path that is not ours is refused unless
--overwrite.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from ootd.app.tryon.provenance import is_our_png
from ootd.errors import UsageError, printable


@dataclass(frozen=True)
class Other:
    """An output that is not a picture: what it is, and how to tell that an existing file is ours (None: it is
    rewritten whatever it holds, and only checked against the inputs, like a batch's index.html)."""

    path: Path
    what: str  # "report", "page"
    is_ours: Callable[[Path], bool] | None = None
    kind: str = "an ootd file"  # how the message names a file of ours


def _identity(path: Path) -> tuple[object, ...]:
    """What makes two paths the same file: device and inode when it exists, else the absolute path."""
    try:
        info = os.stat(path)
    except OSError:
        return ("path", os.path.abspath(path))
    return ("inode", info.st_dev, info.st_ino)


class _Sources:
    """The inputs by identity, held as the identity's hash -> the input's Path (an int and the caller's own Path,
    not a tuple, a string and a copy of the Path an input: ~400 bytes, 400 MB for a batch of 10^6 distinct
    inputs); a hash that matches is confirmed."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self.by_hash: dict[int, Path | list[Path]] = {}
        for path in paths:
            key = hash(_identity(path))
            held = self.by_hash.setdefault(key, path)
            if held is not path:
                self.by_hash[key] = [*held, path] if isinstance(held, list) else [held, path]

    def get(self, identity: tuple[object, ...]) -> Path | None:
        held = self.by_hash.get(hash(identity))
        candidates = held if isinstance(held, list) else [held] if held is not None else []
        return next((path for path in candidates if _identity(path) == identity), None)


def check_outputs(images: Iterable[Path], inputs: Iterable[Path | None], *, overwrite: bool = False,
                  others: Iterable[Other] = ()) -> None:
    """Refuse (UsageError, before any work) an output path that is an input, or an existing file that is not
    ours (without `overwrite`). `images`: every PNG the run may write; `others`: its other files."""
    sources = _Sources(p if isinstance(p, Path) else Path(p) for p in inputs if p is not None)  # not copied
    outputs = chain((Other(Path(p), "output", is_our_png, "an ootd picture") for p in images), others)  # one at a time
    for out in outputs:
        source = sources.get(_identity(out.path))
        if source is not None:
            raise UsageError.about("output", "the {what} {path} would replace the input {source}; choose another "
                                   "{@output}" + (" or {@report}" if out.what == "report" else ""), what=out.what,
                                   path=printable(out.path), source=printable(source))
        if out.is_ours is None or overwrite or not os.path.lexists(out.path):
            continue
        if out.path.is_dir():
            raise UsageError(f"the {out.what} {printable(out.path)} is a folder")
        if not out.is_ours(out.path):
            raise UsageError.about("overwrite", "{path} exists and is not {kind}; it would be replaced: move it away, "
                                   "choose another {@output}, or pass {@overwrite}", path=printable(out.path),
                                   kind=out.kind)
