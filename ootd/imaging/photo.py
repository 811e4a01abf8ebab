"""Results brought back to the user's photo, in image space on the CPU: the generated picture at the photo's own
size and framing (`--output-size photo`), or the photo itself with only the repainted region replaced
(`--keep-unmasked`).

The pipeline's pictures are at the working resolution with the padding already cut away (ootd/imaging/framing.py
`restore_framing(keep_scale=True)`), so they cover the photo's own frame: the whole photo for pad and stretch, the
region the crop kept for crop. `in_photo_frame` resizes one (Lanczos) to that region's pixels. `kept_photo` then
resizes the try-on's mask the same way, binarises it, widens it into a seam by a box blur of `feather_pixels`
(finite: beyond that radius the blend weight is exactly 0, inside the mask by more it is exactly 1) and blends the
generated picture into the photo through it: every pixel outside the feathered mask is the photo's, every pixel
well inside is the generated one's, the band between is a blend. A transparent photo keeps its alpha outside the
mask; the repainted region is opaque.
"""

from __future__ import annotations

from PIL import Image, ImageChops, ImageFilter

from ootd.imaging.framing import FitInfo
from ootd.settings import FEATHER_HEIGHT

MASK_THRESHOLD = 128  # a mask resized with a smooth filter: pixels from here are repainted


def in_photo_frame(picture: Image.Image, info: FitInfo, resample: int = Image.LANCZOS
                   ) -> tuple[Image.Image, tuple[int, int]]:
    """A result (working scale, padding cut away) at the photo's pixel size, and where it sits in the photo:
    the whole photo (pad, stretch) or the region the crop kept (crop: what was cut off was never generated)."""
    if info.mode == "crop":
        left, top, right, bottom = info.box
        return picture.resize((right - left, bottom - top), resample), (left, top)
    return picture.resize(info.original_size, resample), (0, 0)


def feather_pixels(feather: int, height: int) -> int:
    """The seam's half-width at a photo `height` px high: `feather` is counted at FEATHER_HEIGHT px."""
    return 0 if feather <= 0 else max(1, round(feather * height / FEATHER_HEIGHT))


def photo_mask(mask: Image.Image, info: FitInfo, feather: int) -> Image.Image:
    """The blend weight at the photo's size ("L", 255 = the generated picture): the try-on's mask (working scale,
    padding cut away) resized smoothly, binarised, then widened into a seam of `feather` (see `feather_pixels`)."""
    region, offset = in_photo_frame(mask.convert("L"), info, Image.BILINEAR)
    binary = region.point(lambda v: 255 if v >= MASK_THRESHOLD else 0)
    canvas = Image.new("L", info.original_size, 0)
    canvas.paste(binary, offset)
    radius = feather_pixels(feather, info.original_size[1])
    return canvas.filter(ImageFilter.BoxBlur(radius)) if radius else canvas


def kept_photo(photo: Image.Image, generated: Image.Image, weight: Image.Image, info: FitInfo) -> Image.Image:
    """The photo (RGB or RGBA, its own size) with the generated picture blended in through `weight`
    (`photo_mask`); only the weight's bounding box is touched."""
    if photo.size != info.original_size:
        raise ValueError(f"the photo is {photo.size}, the framing was made for {info.original_size}")
    out = photo.copy()
    box = weight.getbbox()
    if box is None:  # nothing was repainted
        return out
    picture, (dx, dy) = in_photo_frame(generated.convert("RGB"), info)
    base = photo.crop(box)
    rgb = base.convert("RGB")
    layer = rgb.copy()
    layer.paste(picture.crop((box[0] - dx, box[1] - dy, box[2] - dx, box[3] - dy)), (0, 0))
    if info.mode == "crop":  # the seam may reach past the kept region, where only the photo exists
        outside = Image.new("L", base.size, 255)
        outside.paste(0, (dx - box[0], dy - box[1], dx - box[0] + picture.width, dy - box[1] + picture.height))
        layer.paste(rgb, (0, 0), outside)
    alpha = weight.crop(box)
    blended = Image.composite(layer, rgb, alpha)
    if photo.mode == "RGBA":  # opaque where repainted, the photo's own alpha elsewhere
        blended.putalpha(ImageChops.lighter(base.getchannel("A"), alpha))
    out.paste(blended, box[:2])
    return out
