"""Input images in, try-on images out: validation, normalisation and atomic saving (framing: ootd/imaging/framing.py).

Everything a user can get wrong about an image file becomes one `InputImageError` line naming the file, and
every output is written so that a crash or a full disk never leaves a half-written PNG behind.

Mask images (role "mask") load as mode "L", white = the region to repaint. A mask with a transparency channel
that actually carries information (some pixel not fully opaque) is read from that channel: painted (opaque)
pixels are the region, whatever their colour. This is how masks drawn in an editor on a transparent layer come
out; a mask without transparency (or with a fully opaque alpha) is read from its brightness.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import re
import secrets
import stat
import struct
import unicodedata
import warnings
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps, PngImagePlugin, UnidentifiedImageError

from ootd.errors import InputImageError, OutputError, no_space, printable

try:  # a lock on a temporary file tells a cleaner that its writer is alive (POSIX)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

logger = logging.getLogger(__name__)

MIN_SIDE = 64  # smaller than this cannot be a usable person or garment photo
MAX_PIXELS = 50_000_000  # checked from the header, before any decoding (a 50 MP RGB image is 150 MB)
ROLES = ("person", "garment", "mask")
ImageInput = Image.Image | str | Path  # what the pipeline and the loaders take for an image
# Hidden files this module creates next to outputs: `.NAME.<12 hex>.tmp` while a PNG is written and
# `.ootd-write-test-<12 hex>` while a folder is probed. A kill can leave one behind (ootd.app.tryon.tempfiles).
TEMP_FILE_NAME = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$|^\.ootd-write-test-[0-9a-f]{12}$")
# Formats tried when opening. Restricting them keeps Pillow from handing a file that merely claims to be,
# say, PostScript to an external interpreter (EPS goes through Ghostscript). JPEG covers MPO (phones).
FORMATS = ("PNG", "JPEG", "WEBP", "AVIF", "BMP", "TIFF", "GIF", "PPM")
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error, IndexError, TypeError)


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def load_image(path: str | Path, role: str) -> Image.Image:
    """Open, fully decode and normalise an input image (RGB for person/garment, L for masks).

    Fully decoding here (rather than lazily later) means a truncated file fails now, with the file's name,
    instead of deep inside preprocessing. Only regular files are opened: a FIFO, a device or a socket would
    block or never end. File names that are not valid UTF-8 work; messages show their odd bytes as backslash escapes.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    path = Path(path)

    def fail(problem: str) -> InputImageError:
        return InputImageError(f"{role} image {printable(path)}: {_one_line(problem)}")

    with open_image_file(path, fail) as im:
        try:
            return _normalise(im, role)
        except (OSError, ValueError) as exc:  # e.g. a mode Pillow cannot convert
            raise fail(f"unsupported image ({im.mode} mode): {exc}") from None


@contextmanager
def open_image_file(path: Path, fail: Callable[[str], InputImageError], min_side: int = MIN_SIDE
                    ) -> Iterator[Image.Image]:
    """An image file opened and fully decoded with every check `load_image` makes (a regular file, a known
    format, at most MAX_PIXELS from the header before any decoding, each side at least `min_side`), each
    problem one `fail(problem)` error; as Pillow gives it (no orientation or mode normalised)."""
    _require_regular_file(path, fail)
    with _decoded(path, fail, min_side) as im:
        yield im


def _require_regular_file(path: Path, fail: Callable[[str], InputImageError]) -> None:
    """Refuse, from the file's metadata alone, anything that cannot be read as a whole image file."""
    try:
        mode = path.stat().st_mode  # follows symbolic links: a link to a photo is fine
    except FileNotFoundError:
        raise fail("file not found") from None
    except PermissionError:
        raise fail("permission denied") from None
    except OSError as exc:  # e.g. a name too long, a loop of symbolic links
        raise fail(f"cannot read it ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        raise fail("is a directory, not an image file")
    if not stat.S_ISREG(mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise fail(f"is {kind}, not a regular file")


@contextmanager
def _decoded(path: Path | BinaryIO, fail: Callable[[str], InputImageError], min_side: int = MIN_SIDE
             ) -> Iterator[Image.Image]:
    """The open, fully decoded image; every way a file can be unreadable becomes one `fail` line."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(path, formats=_open_formats())
            try:
                _check_header_size(im, fail, min_side)
                im.load()
            except BaseException:
                im.close()
                raise
    except InputImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise fail(f"image too large to load safely ({exc})") from None
    except UnidentifiedImageError:
        raise fail(
            "not an image file (or not a supported format: PNG, JPEG, WebP, AVIF, BMP, TIFF, GIF, PPM)"
        ) from None
    except PermissionError:
        raise fail("permission denied") from None
    except MemoryError:
        raise fail("not enough memory to decode it") from None
    except _DECODE_ERRORS as exc:  # Pillow's plugins raise all of these on malformed data
        raise fail(f"corrupt or truncated image ({exc})") from None
    with im:
        yield im


def _open_formats() -> list[str]:
    """FORMATS this Pillow build can open (AVIF support depends on the build)."""
    Image.init()
    return [name for name in FORMATS if name in Image.OPEN]


def _check_header_size(im: Image.Image, fail: Callable[[str], InputImageError], min_side: int = MIN_SIDE) -> None:
    """Reject tiny and enormous images from the header alone, before any pixel is decoded."""
    width, height = im.size
    if width * height > MAX_PIXELS:
        raise fail(
            f"image too large: {width}x{height} = {width * height / 1e6:.0f} megapixels "
            f"(limit {MAX_PIXELS / 1e6:.0f}); downscale it first"
        )
    if min(width, height) < min_side:
        raise fail(f"image too small: {width}x{height} (each side must be at least {min_side} px)")


def _normalise(im: Image.Image, role: str) -> Image.Image:
    """Apply EXIF orientation and convert any mode to RGB (or L for masks); returns a detached copy."""
    try:
        oriented = ImageOps.exif_transpose(im)
    except Exception as exc:  # a malformed EXIF block should not reject an otherwise fine photo
        logger.warning("ignoring unreadable EXIF orientation: %s", _one_line(exc))
        oriented = im
    if oriented is None:  # older Pillow with in_place semantics
        oriented = im
    out = _to_mask(oriented) if role == "mask" else _to_rgb(oriented)
    if out is im:
        out = im.copy()
    out.info = {}  # drop source metadata (EXIF, ICC): the pixels are already normalised
    return out


def _has_alpha(im: Image.Image) -> bool:
    return im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info


def _high_bit_to_l(im: Image.Image) -> Image.Image:
    """16-bit (I;16*) and 32-bit int (I) grayscale to 8 bits by scaling, not clipping as `convert("L")` does.

    Pillow opens 8-bit grayscale as L, so an I/I;16 image holds values up to 65535 (16-bit PNG/TIFF).
    Float (F) images are assumed to be 0..1 when their maximum is at most 1, else 0..255.
    """
    arr = np.asarray(im)
    if im.mode == "F":
        arr = arr.astype(np.float64)
        scale = 255.0 if np.nanmax(arr, initial=0.0) <= 1.0 else 1.0
        out = np.clip(np.nan_to_num(arr) * scale, 0, 255)
    else:
        out = np.clip(arr.astype(np.float64), 0, 65535) / 257.0
    return Image.fromarray(np.round(out).astype(np.uint8), mode="L")


def _to_rgb(im: Image.Image) -> Image.Image:
    if im.mode == "RGB" and "transparency" not in im.info:
        return im
    if im.mode.startswith("I") or im.mode == "F":
        return _high_bit_to_l(im).convert("RGB")
    if _has_alpha(im):
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if im.mode == "1":
        return im.convert("L").convert("RGB")
    return im.convert("RGB")  # L, P, CMYK (Pillow undoes Adobe inversion when decoding), YCbCr, LAB, HSV


def _to_mask(im: Image.Image) -> Image.Image:
    if im.mode.startswith("I") or im.mode == "F":
        return _high_bit_to_l(im)
    if _has_alpha(im):
        alpha = im.convert("RGBA").getchannel("A")
        if alpha.getextrema()[0] < 255:  # the alpha channel carries the mask
            return alpha
        return im.convert("RGBA").convert("L")
    if im.mode == "L":
        return im
    return im.convert("L")


# ---------------------------------------------------------------------------------------------- outputs


def sanitise_stem(stem: str, limit: int = 80) -> str:
    """ASCII letters, digits, '-', '.', '_' only; accents folded; no leading dot; never empty."""
    folded = unicodedata.normalize("NFKD", stem).encode("ascii", "ignore").decode("ascii")
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", folded)
    clean = re.sub(r"_{2,}", "_", clean).strip("._")  # "__" is the separator between the parts
    return clean[:limit] or "image"


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
        raise OutputError(f"{path} already exists; use --overwrite to replace it")
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
        raise OutputError(f"{path} already exists; use --overwrite to replace it") from None
    except OSError:  # file systems without hard links (FAT, some network mounts)
        if path.exists():
            raise OutputError(f"{path} already exists; use --overwrite to replace it") from None
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


def decode_image(data: bytes, role: str, name: str) -> Image.Image:
    """Encoded image bytes (an upload has no path) -> a normalised image, with the file loader's own checks and
    one-line errors."""

    def fail(problem: str) -> InputImageError:
        return InputImageError(f"{role} image {name}: {_one_line(problem)}")

    if not data:
        raise fail("empty upload")
    with _decoded(io.BytesIO(data), fail) as im:
        try:
            return _normalise(im, role)
        except (OSError, ValueError) as exc:
            raise fail(f"unsupported image ({im.mode} mode): {exc}") from None
