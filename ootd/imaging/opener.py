"""The one way an image file or upload comes in: the only module that calls Pillow's `Image.open`
(tests/library/imaging/test_opener.py keeps it so).

Every image that enters ootd - a person, garment or mask photo (run, batch, mask, classify, train prepare, the page
and the API), a result or real photo `ootd eval` measures, a PNG whose record resume or compare reads, a training
cache's pictures - is opened here, with the same guards:

- only regular files (a FIFO, a device or a socket would block or never end);
- only the formats in FORMATS (a file that merely claims to be PostScript never reaches Ghostscript);
- the header checked before any pixel is decoded: at most MAX_PIXELS (a decompression bomb), each side at least the
  caller's minimum;
- decoding bounded by that check, fully done before the image is handed over (a truncated file fails here, naming
  the file, not deep inside a model), Pillow's own bomb warning raised as an error;
- every way a file can be unreadable one `fail(problem)` line (the caller's `InputImageError`, naming the file).

Colours (the embedded ICC profile) are ootd/imaging/icc.py's; modes and orientation ootd/imaging/files.py's.
"""

from __future__ import annotations

import io
import stat
import struct
import warnings
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from ootd.errors import InputImageError

MIN_SIDE = 64  # smaller than this cannot be a usable person or garment photo
MAX_PIXELS = 50_000_000  # checked from the header, before any decoding (a 50 MP RGB image is 150 MB)
# Formats tried when opening. Restricting them keeps Pillow from handing a file that merely claims to be,
# say, PostScript to an external interpreter (EPS goes through Ghostscript). JPEG covers MPO (phones).
FORMATS = ("PNG", "JPEG", "WEBP", "AVIF", "BMP", "TIFF", "GIF", "PPM")
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error, IndexError, TypeError,
                  KeyError, AttributeError, OverflowError)
ORIENTATION_TAG = 0x0112
TURNED = (5, 6, 7, 8)  # EXIF orientations that swap the sides

Fail = Callable[[str], InputImageError]
Source = Path | bytes  # a file, or encoded bytes (an upload has no path)


@dataclass(frozen=True)
class Header:
    """What an image's header says, no pixel decoded: its stored size, format and mode, and whether its EXIF
    orientation turns it on its side."""

    size: tuple[int, int]
    format: str
    mode: str
    turned: bool = False

    @property
    def upright(self) -> tuple[int, int]:
        """The size as shown (EXIF orientation applied)."""
        return (self.size[1], self.size[0]) if self.turned else self.size


@contextmanager
def open_image(source: Source | str, fail: Fail, *, min_side: int = MIN_SIDE, formats: tuple[str, ...] = FORMATS,
               decode: bool = True) -> Iterator[Image.Image]:
    """The image of a file or of encoded bytes, opened with every guard (see the module), as Pillow gives it (no
    orientation, mode or colour normalised), fully decoded unless `decode` is False (then only its header has been
    read, and checked: what decodes it later is bounded by that check). Closed when the block ends."""
    if isinstance(source, str | Path):
        source = Path(source)
        require_regular_file(source, fail)
        handle: Path | io.BytesIO = source
    else:
        if not source:
            raise fail("empty upload")
        handle = io.BytesIO(bytes(source))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(handle, formats=available(formats))
            try:
                check_header(im, fail, min_side)
                if decode:
                    im.load()
            except BaseException:
                im.close()
                raise
    except InputImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise fail(f"image too large to load safely ({exc})") from None
    except UnidentifiedImageError:
        names = ", ".join(_SHOWN.get(name, name) for name in formats)
        raise fail(f"not an image file (or not a supported format: {names})") from None
    except PermissionError:
        raise fail("permission denied") from None
    except MemoryError:
        raise fail("not enough memory to decode it") from None
    except _DECODE_ERRORS as exc:  # Pillow's plugins raise all of these on malformed data
        raise fail(f"corrupt or truncated image ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - a decoder's own failure on hostile data (AVIF: RuntimeError)
        raise fail(f"corrupt image, its decoder failed ({type(exc).__name__}: {exc})") from None
    with im:
        yield im


_SHOWN = {"WEBP": "WebP"}  # how messages spell a format


def read_header(source: Source | str, fail: Fail, *, formats: tuple[str, ...] = FORMATS,
                orientation: bool = False) -> Header:
    """An image's header (size, format, mode) with the opener's guards, no pixel decoded; with `orientation`
    also whether its EXIF orientation turns it (a PNG whose EXIF follows its pixels is decoded to find it, within
    the header's bounds)."""
    with open_image(source, fail, min_side=0, formats=formats, decode=False) as im:
        turned = False
        if orientation:
            try:
                turned = im.getexif().get(ORIENTATION_TAG, 1) in TURNED
            except Exception:  # noqa: BLE001 - a malformed EXIF block: shown as stored, as the loader does
                turned = False
        return Header(im.size, str(im.format), im.mode, turned)


def require_regular_file(path: Path, fail: Fail) -> None:
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


def available(formats: tuple[str, ...] = FORMATS) -> list[str]:
    """The `formats` this Pillow build can open (AVIF support depends on the build)."""
    Image.init()
    return [name for name in formats if name in Image.OPEN]


def check_header(im: Image.Image, fail: Fail, min_side: int = MIN_SIDE) -> None:
    """Reject tiny and enormous images from the header alone, before any pixel is decoded."""
    check_dimensions(*im.size, fail, min_side)


def check_dimensions(width: int, height: int, fail: Fail, min_side: int = MIN_SIDE) -> None:
    """Reject a picture too small to be a usable photo or too large to hold, whatever it came from (a file's
    header, an image handed over in memory: the ComfyUI nodes)."""
    if width * height > MAX_PIXELS:
        raise fail(
            f"image too large: {width}x{height} = {width * height / 1e6:.0f} megapixels "
            f"(limit {MAX_PIXELS / 1e6:.0f}); downscale it first"
        )
    if min(width, height) < min_side:
        raise fail(f"image too small: {width}x{height} (each side must be at least {min_side} px)")
