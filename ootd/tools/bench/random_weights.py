"""Random-weight models of the released architectures ("full") or their tiny version ("tiny"), built in
memory, and synthetic inputs: what the benchmark runs when no checkpoints are given."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ootd.errors import UsageError
from ootd.hardware.policy import Precision
from ootd.tools.bench.architectures import ARCHITECTURES, SD15_SCHEDULER_CONFIG, text_config, write_tokenizer
from ootd.weights.loading import Components, quiet_loading


def _tokenizer() -> Any:
    from transformers import CLIPTokenizer

    with tempfile.TemporaryDirectory(prefix="ootd-bench-tok-") as tmp, quiet_loading():
        write_tokenizer(Path(tmp))
        return CLIPTokenizer.from_pretrained(tmp)


def _image_processor() -> Any:
    try:  # the PIL-based processor, as ootd.weights.loading uses
        from transformers import CLIPImageProcessorPil as Processor
    except ImportError:
        from transformers import CLIPImageProcessor as Processor
    return Processor()  # the defaults are CLIP's 224 pixels, mean and std


def _scheduler_config() -> dict:
    from diffusers import PNDMScheduler

    with quiet_loading():
        return dict(PNDMScheduler.from_config(SD15_SCHEDULER_CONFIG).config)


def build_random_components(kind: str, precision: Precision, device: torch.device | str = "cpu",
                            seed: int = 0) -> Components:
    """The `kind` ("full" or "tiny") architectures with random weights, built on `device` (building on a GPU is
    much faster than on the CPU)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPVisionConfig, CLIPVisionModelWithProjection

    if kind not in ARCHITECTURES:
        raise UsageError(f"random weights must be {' or '.join(ARCHITECTURES)}, not {kind!r}")
    arch = ARCHITECTURES[kind]
    tokenizer = _tokenizer()
    torch.manual_seed(seed)
    with quiet_loading(), torch.device(device):
        def unet(in_channels: int) -> torch.nn.Module:
            return UNet2DConditionModel(in_channels=in_channels, **arch.unet).to(precision.unet)

        components = Components(
            tokenizer=tokenizer,
            text_encoder=CLIPTextModel(CLIPTextConfig(**text_config(arch, len(tokenizer)))).to(precision.text_encoder),
            image_encoder=CLIPVisionModelWithProjection(CLIPVisionConfig(**arch.vision)).to(precision.image_encoder),
            image_processor=_image_processor(),
            vae=AutoencoderKL(**arch.vae).to(precision.vae),
            unet_garm=unet(4),
            unet_vton=unet(8),
            scheduler_config=_scheduler_config(),
        )
    for module in (components.text_encoder, components.image_encoder, components.vae, components.unet_garm,
                   components.unet_vton):
        module.eval().requires_grad_(False)
    return components


def synthetic_inputs(resolution: tuple[int, int] = (768, 1024), seed: int = 0
                     ) -> tuple[Image.Image, Image.Image, Image.Image]:
    """Person, garment (random pictures) and an upper-body-like mask. Made at 768x1024 (3:4, the size the
    pipeline frames inputs to), so both formulations resize them the same way to the working resolution."""
    width, height = resolution
    rng = np.random.default_rng(seed)
    person = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    garment = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    mask = np.zeros((height, width), dtype=np.uint8)
    mask[height // 5: height * 3 // 5, width // 5: width * 4 // 5] = 255
    return person, garment, Image.fromarray(mask, mode="L")
