"""The person -> mask step (docs/upstream.md §2, §6-§8): framing the person photo, pose + parsing at 384x512 (or
a user's mask), the inpainting mask at the working resolution and the masked person.

`mask_person` is the one place this happens: the pipeline's `prepare_person`, `ootd mask`, the early "is there
a person?" check of `ootd run` and the server, an outfit's masks (from one parse: `ParseOnce`) and `ootd train
prepare` all call it; its result (`PersonMask`) is handed to the pipeline's `encode_person`, so nothing is
computed twice; `frame_like_results` is where the framing is undone for the pictures made of the framed person.
The pose and parsing models (`Preprocessor`) load only when a mask has to be made: a run with a user mask never
needs their files.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from ootd import errors
from ootd.imaging.framing import FitInfo, fit_to_aspect, restore_framing
from ootd.imaging.masks import binarize_mask, grow_mask, masked_person_image
from ootd.settings import PREPROCESS_RESOLUTION, Category, FitMode, ModelType, ParsingProvider, Resolution
from ootd.weights.layout import Layout, require_file

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def ootd_errors() -> Iterator[None]:
    """preprocess/ raises its own errors (it does not import ootd); each becomes ootd's typed error of the
    same name, so exit codes and messages are those of the rest of the program."""
    from preprocess import errors as preprocess_errors

    try:
        yield
    except preprocess_errors.PreprocessError as exc:
        ours = getattr(errors, type(exc).__name__, errors.OotdError)
        raise ours(str(exc)) from exc


@dataclass
class MaskResult:
    mask: Image.Image  # "L" 255 inside, 384x512
    keypoints: np.ndarray  # (18, 2) in 384x512 pixels
    labels: np.ndarray  # (512, 384) ATR labels + 18 neck
    intermediates: dict[str, Image.Image] = field(default_factory=dict)


class Preprocessor:
    """Makes the inpainting mask of a person image the way the released weights expect it."""

    def __init__(self, pose, parser) -> None:  # noqa: ANN001 - PoseEstimator, HumanParser
        self.pose = pose
        self.parser = parser

    @classmethod
    def from_checkpoints(cls, root: Path, device: torch.device | str = "cpu",
                         parsing_provider: ParsingProvider = ParsingProvider.CPU, threads: int | None = None,
                         ) -> Preprocessor:
        """Pose and parsing from the released layout; `threads`: ONNX Runtime's (None: its default)."""
        from preprocess.parsing import HumanParser
        from preprocess.pose import PoseEstimator

        layout = Layout(Path(root))
        for path in (layout.body_pose, layout.parsing_atr, layout.parsing_lip):
            require_file(path, layout)
        with ootd_errors():
            pose = PoseEstimator.from_checkpoint(layout.body_pose, device)
            # preprocess/ knows nothing of ootd: it takes the provider's word
            parser = HumanParser(layout.parsing_atr, layout.parsing_lip,
                                 provider=ParsingProvider(parsing_provider).value, threads=threads)
        return cls(pose, parser)

    @property
    def parsing_providers(self) -> list[str]:
        return list(getattr(self.parser, "providers", []))

    def __call__(self, person: Image.Image, category: Category, model_type: ModelType, grow: int = 0) -> MaskResult:
        """`person` is the 3:4 person image (any size); pose and parsing see it at 384x512."""
        small, keypoints, labels = self.parse(person)
        return self.mask_from(small, keypoints, labels, category, model_type, grow)

    def parse(self, person: Image.Image) -> tuple[Image.Image, np.ndarray, np.ndarray]:
        """Pose and parsing of the 3:4 person image, at 384x512: (that view, keypoints, labels). An outfit makes
        both garments' masks from one parse (`mask_from`)."""
        small = parse_view(person)
        with ootd_errors():
            keypoints = self.pose(small)
            labels = self.parser(small)
        return small, keypoints, labels

    def mask_from(self, small: Image.Image, keypoints: np.ndarray, labels: np.ndarray, category: Category,
                  model_type: ModelType, grow: int = 0) -> MaskResult:
        """The inpainting mask of one category and model from a parse (`parse`)."""
        from preprocess.masking import inpaint_mask
        from preprocess.parsing import colorize
        from preprocess.pose import draw_pose

        with ootd_errors():
            mask, _mask_gray = inpaint_mask(labels, keypoints, category.mask_name, model_type.value, grow=grow)
        intermediates = {"pose": draw_pose(small, keypoints), "parsing": colorize(labels)}
        return MaskResult(mask=mask, keypoints=keypoints, labels=labels, intermediates=intermediates)


def parse_view(person: Image.Image) -> Image.Image:
    """What pose and parsing see of a 3:4 person image: its RGB view at 384x512."""
    return person.convert("RGB").resize(PREPROCESS_RESOLUTION.size)


def view_key(view: Image.Image) -> str:
    """A digest of a `parse_view`'s pixels: two images with the same key have the same parse."""
    return hashlib.blake2b(view.tobytes(), digest_size=16).hexdigest()


@dataclass(frozen=True, eq=False)
class PhotoParse:
    """One pose + parsing of a framed person photo (`framed`, at any size), so whoever frames the photo the same
    way again (the preservation measure) finds it by `key` instead of parsing again: it travels with the mask made
    from it (`PersonMask.parse`, the pipeline's `PersonInputs.parse`)."""

    framed: Image.Image
    keypoints: np.ndarray  # (18, 2) in 384x512 pixels
    labels: np.ndarray  # (512, 384)

    @functools.cached_property
    def key(self) -> str:
        """The `view_key` of what was parsed (computed when first asked for: only a measure asks)."""
        return view_key(parse_view(self.framed))


class ParseOnce:
    """A Preprocessor that parses a photo once however many masks are made from it (an outfit's every pass's
    mask, the rows of one photo in `ootd train prepare`), counting its parses."""

    def __init__(self, preprocessor: Preprocessor) -> None:
        self.preprocessor = preprocessor
        self.parses = 0
        self._last: tuple[str, tuple[Image.Image, np.ndarray, np.ndarray]] | None = None

    def __call__(self, person: Image.Image, category: Category, model_type: ModelType, grow: int = 0) -> MaskResult:
        key = view_key(parse_view(person))
        if self._last is None or self._last[0] != key:
            self._last = (key, self.preprocessor.parse(person))
            self.parses += 1
        return self.preprocessor.mask_from(*self._last[1], category, model_type, grow)


def frame_like_results(pictures: dict[str, Image.Image], fit: FitInfo) -> dict[str, Image.Image]:
    """Pictures of the framed person (mask, masked person, pose, parsing) with the padding cut away again, as the
    results are (no resample): the one place a try-on's framing is undone for them, so every saved picture of a
    --fit pad try-on has the photo's framing."""
    return {kind: restore_framing(picture, fit, keep_scale=True) for kind, picture in pictures.items()}


@dataclass
class PersonMask:
    """A person photo made ready for encoding: framed at the working resolution, its mask and masked person."""

    category: Category
    model_type: ModelType  # the masking rules differ per model (docs/upstream.md §8)
    resolution: Resolution
    person: Image.Image  # framed 3:4 at the working resolution
    fit: FitInfo  # how it was framed, to map results back
    mask: Image.Image  # "L", 255 = repaint, at the working resolution
    masked_person: Image.Image
    intermediates: dict[str, Image.Image]  # pose, parsing (an automatic mask), mask, masked person
    parse: PhotoParse | None = None  # the pose + parsing an automatic mask came from (the preservation measure's)

    def framed_like_results(self) -> dict[str, Image.Image]:
        """The intermediates with the padding cut away again, as the results are (what `ootd mask` and
        --save-intermediates write)."""
        return frame_like_results(self.intermediates, self.fit)


def mask_person(person: Image.Image, category: Category, model_type: ModelType, resolution: Resolution,
                fit: FitMode, grow: int, *, mask: Image.Image | None = None,
                preprocessor: Preprocessor | None = None) -> PersonMask:
    """Frame the person once, straight to the working resolution (docs/upstream.md §2), and make its mask: from
    pose + parsing on the 384x512 view (`preprocessor`; NoPersonError when nobody is found), or from the user's
    `mask` (framed as the photo, binarized, grown by `grow` pixels of a 512 px high frame)."""
    framed, fit_info = fit_to_aspect(person, resolution.size, fit, pad_color="edge")
    intermediates: dict[str, Image.Image] = {}
    parse = None
    if mask is None:
        if preprocessor is None:
            raise ValueError("an automatic mask needs the pose and parsing models")
        made = preprocessor(framed, category, model_type, grow=grow)
        mask, intermediates = made.mask, dict(made.intermediates)
        parse = PhotoParse(framed, made.keypoints, made.labels)
    else:
        mask, _ = fit_to_aspect(mask, resolution.size, fit, pad_color=0, resample=Image.NEAREST)
        mask = grow_mask(binarize_mask(mask), grow * resolution.height // PREPROCESS_RESOLUTION.height)
    # the automatic mask is made at 384x512 and resized NEAREST to the working size (docs/upstream.md §8);
    # a user mask is already there (the resize is then a copy)
    mask = binarize_mask(mask.resize(resolution.size, Image.NEAREST))
    masked = masked_person_image(framed, mask)
    intermediates.update(mask=mask, masked_person=masked)
    return PersonMask(category, model_type, resolution, framed, fit_info, mask, masked, intermediates, parse)
