"""TryOnPipeline: one try-on as numbered steps of short methods (SPEC sections 2-5)."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from diffusers.image_processor import VaeImageProcessor
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from ootd.attention import AttentionFn, sdpa_attention
from ootd.conditioning import prompt_embeddings
from ootd.config import (
    Category,
    ModelType,
    Resolution,
    SamplingSettings,
    SchedulerName,
    check_model_category,
    parse_resolution,
)
from ootd.device import DeviceInfo, Precision, choose_precision, detect_device
from ootd.errors import UsageError
from ootd.fusion import TryOnFusion, capture_block_inputs
from ootd.loading import Components, load_components
from ootd.schedulers import build_scheduler

logger = logging.getLogger(__name__)

ImageInput = Image.Image | str | Path
Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass
class TryOnResult:
    """What one call returns. `timings` holds seconds per stage (and "steps": seconds per step)."""

    images: list[Image.Image]
    mask: Image.Image
    masked_person: Image.Image
    seed: int
    timings: dict[str, float | list[float]] = field(default_factory=dict)
    intermediates: dict[str, Image.Image] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)


@dataclass
class _Prepared:
    person: Image.Image  # at the working resolution
    garment: Image.Image
    mask: Image.Image  # "L", 255 inside
    masked_person: Image.Image
    intermediates: dict[str, Image.Image]


def _as_image(value: ImageInput, role: str) -> Image.Image:
    if isinstance(value, Image.Image):
        return value.convert("L" if role == "mask" else "RGB")
    from ootd.images import load_image

    return load_image(Path(value), role)


def masked_person_image(person: Image.Image, mask: Image.Image) -> Image.Image:
    """The person with every masked pixel replaced by gray 127 (SPEC section 2)."""
    gray = Image.new("RGB", person.size, (127, 127, 127))
    return Image.composite(gray, person, mask)


def binarize_mask(mask: Image.Image) -> Image.Image:
    """255 where the mask is >= 127 (the original's threshold), 0 elsewhere."""
    arr = np.asarray(mask.convert("L"))
    return Image.fromarray(np.where(arr >= 127, 255, 0).astype(np.uint8), mode="L")


class TryOnPipeline:
    """Person photo + garment photo -> photos of that person wearing that garment."""

    def __init__(
        self,
        components: Components,
        model_type: ModelType,
        device: DeviceInfo,
        precision: Precision,
        attention: AttentionFn = sdpa_attention,
        checkpoints_dir: Path | None = None,
        preprocessor=None,  # noqa: ANN001 - pose + parsing + mask maker; None means a mask is required
    ) -> None:
        self.components = components
        self.model_type = model_type
        self.device = device
        self.precision = precision
        self.checkpoints_dir = checkpoints_dir
        self.preprocessor = preprocessor
        self.image_processor = VaeImageProcessor(vae_scale_factor=8)
        self.fusion = TryOnFusion(components.unet_vton, attention)
        self.load_seconds = 0.0
        torch_device = device.torch_device
        for module in self._modules():
            module.to(torch_device).eval().requires_grad_(False)

    def _modules(self) -> list[torch.nn.Module]:
        c = self.components
        return [c.text_encoder, c.image_encoder, c.vae, c.unet_garm, c.unet_vton]

    @classmethod
    def from_pretrained(
        cls,
        checkpoints_dir: str | Path,
        model_type: str | ModelType = "hd",
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        attention: AttentionFn | None = None,
        preprocessor=None,  # noqa: ANN001
    ) -> TryOnPipeline:
        """Load every component of the hd or dc model from a checkpoints tree in the released layout."""
        start = time.perf_counter()
        try:
            model_type = ModelType(str(getattr(model_type, "value", model_type)).lower())
        except ValueError:
            raise UsageError(f"unknown model type {model_type!r}: use hd or dc") from None
        info = detect_device(device)
        if isinstance(dtype, torch.dtype):
            dtype = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
        precision = choose_precision(info, dtype or "auto")
        dtypes = {
            "unet": precision.unet, "vae": precision.vae,
            "text_encoder": precision.text_encoder, "image_encoder": precision.image_encoder,
        }
        components = load_components(Path(checkpoints_dir), model_type, dtypes)
        pipe = cls(components, model_type, info, precision, attention or sdpa_attention,
                   Path(checkpoints_dir), preprocessor)
        pipe.load_seconds = time.perf_counter() - start
        return pipe

    # -- the call ---------------------------------------------------------------------------------

    @torch.inference_mode()
    def __call__(
        self,
        person: ImageInput,
        garment: ImageInput,
        category: str | Category,
        *,
        mask: ImageInput | None = None,
        num_samples: int = 1,
        steps: int = 20,
        guidance_scale: float = 2.0,
        seed: int | None = None,
        resolution: tuple[int, int] | str | Resolution = (768, 1024),
        scheduler: str | SchedulerName = "unipc",
        progress: Progress | None = None,
    ) -> TryOnResult:
        timings: dict[str, float | list[float]] = {}
        tick = time.perf_counter()

        # 1. validate
        category = Category.parse(category)
        check_model_category(self.model_type, category)
        settings = SamplingSettings(
            num_samples=num_samples, steps=steps, guidance_scale=guidance_scale,
            seed=seed if seed is not None else secrets.randbelow(2**32),
            resolution=parse_resolution(resolution), scheduler=SchedulerName.parse(scheduler),
        )
        settings.validate()
        person_img = _as_image(person, "person")
        garment_img = _as_image(garment, "garment")
        mask_img = _as_image(mask, "mask") if mask is not None else None

        # 2. inputs at the working resolution, mask and masked person
        t = time.perf_counter()
        prepared = self._prepare_inputs(person_img, garment_img, mask_img, category, settings.resolution)
        timings["preprocess"] = time.perf_counter() - t

        # 3. conditioning
        t = time.perf_counter()
        prompt = self._conditioning(prepared.garment, category)
        timings["conditioning"] = time.perf_counter() - t

        # 4. VAE encodes
        t = time.perf_counter()
        garment_latents, person_latents, original_latents = self._encode(prepared)
        timings["encode"] = time.perf_counter() - t

        # 5. garment UNet once
        t = time.perf_counter()
        guidance = settings.guidance_scale >= 1.0
        features = self._garment_features(garment_latents, prompt, guidance)
        timings["garment_unet"] = time.perf_counter() - t

        # 6. scheduler, timesteps, initial noise
        sched = build_scheduler(settings.scheduler, self.components.scheduler_config)
        sched.set_timesteps(settings.steps, device=self.device.torch_device)
        noise = self._initial_noise(settings, original_latents.shape[-2:])
        latents = noise * sched.init_noise_sigma

        # 7. denoising loop
        t = time.perf_counter()
        latents, step_times = self._denoise(
            sched, latents, noise, prompt, features, person_latents, original_latents,
            self._latent_mask(prepared.mask, original_latents.shape[-2:]), settings, progress,
        )
        timings["denoise"] = time.perf_counter() - t
        timings["steps"] = step_times
        del features

        # 8. decode
        t = time.perf_counter()
        images = self._decode(latents, progress)
        timings["decode"] = time.perf_counter() - t
        timings["total"] = time.perf_counter() - tick

        return TryOnResult(
            images=images, mask=prepared.mask, masked_person=prepared.masked_person, seed=settings.seed,
            timings=timings, intermediates=prepared.intermediates,
            settings={
                "model_type": self.model_type.value, "category": category.value,
                "samples": str(settings.num_samples), "steps": str(settings.steps),
                "scale": str(settings.guidance_scale), "seed": str(settings.seed),
                "resolution": str(settings.resolution), "scheduler": settings.scheduler.value,
            },
        )

    # -- steps ------------------------------------------------------------------------------------

    def _prepare_inputs(
        self, person: Image.Image, garment: Image.Image, mask: Image.Image | None,
        category: Category, resolution: Resolution,
    ) -> _Prepared:
        """Resize (PIL default filter, as the original), make or take the mask, gray out the masked area."""
        intermediates: dict[str, Image.Image] = {}
        person_r = person.resize(resolution.size)
        garment_r = garment.resize(resolution.size)
        if mask is None:
            if self.preprocessor is None:
                raise UsageError("no mask given and pose/parsing preprocessing is not available: pass a mask")
            mask, intermediates = self.preprocessor(person, category, self.model_type)
        mask_r = binarize_mask(mask.resize(resolution.size, Image.NEAREST))
        masked = masked_person_image(person_r, mask_r)
        return _Prepared(person_r, garment_r, mask_r, masked, intermediates)

    def _conditioning(self, garment: Image.Image, category: Category) -> torch.Tensor:
        c = self.components
        embeds = prompt_embeddings(
            garment, category, self.model_type, c.tokenizer, c.text_encoder, c.image_processor, c.image_encoder
        )
        return embeds.to(self.device.torch_device, self.precision.unet)

    def _encode(self, prepared: _Prepared) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Garment and masked-person latents unscaled, the original person's scaled (SPEC section 4);
        one batched VAE call for the three images."""
        vae = self.components.vae
        pixels = torch.cat(
            [self.image_processor.preprocess(img) for img in (prepared.garment, prepared.masked_person,
                                                              prepared.person)]
        ).to(self.device.torch_device, self.precision.vae)
        latents = vae.encode(pixels).latent_dist.mode().to(self.precision.unet)
        garment, person, original = latents.chunk(3)
        return garment, person, original * vae.config.scaling_factor

    def _garment_features(
        self, garment_latents: torch.Tensor, prompt: torch.Tensor, guidance: bool
    ) -> dict[str, torch.Tensor]:
        """Run the garment UNet once at timestep 0 on [garment, zeros] (just [garment] without guidance);
        the features are shared by every sample."""
        batch = torch.cat([garment_latents, torch.zeros_like(garment_latents)]) if guidance else garment_latents
        with capture_block_inputs(self.components.unet_garm) as features:
            self.components.unet_garm(
                batch, 0, encoder_hidden_states=prompt.expand(batch.shape[0], -1, -1), return_dict=False
            )
        return dict(features)

    def _initial_noise(self, settings: SamplingSettings, latent_hw: torch.Size) -> torch.Tensor:
        """Drawn on the CPU generator, so a seed gives the same images on every device."""
        generator = torch.Generator("cpu").manual_seed(settings.seed)
        shape = (settings.num_samples, 4, *latent_hw)
        return randn_tensor(shape, generator=generator, device=self.device.torch_device, dtype=self.precision.unet)

    def _latent_mask(self, mask: Image.Image, latent_hw: torch.Size) -> torch.Tensor:
        arr = torch.from_numpy((np.asarray(mask) >= 127).astype(np.float32))[None, None]
        return F.interpolate(arr, size=tuple(latent_hw)).to(self.device.torch_device, self.precision.unet)

    def _denoise(
        self, sched, latents: torch.Tensor, noise: torch.Tensor, prompt: torch.Tensor,  # noqa: ANN001
        features: dict[str, torch.Tensor], person_latents: torch.Tensor, original_latents: torch.Tensor,
        latent_mask: torch.Tensor, settings: SamplingSettings, progress: Progress | None,
    ) -> tuple[torch.Tensor, list[float]]:
        samples = settings.num_samples
        guidance = settings.guidance_scale >= 1.0
        copies = 2 if guidance else 1
        batch = samples * copies
        # try-on batch is [conditional..., unconditional...]: garment item 0 then 1 (zeros)
        sample_index = torch.arange(copies, device=latents.device).repeat_interleave(samples)
        person_batch = person_latents.expand(batch, -1, -1, -1)
        prompt_batch = prompt.expand(batch, -1, -1)
        timesteps = sched.timesteps
        step_times: list[float] = []
        unet = self.components.unet_vton
        with self.fusion.garment(features, sample_index):
            for i, t in enumerate(timesteps):
                start = time.perf_counter()
                model_in = torch.cat([latents] * copies) if guidance else latents
                model_in = sched.scale_model_input(model_in, t)
                model_in = torch.cat([model_in, person_batch], dim=1)
                pred = unet(model_in, t, encoder_hidden_states=prompt_batch, return_dict=False)[0]
                if guidance:
                    cond, uncond = pred.chunk(2)
                    pred = uncond + settings.guidance_scale * (cond - uncond)
                latents = sched.step(pred, t, latents, return_dict=False)[0]
                init = original_latents
                if i < len(timesteps) - 1:
                    init = sched.add_noise(init, noise, timesteps[i + 1 : i + 2])
                latents = (1 - latent_mask) * init + latent_mask * latents
                if latents.device.type == "cuda":
                    torch.cuda.synchronize(latents.device)
                step_times.append(time.perf_counter() - start)
                if progress is not None:
                    progress("denoise", i + 1, len(timesteps))
        return latents, step_times

    def _decode(self, latents: torch.Tensor, progress: Progress | None) -> list[Image.Image]:
        """One sample at a time: the whole batch at once is what makes the original's decode peak."""
        vae = self.components.vae
        images: list[Image.Image] = []
        for i in range(latents.shape[0]):
            z = (latents[i : i + 1] / vae.config.scaling_factor).to(self.precision.vae)
            pixels = vae.decode(z, return_dict=False)[0]
            images += self.image_processor.postprocess(pixels.float(), output_type="pil")
            if progress is not None:
                progress("decode", i + 1, latents.shape[0])
        return images
