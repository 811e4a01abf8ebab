"""Mask and masked-person images as the pipeline uses them (docs/upstream.md §2, §8)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ootd.imaging.files import ImageInput, load_image
from ootd.imaging.icc import to_srgb
from preprocess.masking import dilate


def as_image(value: ImageInput, role: str) -> Image.Image:
    """A PIL image from an image, a path or a path string ("mask" gives a grayscale one); an image that carries
    an ICC profile converted through it to sRGB, as a file's is."""
    if isinstance(value, Image.Image):
        return to_srgb(value, role).convert("L" if role == "mask" else "RGB")
    return load_image(Path(value), role)


def masked_person_image(person: Image.Image, mask: Image.Image) -> Image.Image:
    """The person with every masked pixel replaced by gray 127 (docs/upstream.md §2)."""
    gray = Image.new("RGB", person.size, (127, 127, 127))
    return Image.composite(gray, person, mask)


def grow_mask(mask: Image.Image, pixels: int) -> Image.Image:
    """Dilate a binary mask by `pixels` (for users who want a looser mask)."""
    if pixels <= 0:
        return mask
    return Image.fromarray(dilate(np.asarray(mask), pixels), mode="L")


def binarize_mask(mask: Image.Image) -> Image.Image:
    """255 where the mask is >= 127 (the original's threshold), 0 elsewhere."""
    arr = np.asarray(mask.convert("L"))
    return Image.fromarray(np.where(arr >= 127, 255, 0).astype(np.uint8), mode="L")
