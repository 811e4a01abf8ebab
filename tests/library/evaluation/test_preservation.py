"""Preservation figures (ootd/evaluation/preservation.py) on small pictures with known answers: an edit of one
region is change there and nowhere else, the seam and the mask split each region as documented, an absent region
is absent (not unchanged), and every figure equals an independent reference computed here with scikit-image
(SSIM map, rgb2lab + deltaE_ciede2000) and scipy (the seam's dilation)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.ndimage import binary_dilation, gaussian_filter

from ootd.evaluation.preservation import CHANGED_DELTA_E, MIN_SCORED_SHARE, Preservation, measure_preservation
from preprocess.regions import NO_REGION, REGIONS

skimage_color = pytest.importorskip("skimage.color")
skimage_metrics = pytest.importorskip("skimage.metrics")

H, W, SEAM = 96, 72, 3
LAYOUT = {"face": (0, 20, 0, 24), "hair": (0, 20, 24, 48), "neck": (20, 32, 0, 24), "arms": (20, 60, 48, 72),
          "hands": (60, 76, 48, 72), "shoes": (80, 96, 0, 36), "background": (32, 80, 0, 48)}  # legs: absent
MASK = (40, 70, 10, 60)  # rows, columns repainted


def picture() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A smooth photo, its regions (every one but legs; a garment's area in none) and the repainted mask."""
    rng = np.random.default_rng(0)
    photo = (gaussian_filter(rng.random((H, W, 3)), (3, 3, 0)) * 255 * 3 - 200).clip(0, 255).astype(np.uint8)
    regions = np.full((H, W), NO_REGION, np.uint8)
    for name, (r0, r1, c0, c1) in LAYOUT.items():
        regions[r0:r1, c0:c1] = REGIONS.index(name)
    mask = np.zeros((H, W), bool)
    mask[MASK[0]:MASK[1], MASK[2]:MASK[3]] = True
    return photo, regions, mask


def inverted(photo: np.ndarray, where: np.ndarray) -> np.ndarray:
    out = photo.copy()
    out[where] = 255 - out[where]
    return out


def parts(regions: np.ndarray, mask: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(kept, redrawn) pixels of a region, the seam worked out independently (a square's reach, scipy)."""
    seam = binary_dilation(mask, np.ones((2 * SEAM + 1, 2 * SEAM + 1), bool)) & ~mask
    region = regions == REGIONS.index(name)
    return region & ~mask & ~seam, region & mask


@pytest.mark.parametrize("name", ["face", "hands", "background"])
def test_an_edit_of_one_region_is_change_there_and_nowhere_else(name: str) -> None:
    photo, regions, mask = picture()
    kept, redrawn = parts(regions, mask, name)
    figures = measure_preservation(inverted(photo, kept), photo, regions, mask, SEAM)
    for region in figures.regions:
        if region.name == name:
            assert region.kept.changed == pytest.approx(np.mean(
                skimage_color.deltaE_ciede2000(skimage_color.rgb2lab(255 - photo[kept]),
                                               skimage_color.rgb2lab(photo[kept])) > CHANGED_DELTA_E))
            assert region.kept.changed > 0.5 and region.kept.ssim < 0.5
        elif not region.absent:
            for part in (region.kept, region.redrawn):
                assert part.changed in (None, 0.0) and part.delta_e in (None, 0.0), (region.name, part)
    assert figures.summary().startswith(f"{name} ") and figures.summary().endswith(" changed")
    assert figures.score == figures.region(name).kept.changed


def test_what_the_mask_and_its_seam_hold_is_not_kept() -> None:
    photo, regions, mask = picture()
    seam = binary_dilation(mask, np.ones((2 * SEAM + 1, 2 * SEAM + 1), bool)) & ~mask
    figures = measure_preservation(inverted(photo, mask | seam), photo, regions, mask, SEAM)
    assert figures.summary() == "unchanged outside the mask" and figures.score == 0.0
    background = figures.region("background")
    assert background.kept.changed == 0.0 and background.redrawn.changed > 0.5
    kept, redrawn = parts(regions, mask, "background")
    assert background.kept.pixels == kept.sum() and background.redrawn.pixels == redrawn.sum()
    assert background.pixels == (regions == REGIONS.index("background")).sum()  # the seam's share included
    assert background.kept.share == pytest.approx(kept.sum() / (H * W))


def test_an_absent_region_is_absent_not_unchanged() -> None:
    photo, regions, mask = picture()
    figures = measure_preservation(photo.copy(), photo, regions, mask, SEAM)
    legs = figures.region("legs")
    assert legs.absent and legs.kept.changed is None and legs.redrawn.changed is None
    assert figures.to_json()["regions"]["legs"] == {"absent": True}
    face = figures.region("face")
    assert not face.absent and face.kept.changed == 0.0 and face.kept.ssim == pytest.approx(1.0)
    assert figures.summary() == "unchanged outside the mask"


def test_a_region_too_small_to_matter_is_listed_but_not_scored() -> None:
    photo, regions, mask = picture()
    regions = regions.copy()
    regions[90:92, 40:42] = REGIONS.index("legs")  # 4 pixels, under MIN_SCORED_SHARE of the picture
    assert 4 / (H * W) < MIN_SCORED_SHARE
    where = regions == REGIONS.index("legs")
    figures = measure_preservation(inverted(photo, where), photo, regions, mask, SEAM)
    assert figures.region("legs").kept.changed == 1.0
    assert figures.score == 0.0 and "legs" not in figures.summary()


def test_every_figure_equals_an_independent_reference() -> None:
    photo, regions, mask = picture()
    rng = np.random.default_rng(1)
    result = np.clip(photo.astype(int) + rng.normal(0, 12, photo.shape), 0, 255).astype(np.uint8)
    result[:20, :24] = photo[:20, :24]  # the face unchanged
    figures = measure_preservation(result, photo, regions, mask, SEAM)
    _, ssim_map = skimage_metrics.structural_similarity(result, photo, channel_axis=2, gaussian_weights=True,
                                                        sigma=1.5, use_sample_covariance=False, data_range=255,
                                                        full=True)
    ssim_map = ssim_map.mean(axis=2)
    delta_e = skimage_color.deltaE_ciede2000(skimage_color.rgb2lab(result), skimage_color.rgb2lab(photo))
    near = np.abs(delta_e - CHANGED_DELTA_E) < 1e-2  # where float32 may fall on the other side of the threshold
    for name in REGIONS:
        region = figures.region(name)
        for part, where in zip((region.kept, region.redrawn), parts(regions, mask, name), strict=True):
            assert part.pixels == where.sum(), name
            if not where.any():
                assert part.ssim is None and part.delta_e is None and part.changed is None
                continue
            assert part.ssim == pytest.approx(ssim_map[where].mean(), abs=1e-9), name
            assert part.delta_e == pytest.approx(delta_e[where].mean(), abs=2e-3), name
            assert abs(part.changed - (delta_e[where] > CHANGED_DELTA_E).mean()) <= near[where].sum() / where.sum()
    assert figures.region("face").kept.delta_e == 0.0
    assert 0 < figures.score < 1


def test_the_figures_come_back_from_json() -> None:
    photo, regions, mask = picture()
    figures = measure_preservation(inverted(photo, regions == 0), photo, regions, mask, SEAM)
    again = Preservation.from_json(figures.to_json())
    assert again.summary() == figures.summary() and again.score == pytest.approx(figures.score, abs=1e-6)
    assert again.region("legs").absent and again.size == (W, H) and again.seam == SEAM
    with pytest.raises(ValueError):
        Preservation.from_json({"size": "72x96"})


def test_pictures_of_different_sizes_are_refused() -> None:
    photo, regions, mask = picture()
    with pytest.raises(ValueError, match="differ in size"):
        measure_preservation(photo[:-1], photo, regions, mask, SEAM)
