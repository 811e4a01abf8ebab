"""How alike two pictures are: PSNR, SSIM and the pixel differences of 8-bit images: the project's one SSIM
(`ootd compare`, the validation sheets of `ootd train run`, `ootd eval`'s per-pair SSIM, preservation's SSIM per
region: `ssim_by_region`, ootd/evaluation/preservation.py). SSIM is the Wang et al. 2004 form with an 11x11
Gaussian window, sigma 1.5, K1 0.01, K2 0.03, per RGB channel and averaged, the 5-pixel border excluded, as
scikit-image's `structural_similarity(..., gaussian_weights=True)` computes it; `ssim` takes a mask to average over
a region only, `ssim_map` gives the per-pixel values. Everything runs a strip of rows at a time, so a 50-megapixel
pair needs a few strips of memory, not float64 copies of the whole images. Arrays are HxW or HxWxC (a CPU tensor of
that layout is read as one)."""

from __future__ import annotations

import math

import numpy as np
from scipy.ndimage import gaussian_filter

DATA_RANGE = 255.0
SSIM_SIGMA = 1.5
SSIM_TRUNCATE = 3.5  # window radius int(3.5 * 1.5 + 0.5) = 5: an 11x11 window
SSIM_RADIUS = int(SSIM_TRUNCATE * SSIM_SIGMA + 0.5)
SSIM_K1, SSIM_K2 = 0.01, 0.03
STRIP_PIXELS = 1 << 17  # pixels per strip of rows (64 rows at least): its float64 work arrays take ~1 MB each


def _strips(height: int, width: int, halo: int = 0) -> list[tuple[int, int, int, int]]:
    """(start, stop) of each strip of rows of about STRIP_PIXELS pixels, and the rows to read for it: `halo`
    more on each side, within the image."""
    step = max(64, STRIP_PIXELS // max(width, 1))
    return [(r0, min(r0 + step, height), max(0, r0 - halo), min(height, r0 + step + halo))
            for r0 in range(0, height, step)]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of two same-shape 8-bit images; inf when they are identical. The squared
    differences are summed exactly, as integers, one strip of rows at a time."""
    squares = 0
    for r0, r1, _, _ in _strips(a.shape[0], int(np.prod(a.shape[1:]))):
        d = a[r0:r1].astype(np.int32) - b[r0:r1]
        squares += int((d * d).sum(dtype=np.int64))
    return math.inf if squares == 0 else 10.0 * math.log10(DATA_RANGE**2 * a.size / squares)


def _ssim_map(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    def blur(v: np.ndarray) -> np.ndarray:
        return gaussian_filter(v, SSIM_SIGMA, truncate=SSIM_TRUNCATE, mode="reflect")

    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
    c1, c2 = (SSIM_K1 * DATA_RANGE) ** 2, (SSIM_K2 * DATA_RANGE) ** 2
    return ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))


def _ssim_channel(x: np.ndarray, y: np.ndarray, mask: np.ndarray | None = None) -> tuple[float, int]:
    """The SSIM summed over one 8-bit channel's inner region (the whole of an image too small to have one), or
    over its pixels where `mask` is true, and how many pixels that is; in float64 strips of rows, each read with
    the window's radius of rows more on each side: every value of the map is the one the whole-image computation
    gives, so only the order of the final sum differs (the mean agrees with it to about 1e-15), and memory is a
    dozen strips (~55 MB at 50 megapixels, 64 rows of 8,660) instead of a dozen float64 copies of the image
    (~5 GB)."""
    pad = SSIM_RADIUS
    height, width = x.shape
    inner = min(height, width) > 2 * pad
    top, bottom, cols = (pad, height - pad, slice(pad, width - pad)) if inner else (0, height, slice(None))
    total, count = 0.0, 0
    for r0, r1, a0, a1 in _strips(height, width, pad):
        r0, r1 = max(r0, top), min(r1, bottom)
        if r0 >= r1:
            continue
        s = _ssim_map(x[a0:a1].astype(np.float64), y[a0:a1].astype(np.float64))
        core = s[r0 - a0:r1 - a0, cols]
        if mask is not None:
            core = core[mask[r0:r1, cols]]
        total += float(core.sum())
        count += core.size
    return total, count


def _array(value: np.ndarray) -> np.ndarray:
    detach = getattr(value, "detach", None)  # a torch tensor: its numbers on the CPU
    return detach().cpu().numpy() if callable(detach) else np.asarray(value)


def ssim(a: np.ndarray, b: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Structural similarity of two same-shape 8-bit images (HxW or HxWxC; channels averaged); 1.0 if identical.
    `mask` (HxW, true where it counts): the mean over those pixels of the inner region only."""
    a, b = _array(a), _array(b)
    where = _array(mask).astype(bool) if mask is not None else None
    if where is not None and where.shape != a.shape[:2]:
        raise ValueError(f"the mask is {where.shape}, the images {a.shape[:2]}")
    channels = [(a, b)] if a.ndim == 2 else [(a[..., c], b[..., c]) for c in range(a.shape[-1])]
    means = []
    for x, y in channels:
        total, count = _ssim_channel(x, y, where)
        if count == 0:
            raise ValueError("the mask leaves no pixel to compare (the 5-pixel border is not compared)")
        means.append(total / count)
    return float(np.mean(means))


def ssim_map(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The SSIM of every pixel (HxW float32, channels averaged), the border's computed over mirrored edges (`ssim`
    leaves the 5-pixel border out): to show where two pictures differ, or to weigh regions."""
    a, b = _array(a), _array(b)
    if a.ndim == 2:
        a, b = a[..., None], b[..., None]
    height, width = a.shape[:2]
    out = np.empty((height, width), dtype=np.float32)
    for r0, r1, a0, a1 in _strips(height, width, SSIM_RADIUS):
        maps = [_ssim_map(a[a0:a1, :, c].astype(np.float64), b[a0:a1, :, c].astype(np.float64))
                for c in range(a.shape[-1])]
        out[r0:r1] = np.mean(maps, axis=0)[r0 - a0:r1 - a0]
    return out


def ssim_by_region(a: np.ndarray, b: np.ndarray, regions: np.ndarray, count: int) -> np.ndarray:
    """The mean SSIM of each region of two same-shape 8-bit images (HxW or HxWxC): `regions` numbers each
    pixel 0 to `count` - 1 (any other number: in none), and region r's value is the mean over its pixels of the
    SSIM map (the same map as `ssim`'s, channels averaged, borders mirrored and kept: a region may touch the
    edge); NaN for a region without pixels. A strip of rows at a time, as `ssim`."""
    channels = [(a, b)] if a.ndim == 2 else [(a[..., c], b[..., c]) for c in range(a.shape[-1])]
    sums, pixels = np.zeros(count), np.zeros(count)
    height, width = regions.shape
    for r0, r1, a0, a1 in _strips(height, width, SSIM_RADIUS):
        where = regions[r0:r1].ravel()
        inside = where < count
        where = where[inside]
        pixels += np.bincount(where, minlength=count)[:count]
        for x, y in channels:
            s = _ssim_map(x[a0:a1].astype(np.float64), y[a0:a1].astype(np.float64))[r0 - a0:r1 - a0]
            sums += np.bincount(where, weights=s.ravel()[inside], minlength=count)[:count] / len(channels)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pixels > 0, sums / np.maximum(pixels, 1), np.nan)


def differences(a: np.ndarray, b: np.ndarray) -> tuple[int, float]:
    """The largest and the mean absolute difference in pixel levels, exact (integer sums), a strip at a time."""
    largest, total = 0, 0
    for r0, r1, _, _ in _strips(a.shape[0], int(np.prod(a.shape[1:]))):
        d = np.abs(a[r0:r1].astype(np.int16) - b[r0:r1])
        largest, total = max(largest, int(d.max(initial=0))), total + int(d.sum(dtype=np.int64))
    return largest, total / max(a.size, 1)
