"""The body regions whose pixels a try-on should keep, from a parse (ATR labels + neck, preprocess/parsing.py)
and the pose: face, hair, neck, arms, hands, legs, shoes and background. The garments, the hat, sunglasses, belt,
bag and scarf are in none (a try-on may change them). Hands are what the mask rules call hands
(preprocess/masking.py `hand_pixels`: the parsed arm beyond the arm drawn from the pose); the arms are the rest
of the parsed arms."""

from __future__ import annotations

import numpy as np

from preprocess.masking import (
    BACKGROUND,
    FACE,
    HAIR,
    LEFT_ARM,
    LEFT_LEG,
    LEFT_SHOE,
    NECK,
    RIGHT_ARM,
    RIGHT_LEG,
    RIGHT_SHOE,
    hand_pixels,
    prepare_labels,
)

REGIONS = ("face", "hair", "neck", "arms", "hands", "legs", "shoes", "background")
NO_REGION = 255  # a pixel in none of them
_LABELS = {"face": (FACE,), "hair": (HAIR,), "neck": (NECK,), "arms": (LEFT_ARM, RIGHT_ARM),
           "legs": (LEFT_LEG, RIGHT_LEG), "shoes": (LEFT_SHOE, RIGHT_SHOE), "background": (BACKGROUND,)}


def body_regions(labels: np.ndarray, keypoints: np.ndarray, model_type: str) -> np.ndarray:
    """uint8 512x384 map: each pixel's index in REGIONS, or NO_REGION. `labels` as `inpaint_mask` takes them
    (resized NEAREST to 384x512 when needed), `keypoints` (18, 2) in that frame; `model_type` (hd, dc) sets the
    width of the arm drawn from the pose, as for the mask."""
    labels = prepare_labels(labels)
    out = np.full(labels.shape, NO_REGION, dtype=np.uint8)
    for index, name in enumerate(REGIONS):
        if name in _LABELS:
            out[np.isin(labels, _LABELS[name])] = index
    out[hand_pixels(labels, keypoints, model_type)] = REGIONS.index("hands")
    return out
