"""How far apart two colours are, as a person sees it: 8-bit sRGB to CIELAB (D65) and the CIEDE2000 difference
(Sharma, Wu and Dalal 2005), vectorised over whole images. A difference of about 1 is the smallest a trained
eye sees side by side; the same colour is 0. Both make a few float arrays the size of their input: callers that
hold large images pass them a strip of rows at a time. Checked against scikit-image's rgb2lab and
deltaE_ciede2000 and against the published test pairs (tests/library/imaging/test_colour.py)."""

from __future__ import annotations

import math

import numpy as np

# sRGB (IEC 61966-2-1) primaries to CIE XYZ, and the D65 white point, as scikit-image's rgb2lab uses them
XYZ_FROM_RGB = np.array([[0.412453, 0.357580, 0.180423],
                         [0.212671, 0.715160, 0.072169],
                         [0.019334, 0.119193, 0.950227]])
WHITE_D65 = np.array([0.95047, 1.0, 1.08883])
_LINEAR = np.where((v := np.arange(256) / 255.0) > 0.04045, ((v + 0.055) / 1.055) ** 2.4, v / 12.92)
_EPSILON = (6 / 29) ** 3
_25_POW_7 = 25.0 ** 7


def srgb_to_lab(rgb: np.ndarray, dtype: type = np.float64) -> np.ndarray:
    """CIELAB (L in 0..100) of 8-bit sRGB pixels (... x 3 uint8), D65 white, in `dtype` (float32: twice as fast,
    about 1e-5 from float64)."""
    linear = _LINEAR.astype(dtype)[np.asarray(rgb, dtype=np.uint8)]
    xyz = (linear @ (XYZ_FROM_RGB.T / WHITE_D65).astype(dtype))
    f = np.where(xyz > _EPSILON, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    lab = np.empty_like(f)
    lab[..., 0] = 116.0 * f[..., 1] - 16.0
    lab[..., 1] = 500.0 * (f[..., 0] - f[..., 1])
    lab[..., 2] = 200.0 * (f[..., 1] - f[..., 2])
    return lab


def _hue(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The hue angle in radians, 0 to 2 pi (0 for a grey: a and b both 0)."""
    return np.mod(np.arctan2(b, a), 2 * math.pi)


def delta_e_2000(lab1: np.ndarray, lab2: np.ndarray) -> np.ndarray:
    """The CIEDE2000 colour difference of two arrays of CIELAB colours (... x 3), kL = kC = kH = 1; in float32
    when both are (twice as fast, about 1e-4 from float64), else in float64."""
    dtype = np.result_type(lab1, lab2, np.float32)
    l1, a1, b1 = np.moveaxis(np.asarray(lab1, dtype=dtype), -1, 0)
    l2, a2, b2 = np.moveaxis(np.asarray(lab2, dtype=dtype), -1, 0)
    c_mean7 = ((np.hypot(a1, b1) + np.hypot(a2, b2)) / 2) ** 7
    g = 0.5 * (1 - np.sqrt(c_mean7 / (c_mean7 + _25_POW_7)))
    a1, a2 = a1 * (1 + g), a2 * (1 + g)
    c1, c2 = np.hypot(a1, b1), np.hypot(a2, b2)
    h1, h2 = _hue(a1, b1), _hue(a2, b2)
    chroma = c1 * c2
    grey = chroma == 0
    dh = h2 - h1
    dh = np.where(dh > math.pi, dh - 2 * math.pi, np.where(dh < -math.pi, dh + 2 * math.pi, dh))
    dh = np.where(grey, 0, dh)
    d_big_h = 2 * np.sqrt(chroma) * np.sin(dh / 2)
    h_sum = h1 + h2
    turn = 2 * math.pi
    h_mean = np.where(np.abs(h1 - h2) > math.pi, np.where(h_sum < turn, h_sum + turn, h_sum - turn), h_sum) / 2
    h_mean = np.where(grey, h_sum, h_mean)
    t = (1 - 0.17 * np.cos(h_mean - math.radians(30)) + 0.24 * np.cos(2 * h_mean)
         + 0.32 * np.cos(3 * h_mean + math.radians(6)) - 0.20 * np.cos(4 * h_mean - math.radians(63)))
    l_mean, c_mean = (l1 + l2) / 2, (c1 + c2) / 2
    rotation = math.radians(60) * np.exp(-(((h_mean - math.radians(275)) / math.radians(25)) ** 2))
    c_mean7 = c_mean ** 7
    r_t = -2 * np.sqrt(c_mean7 / (c_mean7 + _25_POW_7)) * np.sin(rotation)
    s_l = 1 + 0.015 * (l_mean - 50) ** 2 / np.sqrt(20 + (l_mean - 50) ** 2)
    s_c, s_h = 1 + 0.045 * c_mean, 1 + 0.015 * c_mean * t
    dl, dc, dhh = (l2 - l1) / s_l, (c2 - c1) / s_c, d_big_h / s_h
    return np.sqrt(np.maximum(dl * dl + dc * dc + dhh * dhh + r_t * dc * dhh, 0))
