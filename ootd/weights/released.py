"""Facts about the released OOTDiffusion weights (docs/upstream.md §1): the architectures of their UNets and VAE,
and the parameter count of each component. The benchmarks build these architectures with random weights, the
memory planner's constants were measured on them, and `ootd checkpoints verify` compares a tree against them.
"""

from __future__ import annotations

from typing import Any

RELEASED_UNET_CONFIG: dict[str, Any] = {
    "sample_size": 64, "out_channels": 4, "layers_per_block": 2, "block_out_channels": (320, 640, 1280, 1280),
    "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    "cross_attention_dim": 768, "attention_head_dim": 8, "norm_num_groups": 32,
}
RELEASED_VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 4, "layers_per_block": 2,
    "down_block_types": ("DownEncoderBlock2D",) * 4, "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (128, 256, 512, 512), "sample_size": 512, "scaling_factor": 0.18215,
    "norm_num_groups": 32, "act_fn": "silu",
}
# parameters per component (the garment and try-on UNets differ by their input convolution: 4 and 8 channels)
RELEASED_PARAMETERS: dict[str, int] = {
    "unet_garm": 859_520_964, "unet_vton": 859_532_484, "vae": 83_653_863, "text_encoder": 123_060_480,
    "image_encoder": 303_966_208,
}
RELEASED_LARGEST_MODULE = 37_945_344  # parameters of the text encoder's token embedding, the largest leaf module
