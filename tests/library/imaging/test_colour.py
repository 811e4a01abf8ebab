"""CIELAB and CIEDE2000 (ootd/imaging/colour.py) against scikit-image's rgb2lab and deltaE_ciede2000, and against
the test pairs Sharma, Wu and Dalal published with the formula; SSIM per region (ootd/imaging/similarity.py)
against scikit-image's SSIM map."""

from __future__ import annotations

import numpy as np
import pytest

from ootd.imaging.colour import delta_e_2000, srgb_to_lab
from ootd.imaging.similarity import ssim, ssim_by_region

skimage_color = pytest.importorskip("skimage.color")
skimage_metrics = pytest.importorskip("skimage.metrics")

# (L1, a1, b1, L2, a2, b2, dE00) from Sharma, Wu, Dalal (2005), Table 1: hue wrap-around, grey and blue cases
SHARMA = np.array([
    [50.0, 2.6772, -79.7751, 50.0, 0.0, -82.7485, 2.0425],
    [50.0, 3.1571, -77.2803, 50.0, 0.0, -82.7485, 2.8615],
    [50.0, 0.0, 0.0, 50.0, -1.0, 2.0, 2.3669],
    [50.0, 2.49, -0.001, 50.0, -2.49, 0.0009, 7.1792],
    [50.0, 2.49, -0.001, 50.0, -2.49, 0.0011, 7.2195],
    [50.0, 2.5, 0.0, 50.0, 0.0, -2.5, 4.3065],
    [50.0, 2.5, 0.0, 73.0, 25.0, -18.0, 27.1492],
    [50.0, 2.5, 0.0, 61.0, -5.0, 29.0, 22.8977],
    [60.2574, -34.0099, 36.2677, 60.4626, -34.1751, 39.4387, 1.2644],
    [22.7233, 20.0904, -46.6940, 23.0331, 14.9730, -42.5619, 2.0373],
    [2.0776, 0.0795, -1.1350, 0.9033, -0.0636, -0.5514, 0.9082],
])


def _random(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def test_lab_matches_scikit_image() -> None:
    rgb = _random(0, (64, 48, 3))
    rgb[0, :8] = [[0, 0, 0], [255, 255, 255], [255, 0, 0], [0, 255, 0], [0, 0, 255], [1, 1, 1], [10, 10, 10],
                  [128, 128, 128]]
    # scikit-image rounds the CIE constants (0.008856, 7.787): 2e-4 near the dark end, none elsewhere
    assert np.abs(srgb_to_lab(rgb) - skimage_color.rgb2lab(rgb)).max() < 5e-4
    assert np.abs(srgb_to_lab(rgb, np.float32) - srgb_to_lab(rgb)).max() < 1e-3


def test_ciede2000_matches_the_published_pairs_and_scikit_image() -> None:
    assert np.abs(delta_e_2000(SHARMA[:, :3], SHARMA[:, 3:6]) - SHARMA[:, 6]).max() < 1e-4
    assert np.abs(delta_e_2000(SHARMA[:, 3:6], SHARMA[:, :3]) - SHARMA[:, 6]).max() < 1e-4  # symmetric
    a, b = _random(1, (80, 60, 3)), _random(2, (80, 60, 3))
    b[:20] = a[:20]  # equal colours
    b[20:30] = np.clip(a[20:30].astype(int) + 3, 0, 255)  # small differences
    lab_a, lab_b = skimage_color.rgb2lab(a), skimage_color.rgb2lab(b)
    reference = skimage_color.deltaE_ciede2000(lab_a, lab_b)
    ours = delta_e_2000(lab_a, lab_b)
    assert np.abs(ours - reference).max() < 1e-6
    assert (ours[:20] == 0).all()
    assert np.abs(delta_e_2000(lab_a.astype(np.float32), lab_b.astype(np.float32)) - reference).max() < 1e-3


def test_ssim_by_region_is_the_mean_of_scikit_images_map_over_each_region() -> None:
    a = _random(3, (70, 50, 3))
    b = np.clip(a.astype(int) + np.random.default_rng(4).integers(-40, 40, a.shape), 0, 255).astype(np.uint8)
    b[:, :10] = a[:, :10]
    regions = np.random.default_rng(5).integers(0, 4, (70, 50)).astype(np.uint8)
    regions[:5] = 200  # in no region
    regions[30:40, 20:30] = 4
    _, full = skimage_metrics.structural_similarity(a, b, channel_axis=2, gaussian_weights=True, sigma=1.5,
                                                    use_sample_covariance=False, data_range=255, full=True)
    full = full.mean(axis=2)
    ours = ssim_by_region(a, b, regions, 6)
    for region in range(5):
        assert ours[region] == pytest.approx(full[regions == region].mean(), abs=1e-9)
    assert np.isnan(ours[5])  # no pixels
    assert ssim_by_region(a, a, regions, 5) == pytest.approx(np.ones(5))
    assert ssim(a, a) == 1.0
