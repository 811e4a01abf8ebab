"""3:4 framing: bring any photo to the working size (pad, crop or stretch) and map an output back to the
photo's framing. Each input is framed once, straight from the source to the working resolution
(docs/upstream.md §2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import Image

from ootd.settings import FitMode


@dataclass(frozen=True)
class FitInfo:
    """How `fit_to_aspect` framed an image, so an output at that framing can be mapped back.

    box: for "pad", the content rectangle inside the fitted image (left, top, right, bottom);
    for "crop", the rectangle of the original that was kept; for "stretch", the whole fitted image.
    """

    mode: str
    original_size: tuple[int, int]
    size: tuple[int, int]
    box: tuple[int, int, int, int]


def _edge_colour(im: Image.Image, side: str) -> tuple[int, ...]:
    """Median colour of the outermost pixel row/column on one side: a flat fill matching a plain backdrop."""
    arr = np.asarray(im)
    strip = {"left": arr[:, 0], "right": arr[:, -1], "top": arr[0], "bottom": arr[-1]}[side]
    strip = strip.reshape(strip.shape[0], -1)
    return tuple(int(v) for v in np.median(strip, axis=0).round())


def _fill(colour: tuple[int, ...] | int, mode: str) -> tuple[int, ...] | int:
    if mode in ("L", "1", "I", "F", "P"):
        return colour if isinstance(colour, int) else int(colour[0])
    if isinstance(colour, int):
        return (colour,) * len(mode)
    return tuple(colour)


def frame_of(source: tuple[int, int], size: tuple[int, int], mode: FitMode | str) -> FitInfo:
    """How `fit_to_aspect` frames an image of `source` size (width, height) at `size`, without the pixels: what
    maps a result back to the photo it was made from."""
    width, height = int(size[0]), int(size[1])
    if width <= 0 or height <= 0:
        raise ValueError(f"size must be positive, got {size}")
    src_w, src_h = int(source[0]), int(source[1])
    if mode == "stretch":
        return FitInfo("stretch", (src_w, src_h), (width, height), (0, 0, width, height))
    if mode == "crop":
        scale = max(width / src_w, height / src_h)
        crop_w = min(src_w, round(width / scale))
        crop_h = min(src_h, round(height / scale))
        left = (src_w - crop_w) // 2
        top = (src_h - crop_h) // 2
        return FitInfo("crop", (src_w, src_h), (width, height), (left, top, left + crop_w, top + crop_h))
    if mode != "pad":
        raise ValueError(f"mode must be pad, crop or stretch, got {mode!r}")
    scale = min(width / src_w, height / src_h)
    content_w = max(1, min(width, round(src_w * scale)))
    content_h = max(1, min(height, round(src_h * scale)))
    left = (width - content_w) // 2
    top = (height - content_h) // 2
    return FitInfo("pad", (src_w, src_h), (width, height), (left, top, left + content_w, top + content_h))


def fit_to_aspect(
    image: Image.Image,
    size: tuple[int, int] = (768, 1024),
    mode: FitMode | str = FitMode.PAD,
    pad_color: Literal["edge"] | tuple[int, ...] | int = "edge",
    resample: int | None = None,
) -> tuple[Image.Image, FitInfo]:
    """Bring any image to `size` (width, height), by default 3:4, without distorting it unless asked.

    pad: scale to fit and fill the borders (with the median colour of the image edge it extends, or a given
    colour); crop: scale to cover and cut the centre; stretch: plain resize (what the original does).
    `resample` None uses Pillow's default filter, as the original's resize; pass NEAREST for masks.
    """
    info = frame_of(image.size, size, mode)
    width, height = info.size
    kwargs = {} if resample is None else {"resample": resample}
    if info.mode == "stretch":
        return image.resize((width, height), **kwargs), info
    if info.mode == "crop":
        return image.resize((width, height), box=info.box, **kwargs), info
    box = info.box
    content_w, content_h = box[2] - box[0], box[3] - box[1]
    content = image.resize((content_w, content_h), **kwargs) if (content_w, content_h) != image.size else image

    horizontal = content_w < width  # padding on the left and right
    sides = ("left", "right") if horizontal else ("top", "bottom")
    if pad_color == "edge":
        colours = [_edge_colour(content, side) for side in sides]
    else:
        colours = [pad_color, pad_color]
    canvas = Image.new(image.mode, (width, height), _fill(colours[0], image.mode))
    if image.mode == "P" and image.getpalette() is not None:
        canvas.putpalette(image.getpalette())
    second = (box[2], 0, width, height) if horizontal else (0, box[3], width, height)
    if second[0] < second[2] and second[1] < second[3]:
        canvas.paste(_fill(colours[1], image.mode), second)
    canvas.paste(content, box[:2])
    return canvas, info


def restore_framing(
    output: Image.Image, info: FitInfo, resample: int | None = None, *, keep_scale: bool = False
) -> Image.Image:
    """Map an output made at the fitted framing back to the original's framing.

    keep_scale (what the pipeline returns): only cut the padding away, keeping the generated pixels as they are,
    with no resample; crop and stretch outputs come back unchanged. Otherwise the result is also resized, once,
    to the original's pixel size: pad: the content box; stretch: the whole output; crop: what was cut off is
    gone, so the kept region at its original pixel size.
    The output may be at another resolution than `info.size` (e.g. 384x512 vs 768x1024): the box is scaled.
    """
    if info.mode not in ("pad", "crop", "stretch"):
        raise ValueError(f"unknown framing mode {info.mode!r}")
    sx = output.width / info.size[0]
    sy = output.height / info.size[1]
    left, top, right, bottom = info.box
    if keep_scale:
        if info.mode != "pad" or info.box == (0, 0, *info.size):
            return output
        return output.crop((round(left * sx), round(top * sy), round(right * sx), round(bottom * sy)))
    kwargs = {} if resample is None else {"resample": resample}
    if info.mode == "stretch":
        return output.resize(info.original_size, **kwargs)
    if info.mode == "crop":
        return output.resize((right - left, bottom - top), **kwargs)
    return output.resize(info.original_size, box=(left * sx, top * sy, right * sx, bottom * sy), **kwargs)
