"""The inpainting mask: which person pixels the try-on UNet repaints (docs/upstream.md §8).

The released weights were trained on masks built by one procedure (the reference's
`get_mask_location`), so this module reproduces it: garment labels grown by dilation, arms redrawn
from the pose as thick polylines (so long sleeves can replace short ones and vice versa), hands,
head, shoes and the other garment kept, holes filled and only the largest region kept.

One upstream defect is deliberately not reproduced (docs/upstream.md §9): arm polyline coordinates stay signed,
so a wrist extended past the left or top edge is clipped by the drawing instead of wrapping around
to ~65,000 and painting a band across the image.
"""

from __future__ import annotations

import logging

import cv2
import numpy as np
from PIL import Image, ImageDraw

from preprocess.errors import UsageError

logger = logging.getLogger(__name__)

MASK_WIDTH = 384
MASK_HEIGHT = 512

CATEGORIES = ("upper_body", "lower_body", "dresses")
MODEL_TYPES = ("hd", "dc")
ARM_WIDTH = {"hd": 60, "dc": 45}  # px at height 512
WRIST_EXTENSION = 1.2

# ATR labels (plus 18 = neck) as produced by preprocess.parsing.
BACKGROUND, HAT, HAIR, SUNGLASSES, UPPER_CLOTHES, SKIRT, PANTS, DRESS, BELT = range(9)
LEFT_SHOE, RIGHT_SHOE, FACE, LEFT_LEG, RIGHT_LEG, LEFT_ARM, RIGHT_ARM, BAG, SCARF, NECK = range(9, 19)

# COCO-18 keypoint indices used here.
R_SHOULDER, R_ELBOW, R_WRIST, L_SHOULDER, L_ELBOW, L_WRIST = 2, 3, 4, 5, 6, 7

_KERNEL = np.ones((5, 5), dtype=np.uint8)


def arm_line_width(model_type: str, height: int = MASK_HEIGHT) -> int:
    """Arm polyline width in px: 60 (hd) or 45 (dc) at height 512, scaled with the height."""
    if model_type not in ARM_WIDTH:
        raise UsageError(f"model type must be one of {', '.join(MODEL_TYPES)}, not {model_type!r}")
    return int(ARM_WIDTH[model_type] / 512 * height)


def is_missing(point: np.ndarray) -> bool:
    """OpenPose reports a missing keypoint as (0, 0); the reference treats (<=1, <=1) as missing."""
    return bool(point[0] <= 1.0 and point[1] <= 1.0)


def extend_from(elbow: np.ndarray, wrist: np.ndarray, factor: float = WRIST_EXTENSION) -> np.ndarray:
    """The wrist moved `factor` times as far from the elbow, so the drawn sleeve covers the cuff."""
    return elbow + factor * (wrist - elbow)


def draw_arm(
    shoulder: np.ndarray,
    elbow: np.ndarray,
    wrist: np.ndarray,
    width: int,
    size: tuple[int, int] = (MASK_WIDTH, MASK_HEIGHT),
    reverse: bool = False,
) -> np.ndarray:
    """Boolean (H, W) canvas with one arm: a `width`-px polyline shoulder -> elbow -> extended wrist
    with rounded ('curve') joints, plus a disc of diameter `width` at the shoulder.

    Coordinates are truncated to signed int32 and drawing clips them, so points outside the frame
    (negative ones included) never wrap around. `reverse` draws the polyline wrist-first (the
    reference draws the left arm that way; it only moves a few edge pixels).
    """
    canvas = Image.new("L", size, 0)
    draw = ImageDraw.Draw(canvas)
    tip = extend_from(np.asarray(elbow, dtype=np.float64), np.asarray(wrist, dtype=np.float64))
    points = [np.asarray(shoulder, dtype=np.float64), np.asarray(elbow, dtype=np.float64), tip]
    if reverse:
        points.reverse()
    xy = np.concatenate(points).astype(np.int32).tolist()
    draw.line(xy, fill=255, width=width, joint="curve")
    half = width // 2
    sx, sy = float(shoulder[0]), float(shoulder[1])
    draw.arc([sx - half, sy - half, sx + half, sy + half], 0, 360, fill=255, width=half)
    return np.asarray(canvas) > 0


def fill_mask_holes(mask: np.ndarray, clear_border: bool = True) -> np.ndarray:
    """Fill every region of False that the image corner cannot reach (4-connected flood fill).

    With `clear_border` the outermost 1-px frame is cleared first, as the reference does, so the
    corner is always outside and a mask touching the edge still gets its holes filled.
    """
    work = np.asarray(mask, dtype=bool)
    if clear_border:
        work = work.copy()
        work[0, :] = work[-1, :] = False
        work[:, 0] = work[:, -1] = False
        canvas = work.astype(np.uint8) * 255
        offset = 0
    else:
        canvas = np.pad(work.astype(np.uint8) * 255, 1)
        offset = 1
    flood = np.zeros((canvas.shape[0] + 2, canvas.shape[1] + 2), dtype=np.uint8)
    cv2.floodFill(canvas, flood, (0, 0), 255)
    holes = canvas == 0
    if offset:
        holes = holes[1:-1, 1:-1]
    return work | holes


def largest_region(mask: np.ndarray) -> np.ndarray:
    """Keep only the contour with the largest area (drawn filled), as the reference does."""
    contours, _ = cv2.findContours(
        np.asarray(mask, dtype=np.uint8) * 255, cv2.RETR_CCOMP, cv2.CHAIN_APPROX_TC89_L1
    )
    out = np.zeros(mask.shape, dtype=np.uint8)
    if contours:
        areas = [abs(cv2.contourArea(c, True)) for c in contours]
        cv2.drawContours(out, contours, int(np.argmax(areas)), color=255, thickness=-1)
    return out > 0


def _dilate(mask: np.ndarray, iterations: int) -> np.ndarray:
    return cv2.dilate(mask.astype(np.uint8), _KERNEL, iterations=iterations) > 0


def prepare_labels(labels: np.ndarray) -> np.ndarray:
    """An (H, W) label map as uint8 at 384x512 (resized NEAREST when it has another size)."""
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(f"labels must be an (H, W) label map, got shape {labels.shape}")
    labels = labels.astype(np.uint8)
    if labels.shape != (MASK_HEIGHT, MASK_WIDTH):
        resized = Image.fromarray(labels).resize((MASK_WIDTH, MASK_HEIGHT), Image.Resampling.NEAREST)
        labels = np.asarray(resized)
    return labels


def _prepare_keypoints(keypoints: np.ndarray) -> np.ndarray:
    keypoints = np.asarray(keypoints, dtype=np.float64)
    if keypoints.ndim != 2 or keypoints.shape[0] < 18 or keypoints.shape[1] < 2:
        raise ValueError(f"keypoints must be (18, 2) pixel coordinates, got shape {keypoints.shape}")
    return np.nan_to_num(keypoints[:18, :2], nan=0.0)  # NaN = not found, like (0, 0)


def hand_pixels(labels: np.ndarray, keypoints: np.ndarray, model_type: str) -> np.ndarray:
    """Boolean 512x384 map of the hands as the upper-body and dress masks keep them: the parsed arm pixels
    outside each arm drawn from the pose (`_arm_regions`); none for an arm whose wrist was not found."""
    arm_line_width(model_type)  # validates model_type
    return _arm_regions(prepare_labels(labels), _prepare_keypoints(keypoints), model_type)[2]


def _arm_regions(
    labels: np.ndarray, keypoints: np.ndarray, model_type: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(drawn left arm, drawn right arm, hands) for upper_body / dresses.

    An arm whose wrist is missing falls back to its parsed pixels (and has no separate hand);
    otherwise the hand is the parsed arm outside the drawn arm, and is kept.
    """
    width = arm_line_width(model_type)
    scale = MASK_HEIGHT / 512.0
    kp = keypoints * scale
    left_parsed = labels == LEFT_ARM
    right_parsed = labels == RIGHT_ARM

    if is_missing(kp[R_WRIST]):
        right = right_parsed
    else:
        right = draw_arm(kp[R_SHOULDER], kp[R_ELBOW], kp[R_WRIST], width)
    if is_missing(kp[L_WRIST]):
        left = left_parsed
    else:
        left = draw_arm(kp[L_SHOULDER], kp[L_ELBOW], kp[L_WRIST], width, reverse=True)

    hands = (left_parsed & ~left) | (right_parsed & ~right)
    return left, right, hands


def mask_array(labels: np.ndarray, keypoints: np.ndarray, category: str, model_type: str) -> np.ndarray:
    """Boolean 512x384 inpainting mask (True = repaint); see `inpaint_mask`."""
    if category not in CATEGORIES:
        raise UsageError(f"category must be one of {', '.join(CATEGORIES)}, not {category!r}")
    arm_line_width(model_type)  # validates model_type
    labels = prepare_labels(labels)
    keypoints = _prepare_keypoints(keypoints)

    head = np.isin(labels, (HAT, SUNGLASSES, FACE))
    fixed = np.isin(labels, (LEFT_SHOE, RIGHT_SHOE, HAT, SUNGLASSES, BAG))

    if category == "upper_body":
        region = np.isin(labels, (UPPER_CLOTHES, DRESS))
        fixed |= np.isin(labels, (SKIRT, PANTS))
    elif category == "lower_body":
        region = np.isin(labels, (PANTS, LEFT_LEG, RIGHT_LEG, SKIRT))
        fixed |= np.isin(labels, (UPPER_CLOTHES, LEFT_ARM, RIGHT_ARM))
    else:  # dresses
        region = np.isin(labels, (DRESS, UPPER_CLOTHES, SKIRT, PANTS))
    # Background plus every labelled pixel not fixed so far may be repainted.
    changeable = (labels == BACKGROUND) | ((labels != BACKGROUND) & ~fixed)

    arms = None
    if category in ("upper_body", "dresses"):
        left, right, hands = _arm_regions(labels, keypoints, model_type)
        fixed |= hands
        arms = left | right

    fixed |= head
    region = _dilate(region, 5)
    if arms is not None:
        neck = _dilate(labels == NECK, 1) & ~head
        region |= neck
        region |= _dilate(arms, 4)

    keep = (changeable & ~region) | fixed
    mask = fill_mask_holes(~keep, clear_border=True)
    return largest_region(mask)


def dilate(mask: np.ndarray, pixels: int) -> np.ndarray:
    """Grow a uint8 mask by `pixels` in every direction (an elliptic kernel, so corners stay round)."""
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * pixels + 1, 2 * pixels + 1))
    return cv2.dilate(mask, kernel)


def inpaint_mask(
    labels: np.ndarray, keypoints: np.ndarray, category: str, model_type: str, grow: int = 0
) -> tuple[Image.Image, Image.Image]:
    """(mask, mask_gray) PIL "L" images of 384x512: 255 (mask) / 127 (mask_gray) inside, 0 outside.

    `labels`: (H, W) ATR labels + 18 = neck; resized NEAREST to 384x512 when it has another size.
    `keypoints`: (18, 2) COCO-18 (x, y) in pixels of the 384x512 frame, whatever the label map's
    size; (0, 0) for a missing point. `category`: upper_body | lower_body | dresses; `model_type`:
    hd | dc (arm width). `grow` > 0 dilates the final mask by that many pixels (--mask-grow) and
    fills any hole that creates; 0 gives exactly the reference mask.
    """
    if not 0 <= grow <= MASK_HEIGHT:  # a larger kernel only covers the frame, and crashes OpenCV when huge
        raise UsageError(f"mask grow must be 0 to {MASK_HEIGHT} pixels, got {grow}")
    mask = mask_array(labels, keypoints, category, model_type)
    if grow > 0:
        mask = dilate(mask.astype(np.uint8), grow) > 0
        mask = fill_mask_holes(mask, clear_border=False)
    if not mask.any():
        logger.warning("the %s inpainting mask is empty: the parsing found no garment to replace", category)
    values = mask.astype(np.uint8)
    return Image.fromarray(values * 255), Image.fromarray(values * 127)
