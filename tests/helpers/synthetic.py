"""Synthetic pose and parsing: one standing person, as network maps and as a label map, so the automatic-mask
path runs without real pose/parsing weights (the tiny tree's random ones find nobody)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from preprocess.pose_decode import LIMBS

W, H = 384, 512

# A standing person facing the camera in a 384x512 image (x, y), COCO-18 order.
PERSON = np.array(
    [
        (192, 80),  # nose
        (192, 130),  # neck
        (152, 132),  # right shoulder (image left)
        (140, 200),  # right elbow
        (135, 262),  # right wrist
        (232, 132),  # left shoulder
        (244, 200),  # left elbow
        (249, 262),  # left wrist
        (168, 270),  # right hip
        (165, 360),  # right knee
        (163, 452),  # right ankle
        (216, 270),  # left hip
        (219, 360),  # left knee
        (221, 452),  # left ankle
        (183, 71),  # right eye
        (201, 71),  # left eye
        (174, 77),  # right ear
        (210, 77),  # left ear
    ],
    dtype=np.float64,
)


def render_maps(
    people: list[np.ndarray], height: int = H, width: int = W, sigma: float = 5.0, limb_width: float = 4.0
) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic network output at image size: a Gaussian blob per present keypoint, and unit vectors
    along each limb (within limb_width px of it) in that limb's PAF channels. NaN = missing keypoint."""
    heat = np.zeros((height, width, 19))
    pafs = np.zeros((height, width, 38))

    def window(x0: float, y0: float, x1: float, y1: float, margin: float) -> tuple[slice, slice, np.ndarray]:
        """Pixel grid of a box around a point or segment (rendering only there keeps this fast)."""
        top, bottom = max(0, int(min(y0, y1) - margin)), min(height, int(max(y0, y1) + margin) + 1)
        left, right = max(0, int(min(x0, x1) - margin)), min(width, int(max(x0, x1) + margin) + 1)
        grid = np.mgrid[top:bottom, left:right].astype(np.float64)
        return slice(top, bottom), slice(left, right), grid

    for pts in people:
        for part, (x, y) in enumerate(pts):
            if not np.isnan(x):
                rows, cols, (yy, xx) = window(x, y, x, y, 5 * sigma)
                blob = np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / (2 * sigma**2))
                heat[rows, cols, part] = np.maximum(heat[rows, cols, part], blob)
        for a, b, cx, cy in LIMBS:
            if np.isnan(pts[a]).any() or np.isnan(pts[b]).any():
                continue
            d = pts[b] - pts[a]
            length = np.hypot(*d)
            u = d / length
            rows, cols, (yy, xx) = window(*pts[a], *pts[b], limb_width + 1)
            rx, ry = xx - pts[a][0], yy - pts[a][1]
            along = rx * u[0] + ry * u[1]
            across = np.abs(-rx * u[1] + ry * u[0])
            on = (along >= -limb_width) & (along <= length + limb_width) & (across <= limb_width)
            pafs[rows, cols, cx][on] = u[0]
            pafs[rows, cols, cy][on] = u[1]
    heat[:, :, 18] = 1.0 - heat[:, :, :18].max(axis=2)
    return heat.astype(np.float32), pafs.astype(np.float32)


def person_labels() -> np.ndarray:
    """A frontal person. The person's right arm (15) is on the image's left, as in ATR."""
    lab = np.zeros((H, W), np.uint8)
    lab[30:75, 160:224] = 2  # hair
    lab[55:120, 167:217] = 11  # face
    lab[120:142, 180:204] = 18  # neck
    lab[140:300, 130:254] = 4  # upper clothes
    lab[145:325, 100:130] = 15  # right arm incl. hand (y > ~305)
    lab[145:325, 254:284] = 14  # left arm incl. hand
    lab[300:450, 140:244] = 6  # pants
    lab[450:490, 140:185] = 9  # shoes
    lab[450:490, 199:244] = 10
    return lab



def synthetic_preprocessor() -> Any:
    """Pose from synthetic network maps of PERSON, parsing from `person_labels()`: the automatic-mask path on
    the tiny tree."""
    from ootd.preprocessing import Preprocessor
    from preprocess.pose import PoseEstimator

    maps = render_maps([PERSON])
    labels = person_labels()
    return Preprocessor(PoseEstimator(None, maps_fn=lambda bgr: maps), lambda image: labels)


def counted_preprocessor() -> tuple[Any, Counter]:
    """`synthetic_preprocessor` with the runs of its pose and of its parsing model counted (`runs["pose"]`,
    `runs["parsing"]`): what a photo's parse costs, however it is reached."""
    pre = synthetic_preprocessor()
    runs: Counter = Counter()

    def counted(name: str, model: Any) -> Any:
        def run(image: Any) -> Any:
            runs[name] += 1
            return model(image)
        return run

    pre.pose, pre.parser = counted("pose", pre.pose), counted("parsing", pre.parser)
    return pre, runs
