"""Real ICC profiles, as the system has them (Debian's colord-data, icc-profiles-free and libgs-common, which
scripts/install_test_packages.sh installs as root), and the independent conversions the colour tests compare with:
LittleCMS through Pillow's ImageCms, called here, never through ootd's code."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageCms

ICC_ROOT = Path("/usr/share/color/icc")
PACKAGES = {"colord": "colord-data", "ghostscript": "libgs-common"}  # folders of ICC_ROOT; the rest: icc-profiles-free
ADOBE_RGB = "colord/AdobeRGB1998.icc"  # a camera's
PROPHOTO_RGB = "colord/ProPhotoRGB.icc"  # raw developers'
ADOBE_COMPATIBLE = "compatibleWithAdobeRGB1998.icc"
ROMM_RGB = "ghostscript/rommrgb.icc"
CMYK = "ghostscript/default_cmyk.icc"  # a print shop's
PS_CMYK = "ghostscript/ps_cmyk.icc"
GREY = "Gray.icc"  # grey, gamma 1.0
LAB = "ITULab.icc"  # a Lab colour space profile: not one for RGB pictures


def system_profile(relative: str) -> bytes:
    """The bytes of a profile file the system has under ICC_ROOT; the test is skipped, naming the package, when it
    is not installed."""
    path = ICC_ROOT / relative
    if not path.is_file():
        package = PACKAGES.get(Path(relative).parts[0], "icc-profiles-free")
        pytest.skip(f"{path} is not installed (Debian's {package}; scripts/install_test_packages.sh installs it)")
    return path.read_bytes()


def reference_srgb(image: Image.Image, icc: bytes, mode: str = "RGB") -> np.ndarray:
    """`image` converted from profile `icc` to sRGB by LittleCMS (ImageCms's defaults: the perceptual intent)."""
    source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
    return np.asarray(ImageCms.profileToProfile(image, source, ImageCms.createProfile("sRGB"), outputMode=mode))


def reference_from_srgb(image: Image.Image, icc: bytes, mode: str = "RGB") -> np.ndarray:
    """An sRGB `image` converted into profile `icc` by LittleCMS."""
    target = ImageCms.ImageCmsProfile(io.BytesIO(icc))
    return np.asarray(ImageCms.profileToProfile(image, ImageCms.createProfile("sRGB"), target, outputMode=mode))


def gradient(size: tuple[int, int] = (96, 128), mode: str = "RGB", seed: int = 0) -> Image.Image:
    """Smooth colours over the whole gamut with seeded noise (every channel value occurs; lossy formats keep it
    close)."""
    width, height = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // (width - 1), y * 255 // (height - 1), (x + y) * 255 // (width + height - 2)], -1)
    noisy = np.clip(base + rng.integers(-12, 13, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(noisy, "RGB").convert(mode)


def far_apart(a: np.ndarray, b: np.ndarray) -> int:
    """The largest difference between two pixel arrays."""
    return int(np.abs(a.astype(int) - b.astype(int)).max())
