"""Every file ootd writes, written atomically: complete under its name or not there at all, whatever stops the
writer (a crash, a kill, a full disk), and never replacing a file unless asked.

`write_atomic` is the one writer: the others (PNG with its text record, text, bytes) hand it what to write;
`append_line` adds one whole line to a log. A
hidden temporary file in the target's folder is locked while it is written, so a cleaner (ootd.app.tryon.tempfiles)
knows its writer is alive, then flushed and renamed into place. `check_output_dir` proves a folder writable before
slow work starts.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import BinaryIO

from PIL import Image, PngImagePlugin

from ootd.errors import OutputError, no_space, printable

try:  # a lock on a temporary file tells a cleaner that its writer is alive (POSIX)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

logger = logging.getLogger(__name__)

# Hidden files this module creates next to outputs: `.NAME.<12 hex>.tmp` while a file is written and
# `.ootd-write-test-<12 hex>` while a folder is probed. A kill can leave one behind (ootd.app.tryon.tempfiles).
TEMP_FILE_NAME = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$|^\.ootd-write-test-[0-9a-f]{12}$")


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def already_exists(path: Path) -> OutputError:
    """The refusal to replace a file (the `overwrite` setting would)."""
    return OutputError.about("overwrite", "{path} already exists; use {@overwrite} to replace it", path=path)


def check_output_dir(path: str | Path) -> Path:
    """Create the output folder if needed and prove it is writable, before any slow work starts."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"output folder {path} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create output folder {path}: {_one_line(exc.strerror or exc)}") from None
    probe = path / f".ootd-write-test-{secrets.token_hex(6)}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        with suppress(FileNotFoundError):  # another run's cleaner may have taken it: it was ours
            os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"output folder {path} is not writable: {_one_line(exc.strerror or exc)}") from None
    return path


def png_info(metadata: dict[str, str]) -> PngImagePlugin.PngInfo:
    info = PngImagePlugin.PngInfo()
    for key, value in metadata.items():
        key = str(key)
        if not 1 <= len(key) <= 79 or not key.isprintable():
            raise ValueError(f"PNG text keys must be 1-79 printable characters, got {key!r}")
        info.add_text(key, printable(value))  # Pillow switches to iTXt when the value is not Latin-1
    return info


def save_png_atomic(
    image: Image.Image, path: str | Path, metadata: dict[str, str] | None = None, overwrite: bool = False
) -> Path:
    """Write a PNG (with text metadata: settings, seed) so that `path` is either complete or absent; without
    `overwrite` an existing file is never replaced (also not one that appears while we write)."""
    pnginfo = png_info(metadata or {})
    return write_atomic(path, lambda handle: image.save(handle, format="PNG", pnginfo=pnginfo), overwrite)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """A text file (a batch's index.html) written complete or not at all, replacing what was there."""
    data = text.encode("utf-8", errors="backslashreplace")  # file names that are not UTF-8
    return write_atomic(path, lambda handle: handle.write(data), overwrite=True)


def write_bytes_atomic(path: str | Path, data: bytes, overwrite: bool = False) -> Path:
    """Bytes (a PNG made elsewhere, an upload) written complete or not at all."""
    return write_atomic(path, lambda handle: handle.write(data), overwrite)


def append_line(path: str | Path, line: str) -> Path:
    """`line` (one line, its newline included) added to the end of a log (a training run's loss.jsonl) in one
    write: whole or not at all - a write cut short (a full device) is cut off again, so the file keeps its whole
    lines; a full device is one NoSpaceError naming the file."""
    path = Path(path)
    data = line.encode("utf-8", errors="backslashreplace")
    size = None
    try:
        with open(path, "ab") as handle:
            size = handle.tell()
            handle.write(data)
    except OSError as exc:
        if size is not None:
            with suppress(OSError):
                os.truncate(path, size)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise no_space(path) from None
        raise OutputError(f"cannot write {path}: {_one_line(exc.strerror or exc)}") from None
    return path


def write_atomic(path: str | Path, write: Callable[[BinaryIO], object], overwrite: bool = False) -> Path:
    """The one atomic writer: `write(handle)` fills a hidden temporary file in the same folder (locked from
    just after it is made until it has its final name, so a cleaner knows its writer is alive), which is
    flushed to disk and renamed over `path` in one step; on any failure the temporary file is removed."""
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise OutputError(f"cannot write {path}: output folder {folder} does not exist or is not a folder")
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is a folder")
    if path.exists() and not overwrite:
        raise already_exists(path)
    tmp, fd = _locked_temp(path)
    try:
        with os.fdopen(fd, "wb") as handle:  # closing it (last) gives the lock up
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
            if overwrite:
                os.replace(tmp, path)
            else:
                _rename_no_clobber(tmp, path)
    except OutputError:
        _remove_quietly(tmp)
        raise
    except OSError as exc:
        _remove_quietly(tmp)
        if exc.errno == errno.ENOSPC:
            raise no_space(path) from None
        raise OutputError(f"cannot write {path}: {_one_line(exc.strerror or exc)}") from None
    except BaseException:
        _remove_quietly(tmp)
        raise
    logger.debug("saved %s", path)
    return path


def _locked_temp(path: Path, attempts: int = 5) -> tuple[Path, int]:
    """A new hidden temporary file next to `path`, open for writing and locked. A cleaner may take a file in
    the instant between its creation and its lock (it is then free, so it looks abandoned) and unlink it: the
    writer sees that once it holds the lock (no links left) and starts again under a new name."""
    folder = path.parent
    for _ in range(attempts):
        tmp = folder / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)  # the umask applies, as for any file
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise no_space(path) from None
            raise OutputError(f"cannot write to output folder {folder}: {_one_line(exc.strerror or exc)}") from None
        if fcntl is None:  # pragma: no cover - Windows: no locks (cleaners go by age there)
            return tmp, fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held until the file is closed (or its process dies)
            if os.fstat(fd).st_nlink > 0:
                return tmp, fd
        except BaseException:
            os.close(fd)
            _remove_quietly(tmp)
            raise
        os.close(fd)  # a cleaner removed it before the lock: try a new name
    raise OutputError(f"cannot write {path}: its temporary files kept being removed by another process")


def _rename_no_clobber(tmp: Path, path: Path) -> None:
    """Rename without replacing an existing file: a hard link fails if `path` exists; fall back to a check."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise already_exists(path) from None
    except OSError:  # file systems without hard links (FAT, some network mounts)
        if path.exists():
            raise already_exists(path) from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _remove_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("could not remove temporary file %s: %s", path, exc)
