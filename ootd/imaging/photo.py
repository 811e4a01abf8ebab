"""Results brought back to the user's photo, in image space on the CPU: the generated picture at the photo's own
size and framing (`--output-size photo`), or the photo itself with only the repainted region replaced
(`--keep-unmasked`). `photo_pictures` is the one entry (`ootd run`, batch, the server, `TryOnResult.on_photo`).

The pipeline's pictures are at the working resolution with the padding already cut away (ootd/imaging/framing.py
`restore_framing(keep_scale=True)`), so they cover the photo's own frame: the whole photo for pad and stretch, the
region the crop kept for crop. `in_photo_frame` resizes one (Lanczos) to that region's pixels. `kept_photo` then
resizes the try-on's mask the same way, binarises it, widens it into a seam by a box blur of `feather_pixels`
(finite: beyond that radius the blend weight is exactly 0, inside the mask by more it is exactly 1) and blends the
generated picture into the photo through it: every pixel outside the feathered mask is the photo's, every pixel
well inside is the generated one's, the band between is a blend. The photo keeps its mode (L, LA, RGB, RGBA:
`load_photo`) and its ICC profile: the generated picture (sRGB, as the models saw the photo) is converted into that
profile before it is blended in (ootd/imaging/icc.py `from_srgb`), so the pixels outside the mask stay the photo's
own numbers and the ones inside mean the generated colours; a transparent photo keeps its alpha outside the mask, the
repainted region is opaque. The generated picture at the photo's size (`--output-size photo`) is converted into the
photo's RGB profile the same way and carries it. The pictures are made one at a time as they are read
(`PhotoPictures`), so the memory this takes does not grow with the number of samples.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from PIL import Image, ImageChops, ImageFilter

from ootd.imaging.framing import FitInfo
from ootd.imaging.icc import describes, from_srgb
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
    """The photo (L, LA, RGB or RGBA, its own size; `ootd.imaging.files.load_photo`) with the generated picture
    blended in through `weight` (`photo_mask`); only the weight's bounding box is touched. The generated picture
    (sRGB) is converted into the photo's ICC profile (in grey for a grey photo); the copy keeps the photo's `info`
    (its profile)."""
    if photo.size != info.original_size:
        raise ValueError(f"the photo is {photo.size}, the framing was made for {info.original_size}")
    out = photo.copy()
    box = weight.getbbox()
    if box is None:  # nothing was repainted
        return out
    colour = "L" if photo.mode in ("L", "LA") else "RGB"
    picture, (dx, dy) = in_photo_frame(generated.convert("RGB"), info)
    base = photo.crop(box)
    rgb = base.convert(colour)
    layer = rgb.copy()
    generated_box = picture.crop((box[0] - dx, box[1] - dy, box[2] - dx, box[3] - dy))
    layer.paste(from_srgb(generated_box, photo.info.get("icc_profile"), colour), (0, 0))
    if info.mode == "crop":  # the seam may reach past the kept region, where only the photo exists
        outside = Image.new("L", base.size, 255)
        outside.paste(0, (dx - box[0], dy - box[1], dx - box[0] + picture.width, dy - box[1] + picture.height))
        layer.paste(rgb, (0, 0), outside)
    alpha = weight.crop(box)
    blended = Image.composite(layer, rgb, alpha)
    if photo.mode in ("RGBA", "LA"):  # opaque where repainted, the photo's own alpha elsewhere
        blended.putalpha(ImageChops.lighter(base.getchannel("A"), alpha))
    out.paste(blended, box[:2])
    return out


def with_profile(picture: Image.Image, icc: object) -> Image.Image:
    """An sRGB `picture` in the photo's colours: converted into the photo's ICC profile `icc` and carrying it when
    that is an RGB profile (`from_srgb`), else as it is (sRGB, no profile)."""
    if not describes(icc, "RGB"):
        return picture
    out = from_srgb(picture, icc, "RGB")
    out.info["icc_profile"] = icc
    return out


class PhotoPictures(Sequence[Image.Image]):
    """The pictures brought back to the photo, each made when it is asked for and never kept here. Iterating
    streams them: the picture before is closed (its memory released, even while a loop still refers to it) when
    the next is asked for, so one photo-size picture exists at a time whatever the number of samples (what the
    memory plan's "photo" stage counts, ootd/memory/estimate.py); write or copy each before asking for the next.
    Indexing (`pictures[i]`) makes one that stays open."""

    def __init__(self, photo: Image.Image, images: Sequence[Image.Image], info: FitInfo,
                 weight: Image.Image | None) -> None:
        self.images, self.info, self.weight = list(images), info, weight
        self.photo = photo if weight is not None else None  # else only its profile is needed
        self.icc = photo.info.get("icc_profile")

    def __len__(self) -> int:
        return len(self.images)

    def __iter__(self) -> Iterator[Image.Image]:
        previous = None
        for index in range(len(self)):
            if previous is not None:
                previous.close()
            previous = self[index]
            yield previous

    @overload
    def __getitem__(self, index: int) -> Image.Image: ...

    @overload
    def __getitem__(self, index: slice) -> list[Image.Image]: ...

    def __getitem__(self, index: int | slice) -> Image.Image | list[Image.Image]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        image = self.images[index]
        if self.photo is not None and self.weight is not None:
            return kept_photo(self.photo, image, self.weight, self.info)
        return with_profile(in_photo_frame(image, self.info)[0], self.icc)


def photo_pictures(photo: Image.Image, images: Sequence[Image.Image], info: FitInfo, repainted: Image.Image | None,
                   keep_unmasked: bool, feather: int) -> tuple[PhotoPictures, Image.Image | None]:
    """Results (working scale, padding cut away) brought back to the user's `photo` (`load_photo`) framed as
    `info` says: the photo with only the `repainted` region replaced (`keep_unmasked`, seam `feather`), or the
    generated pictures at its size and framing; with the blend weight (None without `keep_unmasked`). The one
    way every front end does it (`ootd run`, batch, the server, `TryOnResult.on_photo`)."""
    if not keep_unmasked:
        return PhotoPictures(photo, images, info, None), None
    if repainted is None:
        raise ValueError("keeping the photo needs the region that was repainted")
    weight = photo_mask(repainted, info, feather)
    return PhotoPictures(photo, images, info, weight), weight
