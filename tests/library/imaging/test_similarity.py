"""The project's one SSIM beyond what `ootd compare` asks of it (tests/tools/test_compare.py checks it against an
independent reference): the mean over a mask's pixels, the per-pixel map, tensors as arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ootd.imaging.similarity import SSIM_RADIUS, ssim, ssim_map


def _pair(seed: int = 0, shape: tuple[int, ...] = (70, 90, 3)) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, shape, dtype=np.uint8)
    b = a.copy()
    b[20:40, 30:60] = rng.integers(0, 256, (20, 30, *shape[2:]), dtype=np.uint8)  # a repainted region
    return a, b


def test_the_map_is_what_ssim_averages() -> None:
    a, b = _pair()
    r = SSIM_RADIUS
    full = ssim_map(a, b)
    assert full.shape == a.shape[:2] and full.dtype == np.float32
    assert ssim(a, b) == pytest.approx(float(full[r:-r, r:-r].astype(np.float64).mean()), abs=1e-6)
    assert np.allclose(ssim_map(a, a), 1.0)


def test_a_mask_measures_its_region_only() -> None:
    a, b = _pair()
    changed = np.zeros(a.shape[:2], dtype=bool)
    changed[20:40, 30:60] = True
    kept = np.ones_like(changed)
    kept[20 - 6:40 + 6, 30 - 6:60 + 6] = False  # out of the window's reach of the repainted region
    assert ssim(a, b, kept) == pytest.approx(1.0, abs=1e-12)
    inside = ssim(a, b, changed)
    assert inside < 0.5 < ssim(a, b) < 1.0
    assert ssim(a, b, np.ones_like(changed)) == pytest.approx(ssim(a, b), abs=1e-12)  # every pixel: no mask
    full = ssim_map(a, b)
    assert inside == pytest.approx(float(full[changed].astype(np.float64).mean()), abs=1e-6)


def test_a_mask_that_leaves_nothing_and_tensors() -> None:
    a, b = _pair(1, (60, 70))  # grey levels
    border = np.zeros(a.shape, dtype=bool)
    border[:SSIM_RADIUS] = True  # only the border, which is never compared
    with pytest.raises(ValueError, match="no pixel"):
        ssim(a, b, border)
    with pytest.raises(ValueError, match="mask"):
        ssim(a, b, np.ones((10, 10), dtype=bool))
    assert ssim(torch.from_numpy(a), torch.from_numpy(b)) == ssim(a, b)
