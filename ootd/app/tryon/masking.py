"""Masks a user can see, fix and give back: the mask alone (no diffusion models), and checks on a given mask.

`MaskJob` (`ootd mask`) runs the person -> mask step of a try-on (ootd.preprocessing.mask_person) and writes the
mask and the masked person framed like a try-on's results (with --fit pad the padding is cropped away), so the mask
can be edited and passed back with `--mask`. `check_mask_input` refuses a mask whose aspect is not the person photo's
(it would be stretched over the wrong pixels) and says when a mask is not two-tone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.record import mask_record
from ootd.app.tryon.request import TryOnRequest
from ootd.errors import InputImageError, NoPersonError, UsageError, fill, library_name
from ootd.imaging.atomic import save_png_atomic
from ootd.imaging.files import decode_image, load_image, sanitise_stem
from ootd.imaging.opener import open_image
from ootd.preprocessing import mask_person
from ootd.settings import PREPROCESS_RESOLUTION, Category, FitMode, ModelType

if TYPE_CHECKING:
    from PIL import Image

logger = logging.getLogger(__name__)

ASPECT_TOLERANCE = 2.0  # pixels: a mask cut from a resized image may be a rounding off the photo's aspect
GREY_LIMIT = 0.02  # share of pixels strictly between black and white above which a mask is "not two-tone"


def _image(value: Any, role: str) -> Image.Image:
    """A path, bytes or PIL image as the loader normalises it (EXIF orientation applied)."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value
    if isinstance(value, bytes | bytearray):
        return decode_image(bytes(value), role, role)
    return load_image(value, role)


def _is_colour(value: Any) -> bool:
    """True when the mask as given has colours (not only greys): its brightness is then a guess."""
    import numpy as np
    from PIL import Image

    try:
        if isinstance(value, Image.Image):
            small = _colour_thumbnail(value)
        else:
            source = bytes(value) if isinstance(value, bytes | bytearray) else Path(value)
            with open_image(source, InputImageError, min_side=1) as im:
                small = _colour_thumbnail(im)
    except (InputImageError, OSError, ValueError):  # the mask's own load says what is wrong with it
        return False
    if small is None:
        return False
    arr = np.asarray(small).astype(np.int16)
    return bool(((arr.max(axis=2) - arr.min(axis=2)) > 24).mean() > GREY_LIMIT)


def _colour_thumbnail(im: Image.Image) -> Image.Image | None:
    """A small RGB copy of a mask of a mode that holds colours (None for a grey one)."""
    if im.mode not in ("RGB", "RGBA", "P", "CMYK", "YCbCr"):
        return None
    return im.convert("RGB").resize((64, 64))


def aspect_mismatch(person_size: tuple[int, int], mask_size: tuple[int, int]) -> bool:
    """True when the mask's aspect is not the person's, beyond a pixel or two of rounding (in the mask's
    pixels)."""
    (pw, ph), (mw, mh) = person_size, mask_size
    return abs(mh - mw * ph / pw) > ASPECT_TOLERANCE and abs(mw - mh * pw / ph) > ASPECT_TOLERANCE


def check_mask_input(request: TryOnRequest, raw_mask: Any = None, fit: FitMode = FitMode.PAD) -> TryOnRequest:
    """Refuse a mask of another aspect than the person photo (one-line UsageError); warn when it is a colour
    image or not two-tone. With `fit` crop or stretch a 3:4 mask is fine too: it is framed as the photo is
    (what `ootd mask` and --save-intermediates write then). `raw_mask`: the mask as the user gave it, when the
    request holds it decoded (its colours are gone then). Returns the request marked as checked (run_tryon then
    does not check again)."""
    import numpy as np

    if request.mask is None or request.mask_checked:
        return request
    label = request.label("mask")
    person = _image(request.source("person"), "person")
    mask = _image(request.source("mask"), "mask")
    framed_ok = fit is not FitMode.PAD and not aspect_mismatch(PREPROCESS_RESOLUTION.size, mask.size)  # 3:4
    if aspect_mismatch(person.size, mask.size) and not framed_ok:
        also = "" if fit is FitMode.PAD else " (or 3:4, framed like the results)"
        raise UsageError.about(
            "mask", "mask {label} is {width}x{height} but the person photo {person} is {photo}: a mask must have the "
            "photo's aspect{also}; start from {@automatic_mask|the automatic mask of the photo}", label=label,
            width=mask.width, height=mask.height, person=request.label("person"),
            photo=f"{person.width}x{person.height}", also=also)
    if _is_colour(raw_mask if raw_mask is not None else request.source("mask")):
        logger.warning("mask %s is a colour image: it is read as grey levels, pixels >= 127 repainted", label)
    else:
        grey = float(((np.asarray(mask) > 0) & (np.asarray(mask) < 255)).mean())
        if grey > GREY_LIMIT:
            logger.warning("mask %s is not two-tone (%.0f%% of its pixels are neither black nor white): pixels "
                           ">= 127 are repainted", label, grey * 100)
    return replace(request, mask_checked=True)


@dataclass
class MaskOutcome:
    """The mask of one person photo and the pictures that explain it, framed like try-on results."""

    images: dict[str, Image.Image]  # MASK_FILES
    category: Category
    model_type: ModelType
    working_mask: Image.Image | None = None  # the mask in the whole working frame (padding included)


# the way around a photo without a person that each command offers, naming the settings and inputs it takes as
# `{@mask}` (each front end words them: `--mask`, the form's `mask`)
RUN_REMEDY = "or give a mask image with {@mask}"  # a try-on of one photo (`ootd run`, the server, a node)
BATCH_REMEDY = "or give its mask: {@masks} DIR (named like the person photos) or the CSV's mask column"
MASK_REMEDY = ("or paint the mask yourself (white = repaint, the photo's aspect) and give it to "
               "`ootd run --mask`")  # `ootd mask` has no --mask
PREPARE_REMEDY = "or list it with its mask in a pairs CSV (person,garment,category,mask)"  # `ootd train prepare`


class PersonNotFound(NoPersonError):
    """The pose model's error with its parts: the photo, and the way around it (`remedy`) that the command
    showing it offers; `with_remedy` words it for another command (a batch's pair runs the try-on's code)."""

    def __init__(self, person: str | Path, remedy: str = RUN_REMEDY) -> None:
        self.person, self.remedy = person, remedy
        template = ("no person detected in {person} (pose estimation found nobody; use a photo showing one person, "
                    + remedy + ")")
        super().__init__(fill(template, library_name, person=person))
        # about the `mask` input: each front end words the remedy's names (OotdError.words)
        self.setting, self._template = "mask", (template, None, {"value": None, "person": person})

    def with_remedy(self, remedy: str) -> PersonNotFound:
        return PersonNotFound(self.person, remedy)

    def __reduce__(self) -> tuple[type[PersonNotFound], tuple[str | Path, str]]:
        """Pickled by its parts (its message is made from them), so a Ray replica's error arrives as itself."""
        return PersonNotFound, (self.person, self.remedy)


def no_person_error(person: str | Path, remedy: str = RUN_REMEDY) -> PersonNotFound:
    """The pose model's error, naming the file and the way around it that the asking front end offers."""
    return PersonNotFound(person, remedy)


# What each file `ootd mask` writes shows, in the order it lists them (pose and parsing are drawn at the pose
# model's working size, 384 px wide, the parsing with its colour legend beside it)
MASK_FILES = {
    "mask": "the mask: white = repaint; fix it and give it to `ootd run --mask`",
    "masked_person": "the person as the try-on sees it: grey = repainted",
    "pose": "the pose found, at the pose model's working size",
    "parsing": "the body parts found (colour legend on the right), at the parsing model's working size",
}


def mask_targets(person_name: str, category: Category, config: RunConfig) -> dict[str, Path]:
    """`<person>__<category>__<kind>.png` in the output folder, per MASK_FILES."""
    stem = f"{sanitise_stem(Path(person_name).stem)}__{category.value}"
    return {kind: config.output / f"{stem}__{kind}.png" for kind in MASK_FILES}


def describe_mask_file(kind: str, image: Image.Image) -> str:
    """One line on what a file of `ootd mask` shows, with its size (they differ: see MASK_FILES)."""
    return f"{kind}, {image.width}x{image.height}: {MASK_FILES[kind]}"


@dataclass(frozen=True)
class MaskJob:
    """`ootd mask`'s job: the mask of one person photo for one category (checked by
    ootd/app/tryon/preflight.py `prepare_mask_job`), made by `run` and written by `save`."""

    config: RunConfig
    person: Any  # decoded
    label: str  # how messages name the photo
    category: Category
    model_type: ModelType
    targets: dict[str, Path]

    def run(self, preprocessor: Any) -> MaskOutcome:
        """Pose, parsing, mask and masked person of the photo, as a try-on with this config would make them
        (framing, working resolution, mask growth: ootd.preprocessing.mask_person), without the diffusion
        models; framed like try-on results."""
        config = self.config
        try:
            masked = mask_person(self.person, self.category, self.model_type, config.sampling.resolution,
                                 config.fit, config.mask_grow, preprocessor=preprocessor)
        except NoPersonError:
            raise no_person_error(self.label, MASK_REMEDY) from None
        framed = masked.framed_like_results()
        return MaskOutcome({k: framed[k] for k in MASK_FILES}, self.category, self.model_type, masked.mask)

    def save(self, outcome: MaskOutcome) -> dict[str, Path]:
        """Every file, atomically, with the record of what made the mask."""
        metadata = mask_record(Path(self.label).name, self.category, self.model_type, self.config)
        for kind, path in self.targets.items():
            save_png_atomic(outcome.images[kind], path, metadata, overwrite=self.config.overwrite)
        return dict(self.targets)


def mask_in_person_frame(mask: Image.Image, person_size: tuple[int, int], fit: FitMode) -> Image.Image:
    """The working-resolution mask mapped back onto the person photo, so a mask painted over the photo and sent
    back as `mask` is framed as the photo is (pad and stretch map back to within a pixel; crop keeps the kept
    region and leaves the cut-off border unmasked)."""
    from PIL import Image

    from ootd.imaging.framing import fit_to_aspect, restore_framing

    _, info = fit_to_aspect(Image.new("L", person_size), mask.size, fit, pad_color=0, resample=Image.NEAREST)
    restored = restore_framing(mask, info, resample=Image.NEAREST)
    if info.mode != "crop":
        return restored
    canvas = Image.new("L", person_size, 0)
    canvas.paste(restored, info.box[:2])
    return canvas
