"""Inpainting mask properties on a hand-drawn person (384x512, ATR labels + 18 neck)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from PIL import Image

from preprocess.errors import UsageError
from preprocess.masking import (
    arm_line_width,
    draw_arm,
    extend_from,
    fill_mask_holes,
    inpaint_mask,
    is_missing,
    largest_region,
    mask_array,
)
from tests.helpers.synthetic import person_labels

W, H = 384, 512
ROWS = np.arange(H)[:, None]
COLS = np.arange(W)[None, :]


def keypoints() -> np.ndarray:
    kp = np.zeros((18, 2))
    kp[0] = (192, 95)  # nose
    kp[1] = (192, 145)  # neck
    kp[2], kp[3], kp[4] = (120, 152), (115, 222), (113, 290)  # right shoulder, elbow, wrist
    kp[5], kp[6], kp[7] = (264, 152), (269, 222), (271, 290)  # left shoulder, elbow, wrist
    kp[8], kp[11] = (165, 300), (219, 300)  # hips
    kp[9], kp[12] = (165, 375), (219, 375)  # knees
    kp[10], kp[13] = (165, 445), (219, 445)  # ankles
    return kp


LABELS = person_labels()
HANDS = np.isin(LABELS, (14, 15)) & (ROWS >= 312)  # below the extended wrist (y ~ 304) + line end


def is_one_region(mask: np.ndarray) -> bool:
    n, _ = cv2.connectedComponents(mask.astype(np.uint8), connectivity=8)
    return n == 2


def has_no_holes(mask: np.ndarray) -> bool:
    outside = np.pad(~mask, 1, constant_values=True).astype(np.uint8)
    n, _ = cv2.connectedComponents(outside, connectivity=4)
    return n == 2


def arr(img: Image.Image) -> np.ndarray:
    return np.asarray(img) > 0


def kept_out(mask: np.ndarray, region: np.ndarray) -> bool:
    """`region` is outside the mask, up to the 1-2 px the reference's contour approximation
    (cv2 TC89_L1, drawn filled) cuts across concave corners."""
    inner = cv2.erode(region.astype(np.uint8), np.ones((5, 5), np.uint8)) > 0
    return not mask[inner].any() and mask[region].sum() <= 0.05 * region.sum()


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def test_arm_line_width() -> None:
    assert arm_line_width("hd") == 60 and arm_line_width("dc") == 45
    assert arm_line_width("hd", 1024) == 120
    with pytest.raises(UsageError):
        arm_line_width("xl")


def test_missing_and_extension() -> None:
    assert is_missing(np.array([0.0, 0.0])) and is_missing(np.array([1.0, 0.5]))
    assert not is_missing(np.array([0.0, 2.0])) and not is_missing(np.array([5.0, 0.0]))
    np.testing.assert_allclose(extend_from(np.array([10.0, 10.0]), np.array([20.0, 30.0])), [22, 34])


def test_draw_arm_covers_polyline_with_width() -> None:
    band = draw_arm(np.array([100.0, 100.0]), np.array([100.0, 200.0]), np.array([100.0, 300.0]), 40)
    assert band.shape == (H, W)
    # Vertical line x = 100 from y = 100 to the extended wrist at y = 320, 40 px wide.
    assert band[150, 81:120].all() and not band[150, 78] and not band[150, 122]
    assert band[315, 100] and not band[325, 100]
    assert band[85, 100]  # the shoulder disc reaches above the line start


def test_draw_arm_clips_negative_coordinates() -> None:
    """docs/upstream.md §9 regression: an extended wrist beyond the top/left edge must not wrap around."""
    # Extended wrist lands at y = -2.4 (uint16 would make it 65534 and draw down the image).
    top = draw_arm(np.array([130.0, 150.0]), np.array([60.0, 60.0]), np.array([15.0, 8.0]), 60)
    assert top[:5].any() and not top[260:].any()
    # Extended wrist at x = -4 (uint16: 65532, a band across the whole width).
    left = draw_arm(np.array([130.0, 150.0]), np.array([50.0, 200.0]), np.array([5.0, 210.0]), 60)
    assert left[:, :3].any() and not left[:, 200:].any()


def test_fill_mask_holes_and_largest_region() -> None:
    m = np.zeros((50, 60), bool)
    m[10:40, 10:40] = True
    m[20:25, 20:25] = False
    m[0:50, 55:60] = True  # touches the border: cleared by the border rule
    filled = fill_mask_holes(m)
    assert filled[20:25, 20:25].all() and not filled[0, 57] and filled[5, 57]
    kept = fill_mask_holes(m, clear_border=False)
    assert kept[0, 57] and kept[20:25, 20:25].all()
    two = np.zeros((50, 60), bool)
    two[5:15, 5:15] = True
    two[20:45, 20:45] = True
    big = largest_region(two)
    assert big[30, 30] and not big[10, 10]
    assert not largest_region(np.zeros((5, 5), bool)).any()


# ---------------------------------------------------------------------------------------------
# inpaint_mask
# ---------------------------------------------------------------------------------------------

CASES = [(c, t) for c in ("upper_body", "lower_body", "dresses") for t in ("hd", "dc")]


@pytest.mark.parametrize(("category", "model_type"), CASES)
def test_output_format_and_shape(category: str, model_type: str) -> None:
    mask, gray = inpaint_mask(LABELS, keypoints(), category, model_type)
    for img in (mask, gray):
        assert isinstance(img, Image.Image) and img.mode == "L" and img.size == (W, H)
    m, g = np.asarray(mask), np.asarray(gray)
    assert set(np.unique(m)) == {0, 255} and set(np.unique(g)) == {0, 127}
    np.testing.assert_array_equal(g, (m > 0) * 127)
    assert is_one_region(m > 0) and has_no_holes(m > 0)


@pytest.mark.parametrize("model_type", ["hd", "dc"])
def test_upper_body(model_type: str) -> None:
    m = arr(inpaint_mask(LABELS, keypoints(), "upper_body", model_type)[0])
    assert m[LABELS == 4].all()
    assert m[LABELS == 18].all()  # neck
    for label in (11, 6, 9, 10):  # face, pants, shoes
        assert kept_out(m, LABELS == label), label
    assert kept_out(m, HANDS)
    arms_above_wrist = np.isin(LABELS, (14, 15)) & (ROWS < 295)
    assert m[arms_above_wrist].all()


@pytest.mark.parametrize("model_type", ["hd", "dc"])
def test_lower_body(model_type: str) -> None:
    m = arr(inpaint_mask(LABELS, keypoints(), "lower_body", model_type)[0])
    assert m[LABELS == 6].all()
    for label in (4, 11, 14, 15, 9, 10, 18):  # upper clothes, face, arms, shoes, neck
        assert kept_out(m, LABELS == label), label


@pytest.mark.parametrize("model_type", ["hd", "dc"])
def test_dresses(model_type: str) -> None:
    m = arr(inpaint_mask(LABELS, keypoints(), "dresses", model_type)[0])
    assert m[np.isin(LABELS, (4, 6, 18))].all()
    for label in (11, 9, 10):
        assert kept_out(m, LABELS == label), label
    assert kept_out(m, HANDS)


def test_arm_width_hd_wider_than_dc() -> None:
    kp = keypoints()
    hd = arr(inpaint_mask(LABELS, kp, "upper_body", "hd")[0])
    dc = arr(inpaint_mask(LABELS, kp, "upper_body", "dc")[0])
    assert hd.sum() > dc.sum()
    # Row through the right forearm, left of the torso: the band's left edge moves by ~(60-45)/2.
    row = 260
    hd_left = int(np.argmax(hd[row, :130]))
    dc_left = int(np.argmax(dc[row, :130]))
    assert 5 <= dc_left - hd_left <= 10


def test_missing_wrist_masks_parsed_arm_including_hand() -> None:
    kp = keypoints()
    kp[4] = (0, 0)  # right wrist missing
    m = arr(inpaint_mask(LABELS, kp, "upper_body", "hd")[0])
    assert m[LABELS == 15].all()  # the whole parsed right arm, hand included
    assert kept_out(m, HANDS & (LABELS == 14))  # the other hand is still kept
    assert is_one_region(m) and has_no_holes(m)
    kp[7] = (0, 0)
    m2 = arr(inpaint_mask(LABELS, kp, "dresses", "dc")[0])
    assert m2[np.isin(LABELS, (14, 15))].all()


def test_wrist_beyond_edges_draws_no_band() -> None:
    """docs/upstream.md §9: a sleeve extended past the top/left edge must stay local (no wraparound band)."""
    lab = LABELS.copy()
    kp = keypoints()
    kp[3], kp[4] = (60, 60), (15, 8)  # right arm raised to the top-left corner: tip at y < 0
    kp[6], kp[7] = (320, 210), (381, 212)  # left arm sideways to the right edge
    for model_type in ("hd", "dc"):
        m = arr(inpaint_mask(lab, kp, "upper_body", model_type)[0])
        assert not m[400:, :100].any() and not m[400:, 300:].any()
        assert is_one_region(m)
    kp = keypoints()
    kp[3], kp[4] = (50, 200), (5, 210)  # right forearm to the left edge: tip at x < 0
    m = arr(inpaint_mask(lab, kp, "upper_body", "hd")[0])
    assert m[200:215, :3].any()  # the sleeve reaches the edge...
    assert not m[:, 330:].any() and not m[330:, :120].any()  # ...and no band runs across the image


def test_grow_is_monotonic() -> None:
    kp = keypoints()
    masks = [arr(inpaint_mask(LABELS, kp, "upper_body", "hd", grow=g)[0]) for g in (0, 3, 8)]
    assert masks[0].sum() < masks[1].sum() < masks[2].sum()
    assert not (masks[0] & ~masks[1]).any() and not (masks[1] & ~masks[2]).any()
    assert has_no_holes(masks[2]) and is_one_region(masks[2])
    with pytest.raises(UsageError):
        inpaint_mask(LABELS, kp, "upper_body", "hd", grow=-1)


def test_other_label_sizes_are_resized_nearest() -> None:
    big = np.asarray(Image.fromarray(LABELS).resize((768, 1024), Image.Resampling.NEAREST))
    a = mask_array(LABELS, keypoints(), "upper_body", "hd")
    b = mask_array(big, keypoints(), "upper_body", "hd")
    np.testing.assert_array_equal(a, b)
    mask, _ = inpaint_mask(big, keypoints(), "upper_body", "hd")
    assert mask.size == (W, H)


def test_bad_arguments() -> None:
    with pytest.raises(UsageError):
        inpaint_mask(LABELS, keypoints(), "shoes", "hd")
    with pytest.raises(UsageError):
        inpaint_mask(LABELS, keypoints(), "upper_body", "xl")
    with pytest.raises(ValueError):
        inpaint_mask(LABELS, np.zeros((5, 2)), "upper_body", "hd")
    with pytest.raises(ValueError):
        inpaint_mask(np.zeros((H, W, 3), np.uint8), keypoints(), "upper_body", "hd")


def test_no_garment_gives_empty_mask() -> None:
    lab = np.zeros((H, W), np.uint8)
    lab[55:120, 167:217] = 11
    kp = np.zeros((18, 2))
    mask, gray = inpaint_mask(lab, kp, "lower_body", "dc")
    assert not np.asarray(mask).any() and not np.asarray(gray).any()
