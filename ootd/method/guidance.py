"""The try-on pieces of the denoising loop (docs/upstream.md §4): the initial noise, the latent mask, and the
model function that runs the try-on UNet with image guidance. ootd/method/sampling.py runs the loop itself."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from ootd.method.sampling import ModelFn

# (try-on UNet input, t, prompt batch, sample index, guidance) -> noise prediction of the whole batch
UnetCall = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


def initial_noise(seed: int, num_samples: int, latent_hw: torch.Size, device: torch.device,
                  dtype: torch.dtype) -> torch.Tensor:
    """Drawn on the CPU generator, so a seed gives the same images on every device."""
    generator = torch.Generator("cpu").manual_seed(seed)
    return randn_tensor((num_samples, 4, *latent_hw), generator=generator, device=device, dtype=dtype)


def latent_mask(mask: Image.Image, latent_hw: torch.Size, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """1 where the model repaints: the mask thresholded at 127, nearest-resized to the latent grid."""
    arr = torch.from_numpy((np.asarray(mask) >= 127).astype(np.float32))[None, None]
    return F.interpolate(arr, size=tuple(latent_hw)).to(device, dtype)


def sample_index(num_samples: int, guidance: bool, device: torch.device) -> torch.Tensor:
    """Garment item per try-on batch row: [conditional..., unconditional...] is item 0 then 1 (zeros)."""
    return torch.arange(2 if guidance else 1, device=device).repeat_interleave(num_samples)


def guided_model(unet_call: UnetCall, prompt: torch.Tensor, person_latents: torch.Tensor, index: torch.Tensor,
                 scale: float, guidance: bool) -> ModelFn:
    """The loop's model function: the try-on UNet on [latents, masked-person latents], with `guidance` the
    conditional and unconditional halves combined by `scale` (the conditional half first)."""
    batch = len(index)
    person_batch = person_latents.expand(batch, -1, -1, -1)
    prompt_batch = prompt.expand(batch, -1, -1)

    def model_fn(latents: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        model_in = torch.cat([latents] * 2) if guidance else latents
        model_in = torch.cat([model_in, person_batch], dim=1)
        pred = unet_call(model_in, t, prompt_batch, index, guidance)
        if not guidance:
            return pred
        cond, uncond = pred.chunk(2)
        return uncond + scale * (cond - uncond)

    return model_fn
