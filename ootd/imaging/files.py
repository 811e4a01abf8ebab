"""Input images in: validation and normalisation (opening, with every guard: ootd/imaging/opener.py; colours:
ootd/imaging/icc.py; framing: ootd/imaging/framing.py; writing outputs: ootd/imaging/atomic.py).

Everything a user can get wrong about an image file becomes one `InputImageError` line naming the file.

Person and garment images load as sRGB "RGB": EXIF orientation applied, any mode brought to 8 bits, the embedded
ICC profile applied (ootd/imaging/icc.py), transparency composited over white. Mask images (role "mask") load
as mode "L", white = the region to repaint. A mask with a transparency channel that actually carries information
(some pixel not fully opaque) is read from that channel: painted (opaque) pixels are the region, whatever their
colour. This is how masks drawn in an editor on a transparent layer come out; a mask without transparency (or with a
fully opaque alpha) is read from its brightness, in sRGB.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from ootd.errors import InputImageError, printable
from ootd.imaging.icc import describes, to_srgb
from ootd.imaging.opener import MAX_PIXELS, MIN_SIDE, Fail, open_image, read_header

logger = logging.getLogger(__name__)

__all__ = ["MAX_PIXELS", "MIN_SIDE", "ImageInput", "decode_image", "image_size", "load_image", "load_photo",
           "read_rgb", "sanitise_stem"]

ROLES = ("person", "garment", "mask")
ImageInput = Image.Image | str | Path  # what the pipeline and the loaders take for an image


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def load_image(path: str | Path, role: str) -> Image.Image:
    """Open, fully decode and normalise an input image (sRGB RGB for person/garment, L for masks).

    Fully decoding here (rather than lazily later) means a truncated file fails now, with the file's name,
    instead of deep inside preprocessing. Only regular files are opened: a FIFO, a device or a socket would
    block or never end. File names that are not valid UTF-8 work; messages show their odd bytes as backslash escapes.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    path = Path(path)

    def fail(problem: str) -> InputImageError:
        return InputImageError(f"{role} image {printable(path)}: {_one_line(problem)}")

    with open_image(path, fail) as im:
        try:
            return _normalise(im, role, printable(path))
        except (OSError, ValueError) as exc:  # e.g. a mode Pillow cannot convert
            raise fail(f"unsupported image ({im.mode} mode): {exc}") from None


def read_rgb(path: str | Path, fail: Fail, min_side: int = 1) -> Image.Image:
    """A picture to measure (`ootd eval`'s results and real photos) in the models' colours: sRGB "RGB" (its ICC
    profile applied, transparency over white), as stored (no EXIF orientation, as ootd writes its results), every
    guard of the opener; each problem one `fail(problem)` error."""
    with open_image(Path(path), fail, min_side=min_side) as im:
        try:
            return _to_rgb(to_srgb(_eight_bit(im), printable(path)))
        except (OSError, ValueError) as exc:
            raise fail(f"unsupported image ({im.mode} mode): {exc}") from None


def image_size(value: str | Path | bytes | Image.Image) -> tuple[int, int]:
    """An input's size as shown upright (EXIF orientation applied), from its header alone when it is a file."""
    if isinstance(value, Image.Image):
        return value.size
    label = printable(value) if isinstance(value, str | Path) else "image"

    def fail(problem: str) -> InputImageError:
        return InputImageError(f"image {label}: {_one_line(problem)}")

    return read_header(Path(value) if isinstance(value, str | Path) else bytes(value), fail, orientation=True).upright


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
        return _photo_mode(value, label)
    with open_image(Path(value) if isinstance(value, str | Path) else bytes(value), fail) as im:
        try:
            oriented = _oriented(im)
            return _photo_mode(oriented, label, owned=oriented is not im)
        except (OSError, ValueError) as exc:  # e.g. a mode Pillow cannot convert
            raise fail(f"unsupported image ({im.mode} mode): {exc}") from None


PHOTO_MODES = ("L", "LA", "RGB", "RGBA")  # the modes a photo keeps (a PNG holds each as it is)


def _photo_mode(im: Image.Image, label: str, owned: bool = False) -> Image.Image:
    """`load_photo`'s mode and ICC profile rules; a detached image (`owned`: `im` is one already, not copied)."""
    icc = im.info.get("icc_profile")
    eight = _eight_bit(im)
    if eight.mode in PHOTO_MODES:
        out = eight if owned or eight is not im else im.copy()
    else:  # CMYK through its profile (as the try-on saw it); YCbCr, LAB, HSV as Pillow converts them
        out = to_srgb(eight, label)
        out = out.convert("RGB") if out is eight else out
        icc = None
    out.info = {"icc_profile": icc} if describes(icc, out.mode) else {}
    return out


def _oriented(im: Image.Image) -> Image.Image:
    try:
        oriented = ImageOps.exif_transpose(im)
    except Exception as exc:  # a malformed EXIF block should not reject an otherwise fine photo
        logger.warning("ignoring unreadable EXIF orientation: %s", _one_line(exc))
        oriented = im
    return im if oriented is None else oriented  # None: older Pillow with in_place semantics


def _normalise(im: Image.Image, role: str, label: str) -> Image.Image:
    """Apply EXIF orientation, bring any mode to 8 bits, apply the ICC profile (sRGB), then RGB (or L for masks);
    returns a detached copy without metadata."""
    managed = to_srgb(_eight_bit(_oriented(im)), label)
    out = _to_mask(managed) if role == "mask" else _to_rgb(managed)
    if out is im:
        out = im.copy()
    out.info = {}  # drop source metadata (EXIF, ICC): the pixels are already normalised
    return out


def _has_alpha(im: Image.Image) -> bool:
    return im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info


GREY_MODES = ("1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F")


def _eight_bit(im: Image.Image) -> Image.Image:
    """`im` in a mode of 8 bits a channel that keeps what it holds: L, LA, RGB, RGBA (transparency as an alpha
    channel), or CMYK, YCbCr, LAB, HSV as they are; its ICC profile kept in `info` (the colours are unchanged)."""
    icc = im.info.get("icc_profile")
    grey = im.mode in GREY_MODES
    if im.mode.startswith("I") or im.mode == "F":
        out = _high_bit_to_l(im)  # a 16-bit grey PNG's transparent level is not kept (as before)
    elif _has_alpha(im):
        out = im if im.mode in ("RGBA", "LA") else im.convert("LA" if grey else "RGBA")
    elif im.mode == "1":
        out = im.convert("L")
    elif im.mode in ("P", "RGBX"):
        out = im.convert("RGB")
    else:
        return im
    if icc is not None:
        out.info["icc_profile"] = icc
    return out


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
    """An 8-bit image (`_eight_bit`, colours managed) as RGB, transparency over white."""
    if im.mode == "RGB":
        return im
    if im.mode in ("RGBA", "LA"):
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return im.convert("RGB")  # L, CMYK without a profile (Pillow undoes Adobe inversion when decoding), YCbCr, LAB, HSV


def _to_mask(im: Image.Image) -> Image.Image:
    """An 8-bit image (`_eight_bit`, colours managed) as a mask: its alpha when that carries one, else its grey."""
    if im.mode in ("RGBA", "LA"):
        alpha = im.getchannel("A")
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

    with open_image(bytes(data), fail) as im:
        try:
            return _normalise(im, role, name)
        except (OSError, ValueError) as exc:
            raise fail(f"unsupported image ({im.mode} mode): {exc}") from None
