"""Pose + parsing -> the inpainting mask, at 384x512 (docs/upstream.md §2, §6-§8).

Loaded lazily by the pipeline: a run with a user mask never needs the pose and parsing files.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ootd import errors
from ootd.checkpoints import Layout, require_file
from ootd.config import PREPROCESS_RESOLUTION, Category, ModelType

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
                         parsing_provider: str = "cpu") -> Preprocessor:
        from preprocess.parsing import HumanParser
        from preprocess.pose import PoseEstimator

        layout = Layout(Path(root))
        for path in (layout.body_pose, layout.parsing_atr, layout.parsing_lip):
            require_file(path, layout)
        with ootd_errors():
            pose = PoseEstimator.from_checkpoint(layout.body_pose, device)
            parser = HumanParser(layout.parsing_atr, layout.parsing_lip, provider=parsing_provider)
        return cls(pose, parser)

    @property
    def parsing_providers(self) -> list[str]:
        return list(getattr(self.parser, "providers", []))

    def __call__(self, person: Image.Image, category: Category, model_type: ModelType, grow: int = 0) -> MaskResult:
        """`person` is the 3:4 person image (any size); pose and parsing see it at 384x512."""
        from preprocess.masking import inpaint_mask
        from preprocess.parsing import colorize
        from preprocess.pose import draw_pose

        small = person.convert("RGB").resize(PREPROCESS_RESOLUTION.size)
        with ootd_errors():
            keypoints = self.pose(small)
            labels = self.parser(small)
            mask, _mask_gray = inpaint_mask(labels, keypoints, category.mask_name, model_type.value, grow=grow)
        intermediates = {"pose": draw_pose(small, keypoints), "parsing": colorize(labels)}
        return MaskResult(mask=mask, keypoints=keypoints, labels=labels, intermediates=intermediates)
