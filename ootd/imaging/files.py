"""Input images in: validation and normalisation (framing: ootd/imaging/framing.py; writing outputs:
ootd/imaging/atomic.py).

Everything a user can get wrong about an image file becomes one `InputImageError` line naming the file.

Mask images (role "mask") load as mode "L", white = the region to repaint. A mask with a transparency channel
that actually carries information (some pixel not fully opaque) is read from that channel: painted (opaque)
pixels are the region, whatever their colour. This is how masks drawn in an editor on a transparent layer come
out; a mask without transparency (or with a fully opaque alpha) is read from its brightness.
"""

from __future__ import annotations

import io
import logging
import re
import stat
import struct
import unicodedata
import warnings
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ootd.errors import InputImageError, printable

logger = logging.getLogger(__name__)

MIN_SIDE = 64  # smaller than this cannot be a usable person or garment photo
MAX_PIXELS = 50_000_000  # checked from the header, before any decoding (a 50 MP RGB image is 150 MB)
ROLES = ("person", "garment", "mask")
ImageInput = Image.Image | str | Path  # what the pipeline and the loaders take for an image
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
    check_dimensions(*im.size, fail, min_side)


def check_dimensions(width: int, height: int, fail: Callable[[str], InputImageError], min_side: int = MIN_SIDE
                     ) -> None:
    """Reject a picture too small to be a usable photo or too large to hold, whatever it came from (a file's
    header, an image handed over in memory)."""
    if width * height > MAX_PIXELS:
        raise fail(
            f"image too large: {width}x{height} = {width * height / 1e6:.0f} megapixels "
            f"(limit {MAX_PIXELS / 1e6:.0f}); downscale it first"
        )
    if min(width, height) < min_side:
        raise fail(f"image too small: {width}x{height} (each side must be at least {min_side} px)")


def image_size(value: str | Path | bytes | Image.Image) -> tuple[int, int]:
    """An input's size as shown upright (EXIF orientation applied), from its header alone when it is a file."""
    if isinstance(value, Image.Image):
        return value.size
    with Image.open(Path(value) if isinstance(value, str | Path) else io.BytesIO(value)) as im:
        width, height = im.size
        turned = im.getexif().get(0x0112, 1) in (5, 6, 7, 8)  # orientations that swap the sides
    return (height, width) if turned else (width, height)


def load_photo(value: str | Path | bytes | Image.Image, label: str) -> Image.Image:
    """The person photo as the user gave it, for results that are that photo (`--keep-unmasked`): EXIF
    orientation applied as on input, and in its own mode where a PNG holds it (L, LA, RGB, RGBA: a grey photo
    stays grey, a transparent one keeps its alpha). Else: palette -> RGB (RGBA when transparent), bilevel -> L,
    16-bit and float grey -> 8-bit L (scaled as on input), CMYK, YCbCr, LAB, HSV -> RGB (as the try-on saw it).
    Its ICC profile stays in `info["icc_profile"]` (the PNG writer stores it) when it describes the result's
    colours: an RGB profile on RGB(A), a grey one on L(A); any other (a CMYK profile of a converted photo) is
    dropped. The same checks and one-line errors as `load_image`."""

    def fail(problem: str) -> InputImageError:
        return InputImageError(f"person image {printable(label)}: {_one_line(problem)}")

    if isinstance(value, Image.Image):  # as the pipeline takes it: not re-oriented
        return _photo_mode(value)
    opened = open_image_file(Path(value), fail) if isinstance(value, str | Path) else _decoded(io.BytesIO(value), fail)
    with opened as im:
        try:
            oriented = _oriented(im)
            return _photo_mode(oriented, owned=oriented is not im)
        except (OSError, ValueError) as exc:  # e.g. a mode Pillow cannot convert
            raise fail(f"unsupported image ({im.mode} mode): {exc}") from None


PHOTO_MODES = ("L", "LA", "RGB", "RGBA")  # the modes a photo keeps (a PNG holds each as it is)


def _photo_mode(im: Image.Image, owned: bool = False) -> Image.Image:
    """`load_photo`'s mode and ICC profile rules; a detached image (`owned`: `im` is one already, not copied)."""
    grey = im.mode in ("1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F")
    if _has_alpha(im):
        out = im.convert("LA" if grey else "RGBA")
    elif im.mode in PHOTO_MODES:
        out = im if owned else im.copy()
    elif im.mode.startswith("I") or im.mode == "F":
        out = _high_bit_to_l(im)
    else:
        out = im.convert("L" if grey else "RGB")
    icc = im.info.get("icc_profile")
    space = b"GRAY" if out.mode in ("L", "LA") else b"RGB "
    out.info = {"icc_profile": icc} if isinstance(icc, bytes) and icc[16:20] == space else {}
    return out


def _oriented(im: Image.Image) -> Image.Image:
    try:
        oriented = ImageOps.exif_transpose(im)
    except Exception as exc:  # a malformed EXIF block should not reject an otherwise fine photo
        logger.warning("ignoring unreadable EXIF orientation: %s", _one_line(exc))
        oriented = im
    return im if oriented is None else oriented  # None: older Pillow with in_place semantics


def _normalise(im: Image.Image, role: str) -> Image.Image:
    """Apply EXIF orientation and convert any mode to RGB (or L for masks); returns a detached copy."""
    oriented = _oriented(im)
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
