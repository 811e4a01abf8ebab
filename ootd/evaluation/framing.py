"""The one rule that brings a real photo to a result's frame, the same for every method's results.

A result is never resized: metrics are taken at the resolution it was made. The real photo is centre-cropped
to the result's aspect ratio (the least crop that makes it fit) and resized to the result's size with Pillow's
Lanczos filter (antialiased); a photo already at that size is used as it is. The same rule frames the real photos
of an unpaired set to the results' size. What the networks do after that (InceptionV3's own resize to 299x299)
is theirs, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

RESAMPLE = Image.Resampling.LANCZOS


@dataclass(frozen=True)
class Framed:
    """A photo in a result's frame, and what was done to it (counted in the report)."""

    image: Image.Image
    cropped: bool
    resized: bool


def crop_box(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """The centred box of `size` with the aspect ratio of `target` (both width, height); None when the aspects
    are already equal to the pixel."""
    w, h = size
    tw, th = target
    if w * th > tw * h:  # wider than the target: trim the sides
        cw = round(h * tw / th)
        return None if cw == w else ((w - cw) // 2, 0, (w - cw) // 2 + cw, h)
    ch = round(w * th / tw)  # taller (or equal): trim top and bottom
    return None if ch == h else (0, (h - ch) // 2, w, (h - ch) // 2 + ch)


def frame_to(image: Image.Image, target: tuple[int, int]) -> Framed:
    """`image` centre-cropped to the aspect of `target` (width, height) and resized to it (module docstring)."""
    if image.size == tuple(target):
        return Framed(image, False, False)
    box = crop_box(image.size, target)
    if box is not None and (box[2] - box[0], box[3] - box[1]) == tuple(target):
        return Framed(image.crop(box), True, False)
    return Framed(image.resize(tuple(target), RESAMPLE, box=box), box is not None, True)
