"""The original OOTDiffusion formulation, kept as an oracle: what the library replaces, run on the same
components so the benchmark can time it and compare pictures.

It differs from ours in how it computes, not in what (docs/upstream.md §4, §5):
- every try-on transformer block's self-attention runs over the concatenated [person; garment] tokens (2N of
  them, full 2N x 2N attention through stock `F.scaled_dot_product_attention`) and keeps the first N outputs
  (ours: person queries against keys/values of both, garment keys/values computed once per call);
- the garment UNet runs, all of it, on a batch of 2 x samples (ours: once on [garment, zeros], stopping after
  its last captured block);
- stock diffusers attention processors everywhere (ours fold cross-attention into the projections);
- the three images are VAE-encoded one call each, the whole batch is decoded at once, the networks run in the
  default memory layout, eagerly.
The denoising loop is the library's own `ootd.method.sampling.sample`: the loop is not what differs.
"""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from PIL import Image

from ootd.hardware.device import DeviceInfo
from ootd.hardware.policy import Precision
from ootd.method.fusion import capture_block_inputs, transformer_blocks
from ootd.method.sampling import Inpaint, sample
from ootd.settings import Category, ModelType
from ootd.speedups.execution import temporary_memory_format, uncompiled
from ootd.weights.loading import Components


def _original_block_forward(block: torch.nn.Module, hidden_states: torch.Tensor,
                            attention_mask: torch.Tensor | None = None,
                            encoder_hidden_states: torch.Tensor | None = None,
                            encoder_attention_mask: torch.Tensor | None = None,
                            *args: Any, garment: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """The original try-on block (docs/upstream.md §5): self-attention over cat([person, garment]) (2N tokens,
    full 2N x 2N attention), residual over all 2N, keep the first N; cross-attention and feed-forward on those N."""
    n = hidden_states.shape[1]
    x = torch.cat([hidden_states, garment.to(hidden_states.dtype)], dim=1)
    x = block.attn1(block.norm1(x), encoder_hidden_states=None, attention_mask=attention_mask) + x
    x = x[:, :n]
    x = block.attn2(block.norm2(x), encoder_hidden_states=encoder_hidden_states,
                    attention_mask=encoder_attention_mask) + x
    return block.ff(block.norm3(x)) + x


@contextlib.contextmanager
def stock_attention(models: Sequence[torch.nn.Module]) -> Iterator[None]:
    """While active, `models` run diffusers' stock attention processors (the original's: no folded
    cross-attention, plain SDPA), and get their own processors back afterwards."""
    from diffusers.models.attention_processor import AttnProcessor2_0

    saved = [m.attn_processors for m in models]
    for model in models:
        model.set_attn_processor(AttnProcessor2_0())
    try:
        yield
    finally:
        for model, processors in zip(models, saved, strict=True):
            model.set_attn_processor(processors)


@contextlib.contextmanager
def original_formulation(unet_vton: torch.nn.Module, features: dict[str, torch.Tensor]) -> Iterator[None]:
    """While active, the try-on UNet runs the original's fusion with `features` (batch = the try-on batch)
    and stock diffusers attention processors (plain F.scaled_dot_product_attention)."""
    blocks = transformer_blocks(unet_vton)
    with stock_attention([unet_vton]):
        for name, block in blocks.items():
            block.forward = types.MethodType(partial(_original_block_forward, garment=features[name]), block)
        try:
            yield
        finally:
            for block in blocks.values():
                del block.forward


def sync(device: torch.device) -> None:
    """Wait for the GPU, so wall-clock readings cover the work queued so far."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _plain_vae(vae: torch.nn.Module) -> Iterator[None]:
    """The VAE without slicing or tiling (the original's), restored afterwards."""
    saved = (vae.use_slicing, vae.use_tiling)
    vae.disable_slicing()
    vae.disable_tiling()
    try:
        yield
    finally:
        (vae.enable_slicing if saved[0] else vae.disable_slicing)()
        (vae.enable_tiling if saved[1] else vae.disable_tiling)()


class _Stopwatch:
    """Named wall-clock intervals, each ending after the device has finished its work."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.timings: dict[str, Any] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        sync(self.device)
        self.timings[name] = time.perf_counter() - start


def run_original(components: Components, model_type: ModelType, device: DeviceInfo, precision: Precision,
                 person: Image.Image, garment: Image.Image, mask: Image.Image, category: str = "upper", *,
                 num_samples: int = 1, steps: int = 20, guidance_scale: float = 2.0, seed: int = 0,
                 scheduler: str = "unipc", resolution: tuple[int, int] = (768, 1024),
                 ) -> tuple[list[Image.Image], dict[str, Any]]:
    """One call as the original computes it (see the module docstring), on our components. Inputs are resized
    to `resolution` as the original does. Returns the images and the same timings keys as TryOnResult."""
    c = components
    with temporary_memory_format([c.unet_garm, c.unet_vton, c.vae], False), uncompiled(c.unet_vton), \
            stock_attention([c.unet_garm, c.vae]), _plain_vae(c.vae), torch.inference_mode():
        tick = time.perf_counter()
        run = _OriginalRun(c, model_type, device.torch_device, precision, _Stopwatch(device.torch_device))
        images = run(person, garment, mask, Category.parse(category), num_samples=num_samples, steps=steps,
                     guidance_scale=guidance_scale, seed=seed, scheduler=scheduler, resolution=resolution)
        run.watch.timings["total"] = time.perf_counter() - tick
    return images, run.watch.timings


class _OriginalRun:
    """The stages of one original call, each timed under its TryOnResult name."""

    def __init__(self, components: Components, model_type: ModelType, device: torch.device, precision: Precision,
                 watch: _Stopwatch) -> None:
        from diffusers.image_processor import VaeImageProcessor

        self.c, self.model_type, self.device, self.precision, self.watch = (components, model_type, device,
                                                                              precision, watch)
        self.processor = VaeImageProcessor(vae_scale_factor=8)

    def __call__(self, person: Image.Image, garment: Image.Image, mask: Image.Image, category: Category, *,
                 num_samples: int, steps: int, guidance_scale: float, seed: int, scheduler: str,
                 resolution: tuple[int, int]) -> list[Image.Image]:
        from ootd.imaging.masks import binarize_mask, masked_person_image
        from ootd.method.conditioning import prompt_embeddings

        c, watch = self.c, self.watch
        with watch("preprocess"):
            person = person.convert("RGB").resize(resolution)
            garment = garment.convert("RGB").resize(resolution)
            mask = binarize_mask(mask.resize(resolution, Image.NEAREST))
            masked = masked_person_image(person, mask)
        with watch("conditioning"):
            prompt = prompt_embeddings(garment, category, self.model_type, c.tokenizer, c.text_encoder,
                                       c.image_processor, c.image_encoder).to(self.device, self.precision.unet)
        with watch("encode"):  # three separate encodes
            garment_latents, person_latents = self._encode(garment), self._encode(masked)
            original_latents = self._encode(person) * c.vae.config.scaling_factor
        copies = 2 if guidance_scale >= 1.0 else 1
        with watch("garment_unet"):
            features = self._garment_features(garment_latents, prompt, num_samples, copies)
        with watch("denoise"):
            latents, step_times = self._denoise(features, prompt, person_latents, original_latents, mask,
                                                num_samples=num_samples, copies=copies, steps=steps,
                                                guidance_scale=guidance_scale, seed=seed, scheduler=scheduler)
        watch.timings["steps"] = step_times
        del features  # not held through the decode: its peak memory is its own
        with watch("decode"):  # the whole batch at once
            pixels = c.vae.decode((latents / c.vae.config.scaling_factor).to(self.precision.vae), return_dict=False)[0]
            return self.processor.postprocess(pixels.float(), output_type="pil")

    def _encode(self, image: Image.Image) -> torch.Tensor:
        pixels = self.processor.preprocess(image).to(self.device, self.precision.vae).contiguous()
        return self.c.vae.encode(pixels).latent_dist.mode().to(self.precision.unet)

    def _garment_features(self, garment_latents: torch.Tensor, prompt: torch.Tensor, num_samples: int,
                          copies: int) -> dict[str, torch.Tensor]:
        """The whole garment UNet on 2 x samples: [garment] * samples, then as many zeros for guidance."""
        batch = torch.cat([garment_latents] * num_samples)
        if copies == 2:
            batch = torch.cat([batch, torch.zeros_like(batch)])
        with capture_block_inputs(self.c.unet_garm) as captured:
            self.c.unet_garm(batch, 0, encoder_hidden_states=prompt.expand(batch.shape[0], -1, -1),
                             return_dict=False)
        return dict(captured)

    def _denoise(self, features: dict[str, torch.Tensor], prompt: torch.Tensor, person_latents: torch.Tensor,
                 original_latents: torch.Tensor, mask: Image.Image, *, num_samples: int, copies: int, steps: int,
                 guidance_scale: float, seed: int, scheduler: str) -> tuple[torch.Tensor, list[float]]:
        """The loop under the original fusion; returns the final latents and each step's wall time."""
        from diffusers.utils.torch_utils import randn_tensor

        from ootd.method.schedulers import build_scheduler, set_timesteps
        from ootd.settings import SchedulerName

        sched = build_scheduler(SchedulerName.parse(scheduler), self.c.scheduler_config)
        set_timesteps(sched, steps, self.device)
        latent_hw = original_latents.shape[-2:]
        noise = randn_tensor((num_samples, 4, *latent_hw), generator=torch.Generator("cpu").manual_seed(seed),
                             device=self.device, dtype=self.precision.unet)
        arr = torch.from_numpy((np.asarray(mask) >= 127).astype(np.float32))[None, None]
        latent_mask = torch.nn.functional.interpolate(arr, size=tuple(latent_hw)).to(self.device, self.precision.unet)
        batch = num_samples * copies
        model_fn = _guided_unet(self.c.unet_vton, torch.cat([person_latents] * batch), prompt.expand(batch, -1, -1),
                                copies, guidance_scale)
        step_times: list[float] = []
        with original_formulation(self.c.unet_vton, features):
            latents = sample(model_fn, sched, noise * sched.init_noise_sigma,
                             inpaint=Inpaint(original_latents, noise, latent_mask),
                             callback=_step_timer(self.device, step_times))
        return latents, step_times


def _guided_unet(unet: torch.nn.Module, person_batch: torch.Tensor, prompt_batch: torch.Tensor, copies: int,
                 guidance_scale: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The try-on UNet on [latents] * copies next to the masked-person latents, guidance combined."""
    def model_fn(latents: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        model_in = torch.cat([torch.cat([latents] * copies), person_batch], dim=1)
        pred = unet(model_in, t, encoder_hidden_states=prompt_batch, return_dict=False)[0]
        if copies == 1:
            return pred
        cond, uncond = pred.chunk(2)
        return uncond + guidance_scale * (cond - uncond)

    return model_fn


def _step_timer(device: torch.device, times: list[float]) -> Callable[[int, torch.Tensor, torch.Tensor], None]:
    """A step callback appending each step's wall time to `times`."""
    last = [time.perf_counter()]

    def callback(_i: int, _t: torch.Tensor, _latents: torch.Tensor) -> None:
        sync(device)
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    return callback
