"""Reading pictures back in tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def pixels(picture: Path | str | Image.Image) -> np.ndarray:
    """RGB pixels of a file or an image."""
    if isinstance(picture, Image.Image):
        return np.asarray(picture.convert("RGB"))
    with Image.open(picture) as im:
        return np.asarray(im.convert("RGB"))


def array(path: Path | str) -> np.ndarray:
    """The pixels as stored (any mode)."""
    with Image.open(path) as im:
        return np.asarray(im)


def text(path: Path | str) -> dict[str, str]:
    """A PNG's text chunks (its record)."""
    with Image.open(path) as im:
        return dict(im.text)


def expected_region(photo: tuple[int, int], fit: str, working: tuple[int, int]) -> tuple[int, int, int, int]:
    """Where a working-size result lands in a photo of size `photo`, from the sizes alone (independent of
    ootd/imaging/photo.py): the whole photo, or the centre that `--fit crop` kept."""
    w, h = photo
    if fit != "crop":
        return 0, 0, w, h
    scale = max(working[0] / w, working[1] / h)
    kw, kh = min(w, round(working[0] / scale)), min(h, round(working[1] / scale))
    return (w - kw) // 2, (h - kh) // 2, (w - kw) // 2 + kw, (h - kh) // 2 + kh
