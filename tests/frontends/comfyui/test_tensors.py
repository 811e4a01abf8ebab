"""ComfyUI's IMAGE and MASK tensors <-> pictures: every 8-bit level survives LoadImage -> node -> SaveImage (as
ComfyUI's own code divides and truncates), values between levels round to the nearest, and an unusable tensor is
one line naming the node's input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from ootd.comfyui.tensors import image_to_pil, mask_to_pil, pil_to_image, pil_to_mask
from ootd.errors import InputImageError

LEVELS = np.arange(256, dtype=np.uint8)


def load_image(levels: np.ndarray) -> torch.Tensor:
    """What ComfyUI's LoadImage makes of 8-bit RGB: float32 / 255, a batch of one."""
    return torch.from_numpy(levels.astype(np.float32) / 255.0)[None]


def save_image(image: torch.Tensor) -> np.ndarray:
    """What ComfyUI's SaveImage writes: 255 * value, clipped, truncated to uint8."""
    return np.clip(255.0 * image[0].cpu().numpy(), 0, 255).astype(np.uint8)


def every_level(width: int = 64) -> np.ndarray:
    """A 256 x width RGB picture: row k holds level k in every channel."""
    return np.repeat(np.repeat(LEVELS[:, None, None], width, axis=1), 3, axis=2)


def test_every_level_survives_loadimage_the_node_and_saveimage() -> None:
    levels = every_level()
    picture = image_to_pil(load_image(levels), "person")
    assert np.array_equal(np.asarray(picture), levels)
    assert np.array_equal(save_image(pil_to_image([picture])), levels)


def test_values_between_levels_round_to_the_nearest_level() -> None:
    below = (every_level().astype(np.float32) / 255.0) - 1e-6  # a hair under each level, as float math lands
    picture = image_to_pil(torch.from_numpy(np.clip(below, 0, 1))[None], "person")
    assert np.array_equal(np.asarray(picture), every_level())
    truncated = (np.clip(below, 0, 1) * 255).astype(np.uint8)  # what a plain cast would have given
    assert (truncated != every_level()).any()


def test_masks_keep_their_levels_and_comfyuis_convention() -> None:
    mask = torch.from_numpy(np.tile(LEVELS[:, None], (1, 64)).astype(np.float32) / 255.0)  # [height, width]
    picture = mask_to_pil(mask, "mask")
    assert picture.mode == "L" and np.array_equal(np.asarray(picture)[:, 0], LEVELS)
    back = pil_to_mask([picture, Image.new("L", (64, 256), 255)])
    assert back.shape == (2, 256, 64) and back.dtype == torch.float32
    assert torch.equal(back[0], mask) and float(back[1].min()) == 1.0  # white = 1 = repaint


@pytest.mark.parametrize(("tensor", "words"), [
    (torch.zeros(2, 80, 80, 3), "person: a batch of 2 images; this input takes one"),
    (torch.zeros(1, 0, 80, 3), "person image: empty or not RGB"),
    (torch.zeros(1, 1, 1, 3), "person image: image too small: 1x1 (each side must be at least 64 px)"),
    (torch.zeros(1, 80, 80), "person image: empty or not RGB"),
    (torch.zeros(80, 80), "person: not a ComfyUI image (shape (80, 80))"),
])
def test_an_unusable_image_is_one_line_naming_the_input(tensor: torch.Tensor, words: str) -> None:
    with pytest.raises(InputImageError) as caught:
        image_to_pil(tensor, "person")
    assert str(caught.value).startswith(words) and "\n" not in str(caught.value)


def test_an_empty_mask_is_refused() -> None:
    with pytest.raises(InputImageError, match="mask2: an empty mask"):
        mask_to_pil(torch.zeros(1, 0, 5), "mask2")
