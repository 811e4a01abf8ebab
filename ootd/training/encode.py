"""A pair's cache entry from its framed pictures: the latents and the prompt embedding exactly as the inference
pipeline computes them (docs/upstream.md §3-§4: the VAE posterior's mode of [-1, 1] pixels, the masked person and
garment unscaled, the person times the scaling factor; the prompt of ootd/method/conditioning.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from ootd.method.conditioning import prompt_embeddings
from ootd.settings import Category, ModelType


@dataclass
class Encoders:
    """The networks a cache entry is computed with, on the device, in eval mode (the model owner's
    `Models.encoders`): the VAE (the latents) and CLIP's tokenizer, text encoder, image processor and image encoder
    (the prompt embedding)."""

    vae: torch.nn.Module
    tokenizer: Any
    text_encoder: torch.nn.Module
    image_processor: Any
    image_encoder: torch.nn.Module
    device: torch.device


@torch.inference_mode()
def latents_of(vae: torch.nn.Module, images: list[Image.Image], device: torch.device) -> list[torch.Tensor]:
    """VAE latents (mode of the posterior, unscaled) by the pipeline's own encode (dense NCHW, one image per VAE
    call), as float32 on the CPU."""
    from diffusers.image_processor import VaeImageProcessor

    from ootd.pipeline import encode_images

    dtype = next(vae.parameters()).dtype
    latents = encode_images(vae, images, VaeImageProcessor(vae_scale_factor=8), device, dtype, batched=False)
    return [latent.float().cpu() for latent in latents]


@torch.inference_mode()
def pair_tensors(person: Image.Image, masked_person: Image.Image, mask: Image.Image, garment: Image.Image,
                 category: Category, model_type: ModelType, encoders: Encoders) -> dict[str, torch.Tensor]:
    """The tensors of one cache entry (ootd/training/cache.py ENTRY_TENSORS), with the model owner's encoders
    (`Models.encoders`: the VAE and CLIP's, on their device)."""
    vae, device = encoders.vae, encoders.device
    masked_latents, person_latents, garment_latents = latents_of(vae, [masked_person, person, garment], device)
    prompt = prompt_embeddings(garment, category, model_type, encoders.tokenizer, encoders.text_encoder,
                               encoders.image_processor, encoders.image_encoder)
    return {"target": person_latents * vae.config.scaling_factor, "masked": masked_latents,
            "garment": garment_latents, "prompt": prompt[0].float().cpu(),
            "mask": torch.from_numpy(np.asarray(mask.convert("L"), dtype=np.uint8).copy())}
