"""The image files of a folder, as batch folder mode and `ootd classify` read them, and the entries named like
images that cannot be read as files (reported, never silently left out)."""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

from ootd.errors import UsageError, printable

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".avif", ".bmp", ".tif", ".tiff", ".gif", ".ppm")


def list_images(folder: str | Path, what: str, output: str | Path | None = None) -> list[Path]:
    """Image files in a folder (not recursive, hidden files skipped: temporary files are hidden), sorted by
    name; an entry named like an image that is not a file is a warning. When `folder` is the run's `output`
    folder, the pictures ootd wrote there are not inputs."""
    files, unreadable = scan_images(folder, what, output)
    for path, problem in unreadable:  # a batch cannot dress a FIFO, but says it left one out
        logger.warning("%s folder: %s is %s; left out", what, path, problem)
    if not files:
        raise _no_images(folder, what)
    return files


def _no_images(folder: str | Path, what: str) -> UsageError:
    return UsageError(f"{what} folder {printable(folder)} holds no images ({', '.join(IMAGE_EXTENSIONS)})")


def scan_images(folder: str | Path, what: str, output: str | Path | None = None,
                ) -> tuple[list[Path], list[tuple[Path, str]]]:
    """`list_images`'s files, and the entries named like images that cannot be read as files (a symbolic link
    loop or to nothing, a FIFO, a folder, a device), each with what it is, both sorted by name; a UsageError
    when the folder holds neither."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"{what} folder {printable(folder)}: {'is not a folder' if folder.exists() else 'not found'}")
    files, unreadable = [], []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or entry.suffix.lower() not in IMAGE_EXTENSIONS:
            continue
        problem = _not_a_file(entry)
        if problem is None:
            files.append(entry)
        else:
            unreadable.append((entry, problem))
    if output is not None and Path(output).is_dir() and Path(output).samefile(folder):
        from ootd.app.tryon.safety import is_our_png

        files = [p for p in files if not is_our_png(p)]
    if not files and not unreadable:
        raise _no_images(folder, what)
    return files, unreadable


def _not_a_file(path: Path) -> str | None:
    """What keeps `path` from being read as an image file (None: it is a file)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop, not an image file"
        if exc.errno == errno.ENOENT:
            return "a symbolic link to nothing (its target is missing)"
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device")
    return f"{kind}, not an image file"
