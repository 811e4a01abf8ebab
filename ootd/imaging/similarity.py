"""How alike two pictures are: PSNR and SSIM of 8-bit images (`ootd compare`, the validation sheets of
`ootd train run`). SSIM is the Wang et al. 2004 form with an 11x11 Gaussian window, sigma 1.5, K1 0.01, K2 0.03,
per RGB channel and averaged, the 5-pixel border excluded, as scikit-image's
`structural_similarity(..., gaussian_weights=True)` computes it."""

from __future__ import annotations

import math

import numpy as np
from scipy.ndimage import gaussian_filter

DATA_RANGE = 255.0
SSIM_SIGMA = 1.5
SSIM_TRUNCATE = 3.5  # window radius int(3.5 * 1.5 + 0.5) = 5: an 11x11 window
SSIM_K1, SSIM_K2 = 0.01, 0.03


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of two same-shape 8-bit images; inf when they are identical."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0.0 else 10.0 * math.log10(DATA_RANGE**2 / mse)


def _ssim_channel(x: np.ndarray, y: np.ndarray) -> float:
    def blur(v: np.ndarray) -> np.ndarray:
        return gaussian_filter(v, SSIM_SIGMA, truncate=SSIM_TRUNCATE, mode="reflect")

    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
    c1, c2 = (SSIM_K1 * DATA_RANGE) ** 2, (SSIM_K2 * DATA_RANGE) ** 2
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    pad = int(SSIM_TRUNCATE * SSIM_SIGMA + 0.5)
    inner = s[pad:-pad, pad:-pad] if min(s.shape) > 2 * pad else s
    return float(inner.mean())


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Structural similarity of two same-shape 8-bit images (HxW or HxWxC; channels averaged); 1.0 if identical."""
    x, y = a.astype(np.float64), b.astype(np.float64)
    if x.ndim == 2:
        return _ssim_channel(x, y)
    return float(np.mean([_ssim_channel(x[..., c], y[..., c]) for c in range(x.shape[-1])]))
