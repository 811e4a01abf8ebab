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
