"""Colour management: an input's embedded ICC profile applied on the way in, so the models see sRGB (what they were
trained on), and a photo's own profile on the way out, for pictures that are that photo.

A phone photo in Display P3, a camera's Adobe RGB, a garment shot exported in CMYK for print: their numbers mean
other colours than the same numbers in sRGB, and a garment's colour is what a shop sells. `to_srgb` converts an
image through its embedded profile (LittleCMS, through Pillow's ImageCms; the perceptual intent, which is the
colorimetric one for the matrix profiles of cameras and screens) to sRGB; `from_srgb` converts a generated picture
into a photo's profile, so a result that is the photo (`--keep-unmasked`) keeps the photo's own pixels and profile
outside the repainted region and has the generated colours, in the photo's terms, inside it.

An image without a profile is taken as sRGB, as every browser does. A profile that cannot be used - damaged, larger
than MAX_ICC_BYTES, of another colour space than the image (an RGB profile on a CMYK file), or one LittleCMS cannot
convert from - is left out with a warning naming the file, and the image taken as sRGB (again as browsers do).
"""

from __future__ import annotations

import hashlib
import io
import logging
from functools import lru_cache

from PIL import Image, ImageCms

logger = logging.getLogger(__name__)

MAX_ICC_BYTES = 8 << 20  # real profiles are at most a few MB (print LUTs); a JPEG can carry up to 16 MB
SPACE_OF_MODE = {"L": "GRAY", "LA": "GRAY", "RGB": "RGB", "RGBA": "RGB", "CMYK": "CMYK"}  # the modes converted
TRANSFORMS_KEPT = 16  # built transforms kept for reuse (a batch's photos mostly share a few profiles)


def profile_space(icc: object) -> str | None:
    """The colour space an ICC profile's header names ("RGB", "GRAY", "CMYK", ...), None for anything that is not
    a profile's bytes."""
    if not isinstance(icc, bytes) or len(icc) < 128:
        return None
    return icc[16:20].decode("latin-1").strip() or None


def describes(icc: object, mode: str) -> bool:
    """Whether an ICC profile is for the colours of an image of `mode` (an RGB profile on RGB(A), a grey one on
    L(A), a CMYK one on CMYK)."""
    return SPACE_OF_MODE.get(mode) is not None and profile_space(icc) == SPACE_OF_MODE[mode]


def to_srgb(im: Image.Image, label: str) -> Image.Image:
    """`im` (L, LA, RGB, RGBA or CMYK; 8 bits) converted through its embedded ICC profile to sRGB: RGB, or RGBA
    with its alpha kept. Without a usable profile (see the module; `label` names the file in the warning), `im`
    itself. The result carries no metadata."""
    icc = im.info.get("icc_profile")
    if not icc or im.mode not in SPACE_OF_MODE:
        return im
    problem = _unusable(icc, im.mode)
    if problem is None:
        alpha = im.getchannel("A") if im.mode == "LA" else None
        base = im.getchannel("L") if alpha is not None else im
        try:
            out = _transform(_key(icc), icc, base.mode, "RGBA" if base.mode == "RGBA" else "RGB", True).apply(base)
        except (ImageCms.PyCMSError, OSError, ValueError) as exc:
            problem = f"it cannot be applied ({_one_line(exc)})"
        else:
            if alpha is not None:
                out.putalpha(alpha)
            out.info = {}
            return out
    logger.warning("%s: ignoring its embedded ICC colour profile, %s; its colours are taken as sRGB", label, problem)
    return im


def from_srgb(picture: Image.Image, icc: object, mode: str) -> Image.Image:
    """An sRGB `picture` (RGB) in the colours of a photo whose profile is `icc`, as an image of `mode` ("RGB" or
    "L"): converted into that profile when it describes `mode` and can be used (the photo's colours were converted
    from it on the way in), else converted as Pillow converts modes (the photo was taken as sRGB)."""
    rgb = picture.convert("RGB")
    if isinstance(icc, bytes) and _unusable(icc, mode) is None:
        try:
            return _transform(_key(icc), icc, mode, "RGB", False).apply(rgb)
        except (ImageCms.PyCMSError, OSError, ValueError):
            pass  # the way in could not use it either: the photo was taken as sRGB
    return rgb.convert(mode)


def _unusable(icc: bytes, mode: str) -> str | None:
    """Why `icc` cannot convert an image of `mode`, or None when it can."""
    if not isinstance(icc, bytes):
        return "it is not a profile"
    if len(icc) > MAX_ICC_BYTES:
        return f"it is {len(icc) >> 20} MB, over the {MAX_ICC_BYTES >> 20} MB a profile may have"
    space = profile_space(icc)
    if space != SPACE_OF_MODE[mode]:
        return f"it is for {space or 'unknown'} colours and the image is {mode}"
    if _profile(_key(icc), icc) is None:
        return "it is damaged"
    return None


def _key(icc: bytes) -> str:
    return hashlib.sha256(icc).hexdigest()


@lru_cache(maxsize=TRANSFORMS_KEPT)
def _profile(key: str, icc: bytes) -> ImageCms.ImageCmsProfile | None:  # noqa: ARG001 - `key` is the cache's
    try:
        return ImageCms.ImageCmsProfile(io.BytesIO(icc))
    except (ImageCms.PyCMSError, OSError, ValueError, TypeError):
        return None


@lru_cache(maxsize=1)
def _srgb() -> ImageCms.ImageCmsProfile:
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))


@lru_cache(maxsize=TRANSFORMS_KEPT)
def _transform(key: str, icc: bytes, photo_mode: str, srgb_mode: str, inward: bool) -> ImageCms.ImageCmsTransform:
    """The transform from the profile to sRGB (`inward`) or back, built once per profile and modes."""
    profile = _profile(key, icc)
    if inward:
        return ImageCms.buildTransform(profile, _srgb(), photo_mode, srgb_mode)
    return ImageCms.buildTransform(_srgb(), profile, srgb_mode, photo_mode)


def _one_line(value: object) -> str:
    return " ".join(str(value).split())
