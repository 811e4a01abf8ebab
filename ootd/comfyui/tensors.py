"""ComfyUI's IMAGE and MASK tensors <-> the PIL images ootd works on, exactly.

ComfyUI holds an IMAGE as float32 `[batch, height, width, 3]` in 0..1 and a MASK as float32 `[batch, height,
width]` (or `[height, width]`), 1 = the area to change: the convention of ootd's masks too (white = repaint).
`LoadImage` divides 8-bit values by 255 and `SaveImage` multiplies by 255 and truncates. Going in, a value is
rounded to the nearest 8-bit level (a float that lands a hair below a level is that level, not the one under);
going out, a level is divided by 255 in float32 as `LoadImage` does, which `SaveImage` gives back unchanged for
every level. So a picture loaded by `LoadImage` and written by `SaveImage` has `ootd run`'s pixels.

An input tensor is checked here as a file is by `ootd run` (a batch of one, not empty, each side at least
`MIN_SIDE`, at most `MAX_PIXELS`), each problem one `InputImageError` line naming the node's input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from ootd.errors import InputImageError
from ootd.imaging.opener import check_dimensions

if TYPE_CHECKING:
    import torch


def _levels(values: np.ndarray) -> np.ndarray:
    """Floats in 0..1 -> the nearest 8-bit levels (NaN as 0, out-of-range values clipped)."""
    return np.rint(np.clip(np.nan_to_num(values, nan=0.0), 0.0, 1.0) * 255.0).astype(np.uint8)


def _one(tensor: torch.Tensor, name: str, what: str, dims: int) -> np.ndarray:
    """The single item of a batch as float32 numpy (a batch of several is refused: the try-on takes one)."""
    if tensor is None:
        raise InputImageError(f"{name}: no {what} connected")
    array = tensor.detach().to("cpu").float().numpy() if hasattr(tensor, "detach") else np.asarray(tensor)
    if array.ndim == dims:  # a single item without its batch axis (a MASK may come as [height, width])
        array = array[None]
    if array.ndim != dims + 1:
        raise InputImageError(f"{name}: not a ComfyUI {what} (shape {tuple(array.shape)})")
    if array.shape[0] != 1:
        raise InputImageError(f"{name}: a batch of {array.shape[0]} {what}s; this input takes one (pick one with "
                              f"ImageFromBatch, or run the graph once per {what})")
    return array[0]


def image_to_pil(image: torch.Tensor, name: str) -> Image.Image:
    """An IMAGE input (a batch of one) -> an RGB picture, each value rounded to its 8-bit level."""
    array = _one(image, name, "image", 3)
    if array.shape[-1] not in (3, 4) or array.shape[0] * array.shape[1] == 0:
        raise InputImageError(f"{name} image: empty or not RGB (shape {tuple(array.shape)})")
    height, width = array.shape[:2]
    check_dimensions(width, height, lambda problem: InputImageError(f"{name} image: {problem}"))
    return Image.fromarray(_levels(array[..., :3]), "RGB")


def mask_to_pil(mask: torch.Tensor, name: str) -> Image.Image:
    """A MASK input (1 = repaint) -> an 8-bit mask picture (white = repaint)."""
    array = _one(mask, name, "mask", 2)
    if array.shape[0] * array.shape[1] == 0:
        raise InputImageError(f"{name}: an empty mask (shape {tuple(array.shape)})")
    return Image.fromarray(_levels(array), "L")


def pil_to_image(pictures: Sequence[Image.Image]) -> torch.Tensor:
    """Pictures of one size -> an IMAGE batch, each 8-bit level divided by 255 in float32 (as `LoadImage`)."""
    import torch

    arrays = [np.asarray(p.convert("RGB"), dtype=np.uint8).astype(np.float32) / 255.0 for p in pictures]
    return torch.from_numpy(np.stack(arrays))


def pil_to_mask(masks: Sequence[Image.Image]) -> torch.Tensor:
    """Mask pictures of one size (white = repaint) -> a MASK batch in 0..1 (1 = repaint)."""
    import torch

    arrays = [np.asarray(m.convert("L"), dtype=np.uint8).astype(np.float32) / 255.0 for m in masks]
    return torch.from_numpy(np.stack(arrays))
