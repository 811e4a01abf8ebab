"""A small stock UNet for tests of the fusion-level mechanisms (feature caching, token merging)."""

from __future__ import annotations

import torch
from diffusers import UNet2DConditionModel


def three_level_unet(seed: int) -> UNet2DConditionModel:
    """Three levels with fusion self-attention in the first two, as the released UNets (finest level included)."""
    torch.manual_seed(seed)
    return UNet2DConditionModel(
        sample_size=16, in_channels=8, out_channels=4, layers_per_block=1, block_out_channels=(16, 32, 32),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=24, attention_head_dim=8, norm_num_groups=8,
    ).eval()
