"""TryOnPipeline: one try-on as numbered steps of short methods (SPEC sections 2-5)."""

from __future__ import annotations

import contextlib
import gc
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from diffusers.image_processor import VaeImageProcessor
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from ootd.attention import (
    AttentionFn,
    ChunkedBackend,
    build_attention,
    install_attention,
    patch_sdpa,
    sdpa_attention,
)
from ootd.conditioning import prompt_embeddings
from ootd.config import (
    Category,
    ModelType,
    Resolution,
    SamplingSettings,
    SchedulerName,
    check_mask_grow,
    check_model_category,
    parse_resolution,
)
from ootd.device import (
    DeviceInfo,
    DeviceProfile,
    Precision,
    SpeedOptions,
    apply_environment,
    choose_precision,
    choose_speed,
    detect_device,
    load_profile,
    peek_device,
    runtime_environment,
)
from ootd.errors import OutOfMemoryError, UsageError
from ootd.fusion import TryOnFusion, capture_block_inputs
from ootd.images import FitInfo
from ootd.loading import Components, load_components
from ootd.memory import ModelSizes, Plan, apply_plan_to_vae, gib, make_plan
from ootd.schedulers import build_scheduler
from ootd.speed import as_memory_format, compile_error, compile_module, is_compile_failure, set_memory_format
from ootd.weights_check import require_finite_latents

logger = logging.getLogger(__name__)

FIT_MODES = ("pad", "crop", "stretch")

ImageInput = Image.Image | str | Path
Progress = Callable[[str, int, int], None]  # (stage, done, total)
T = TypeVar("T")


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
class PersonInputs:
    """The person side of a try-on, reusable across garments."""

    category: Category
    resolution: Resolution
    person: Image.Image  # at the working resolution, framed 3:4
    mask: Image.Image  # "L", 255 inside, working resolution
    masked_person: Image.Image
    fit: FitInfo
    intermediates: dict[str, Image.Image]
    person_latents: torch.Tensor  # masked person, unscaled
    original_latents: torch.Tensor  # person, times the VAE scaling factor
    timings: dict[str, float]


@dataclass
class GarmentInputs:
    """The garment side of a try-on, reusable across people."""

    category: Category
    resolution: Resolution
    garment: Image.Image
    prompt: torch.Tensor  # [1, L, D]
    features: dict[str, torch.Tensor]  # garment UNet block inputs, batch [garment, zeros]
    timings: dict[str, float]


def _as_image(value: ImageInput, role: str) -> Image.Image:
    if isinstance(value, Image.Image):
        return value.convert("L" if role == "mask" else "RGB")
    from ootd.images import load_image

    return load_image(Path(value), role)


def masked_person_image(person: Image.Image, mask: Image.Image) -> Image.Image:
    """The person with every masked pixel replaced by gray 127 (SPEC section 2)."""
    gray = Image.new("RGB", person.size, (127, 127, 127))
    return Image.composite(gray, person, mask)


def grow_mask(mask: Image.Image, pixels: int) -> Image.Image:
    """Dilate a binary mask by `pixels` (for users who want a looser mask)."""
    if pixels <= 0:
        return mask
    import cv2

    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * pixels + 1, 2 * pixels + 1))
    return Image.fromarray(cv2.dilate(np.asarray(mask), kernel), mode="L")


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
        preprocessor=None,  # noqa: ANN001 - pose + parsing + mask maker; loaded lazily when None
        parsing_provider: str = "cpu",
        max_memory: int | None = None,
        speed: SpeedOptions | None = None,
        profile: DeviceProfile | None = None,
    ) -> None:
        self.components = components
        self.model_type = model_type
        self.device = device
        self.precision = precision
        self.checkpoints_dir = checkpoints_dir
        self._preprocessor = preprocessor
        self.parsing_provider = parsing_provider
        self.image_processor = VaeImageProcessor(vae_scale_factor=8)
        self.attention = attention
        self.fusion = TryOnFusion(components.unet_vton, attention)
        # every other attention module of the UNets and the VAE through the same backend
        install_attention([components.unet_garm, components.unet_vton, components.vae], attention)
        self.load_seconds = 0.0
        self.max_memory = max_memory  # bytes a call may use; None: the device's free memory less a margin
        self.profile = profile or load_profile(device)  # the device's defaults, which the memory plan reads too
        self.plan: Plan | None = None  # the plan of the latest call
        self._sizes: ModelSizes | None = None
        self._offload = "none"
        for module in self._modules():
            module.eval().requires_grad_(False)
        self._place_models("none")
        self.speed = speed or SpeedOptions()
        set_memory_format([components.unet_garm, components.unet_vton, components.vae], self.speed.channels_last)
        if self.speed.compile:
            compile_module(components.unet_vton)  # the network that runs every step

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
        attention: str | AttentionFn = "auto",
        preprocessor=None,  # noqa: ANN001
        parsing_provider: str = "cpu",
        profile: str | Path | None = None,
        max_memory: int | None = None,
        channels_last: bool | None = None,
        compile: bool | None = None,
    ) -> TryOnPipeline:
        """Load every component of the hd or dc model from a checkpoints tree in the released layout.

        `device` None picks the best available; `dtype` None follows the device profile (fp32 on CPU);
        `attention` is a backend name (auto, flash, sdpa, chunked, math) or an attention function;
        `profile` a TOML file overriding the device profile from configs/profiles/; `channels_last` and
        `compile` None follow the profile.
        """
        start = time.perf_counter()
        try:
            model_type = ModelType(str(getattr(model_type, "value", model_type)).lower())
        except ValueError:
            raise UsageError(f"unknown model type {model_type!r}: use hd or dc") from None
        # runtime settings (allocator, kernels) must be in place before torch initialises the device
        apply_environment(runtime_environment(peek_device(device), torch.__version__))
        info = detect_device(device)
        device_profile = load_profile(info, Path(profile) if profile else None)
        if isinstance(dtype, torch.dtype):
            dtype = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
        precision = choose_precision(info, dtype or "auto", device_profile)
        if isinstance(attention, str):
            attention = build_attention(attention, info, precision.unet, profile=device_profile)
        dtypes = {
            "unet": precision.unet, "vae": precision.vae,
            "text_encoder": precision.text_encoder, "image_encoder": precision.image_encoder,
        }
        components = load_components(Path(checkpoints_dir), model_type, dtypes)
        speed = choose_speed(info, device_profile, channels_last=channels_last, compile=compile)
        pipe = cls(components, model_type, info, precision, attention, Path(checkpoints_dir), preprocessor,
                   parsing_provider, max_memory, speed, device_profile)
        pipe.load_seconds = time.perf_counter() - start
        return pipe

    # -- memory plan --------------------------------------------------------------------------------

    def make_plan(self, resolution: Resolution, num_samples: int, guidance: bool,
                  max_memory: int | None = None) -> Plan:
        """The memory plan for a call (ootd/memory.py decides; this only gathers its inputs)."""
        if self._sizes is None:
            self._sizes = ModelSizes.from_components(self.components)
        attention_name = str(getattr(self.attention, "label", "custom"))
        return make_plan(self.device, resolution.size, num_samples, guidance, self.precision.unet, attention_name,
                         self._sizes, max_memory if max_memory is not None else self.max_memory,
                         vae_dtype=self.precision.vae, profile=self.profile)

    def apply_plan(self, plan: Plan) -> None:
        """Put the plan's choices into effect: chunk budget, VAE slicing/tiling, where the models live."""
        for backend in getattr(self.attention, "backends", ()):
            if isinstance(backend, ChunkedBackend):
                backend.budget_bytes = plan.attention_budget_bytes
        apply_plan_to_vae(self.components.vae, plan)
        self._place_models(plan.offload)
        self.plan = plan

    def _place_models(self, offload: str) -> None:
        """none: everything on the device. model: only the try-on UNet stays; the others visit the device for
        their stage. sequential: accelerate streams each layer's weights to the device as it runs."""
        device = self.device.torch_device
        if offload == self._offload and offload != "none":
            return
        if offload == "sequential":
            from accelerate import cpu_offload

            for module in self._modules():
                module.to("cpu")
                cpu_offload(module, execution_device=device)
        else:
            for module in self._modules():
                stays = offload == "none" or module is self.components.unet_vton
                module.to(device if stays else "cpu")
        self._offload = offload

    @contextlib.contextmanager
    def _stage(self, *modules: torch.nn.Module) -> Iterator[None]:
        """Bring offloaded models to the device for one stage, and send them back after it."""
        visiting = [m for m in modules if self._offload == "model" and m is not self.components.unet_vton]
        for module in visiting:
            module.to(self.device.torch_device)
        try:
            yield
        finally:
            for module in visiting:
                module.to("cpu")

    def _retry_on_oom(self, stage: str, fn: Callable[[], T]) -> T:
        """Run a stage; on a device out-of-memory error free what can be freed, re-plan with half the budget
        and try once more. A second one is a clear error that shows the plan that failed. A torch.compile
        failure becomes a one-line error too."""
        try:
            return fn()
        except torch.OutOfMemoryError as first:
            plan = self.plan
            self._free_memory()
            if plan is None:
                raise OutOfMemoryError(f"out of memory during {stage}: {str(first).splitlines()[0]}") from first
            smaller = plan.halved()
            logger.warning("out of memory during %s; retrying once with half the memory budget (%s)",
                           stage, gib(smaller.budget_bytes))
            self.apply_plan(smaller)
            try:
                return fn()
            except torch.OutOfMemoryError as second:
                self._free_memory()
                raise OutOfMemoryError(
                    f"out of memory during {stage} again after re-planning with half the budget; "
                    f"plan that failed: {smaller.to_dict()}; try --max-memory lower, fewer --samples or "
                    f"--resolution 384x512"
                ) from second
        except Exception as exc:
            if is_compile_failure(exc):
                raise compile_error(exc) from exc
            raise

    def _free_memory(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        elif self.device.type == "mps":
            torch.mps.empty_cache()

    def describe(self) -> dict[str, object]:
        """Device, precision and attention backend, for --json, --explain and logs."""
        describe_attention = getattr(self.attention, "describe", None)
        return {
            "device": str(self.device.torch_device), "device_name": self.device.name, "arch": self.device.arch,
            "vendor": self.device.vendor, "model_type": self.model_type.value,
            "precision": {k: str(v).removeprefix("torch.") for k, v in vars(self.precision).items()},
            "attention": describe_attention() if callable(describe_attention) else getattr(
                self.attention, "__name__", type(self.attention).__name__),
            "channels_last": self.speed.channels_last, "compile": self.speed.compile,
            "parsing_providers": self._preprocessor.parsing_providers if self._preprocessor is not None else None,
            "plan": self.plan.to_dict() if self.plan is not None else None,
        }

    # -- preprocessing stage (lazy) ----------------------------------------------------------------

    @property
    def preprocessor(self):  # noqa: ANN201
        """Pose + parsing, loaded on first use (a run with a mask never loads them)."""
        if self._preprocessor is None:
            if self.checkpoints_dir is None:
                raise UsageError("no mask given and no checkpoints folder for pose/parsing: pass a mask")
            from ootd.preprocessing import Preprocessor

            self._preprocessor = Preprocessor.from_checkpoints(
                self.checkpoints_dir, self.device.torch_device, self.parsing_provider
            )
        return self._preprocessor

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
        fit: str = "pad",
        mask_grow: int = 0,
        progress: Progress | None = None,
    ) -> TryOnResult:
        """One try-on: `num_samples` pictures of the person wearing the garment."""
        settings = self.settings(num_samples, steps, guidance_scale, seed, resolution, scheduler)
        person_inputs = self.prepare_person(person, category, mask=mask, resolution=settings.resolution,
                                            fit=fit, mask_grow=mask_grow)
        garment_inputs = self.prepare_garment(garment, category, resolution=settings.resolution, fit=fit)
        return self.generate(person_inputs, garment_inputs, settings, progress=progress)

    @staticmethod
    def settings(num_samples: int = 1, steps: int = 20, guidance_scale: float = 2.0, seed: int | None = None,
                 resolution: tuple[int, int] | str | Resolution = (768, 1024),
                 scheduler: str | SchedulerName = "unipc") -> SamplingSettings:
        """Validated sampling settings; a random seed is drawn (and later reported) when none is given."""
        settings = SamplingSettings(
            num_samples=num_samples, steps=steps, guidance_scale=guidance_scale,
            seed=seed if seed is not None else secrets.randbelow(2**32),
            resolution=parse_resolution(resolution), scheduler=SchedulerName.parse(scheduler),
        )
        settings.validate()
        return settings

    @torch.inference_mode()
    def prepare_person(
        self, person: ImageInput, category: str | Category, *, mask: ImageInput | None = None,
        resolution: tuple[int, int] | str | Resolution = (768, 1024), fit: str = "pad", mask_grow: int = 0,
    ) -> PersonInputs:
        """Everything that depends on the person only: framing, mask, masked person, their latents.
        Batch work reuses it across garments."""
        category = Category.parse(category)
        check_model_category(self.model_type, category)
        resolution = parse_resolution(resolution)
        if fit not in FIT_MODES:
            raise UsageError(f"unknown fit {fit!r}: use {', '.join(FIT_MODES)}")
        check_mask_grow(mask_grow)
        timings: dict[str, float] = {}
        t = time.perf_counter()
        person_img = _as_image(person, "person")
        mask_img = _as_image(mask, "mask") if mask is not None else None
        from ootd.images import fit_to_aspect

        # framed once, from the source straight to the working resolution, as the original resizes each input
        # once (docs/upstream.md §2); pose and parsing see the 384x512 view of it (docs/upstream.md §6, §7)
        person_r, fit_info = fit_to_aspect(person_img, resolution.size, fit, pad_color="edge")
        intermediates: dict[str, Image.Image] = {}
        if mask_img is None:
            made = self.preprocessor(person_r, category, self.model_type, grow=mask_grow)
            mask_img, intermediates = made.mask, dict(made.intermediates)
        else:
            mask_img, _ = fit_to_aspect(mask_img, resolution.size, fit, pad_color=0, resample=Image.NEAREST)
            mask_img = grow_mask(binarize_mask(mask_img), mask_grow * resolution.height // 512)
        # the automatic mask is made at 384x512 and resized NEAREST to the working size (docs/upstream.md §8);
        # a user mask is already there (the resize is then a copy)
        mask_r = binarize_mask(mask_img.resize(resolution.size, Image.NEAREST))
        masked = masked_person_image(person_r, mask_r)
        intermediates["mask"] = mask_r
        intermediates["masked_person"] = masked
        timings["preprocess"] = time.perf_counter() - t

        t = time.perf_counter()
        if self.plan is None or self.plan.request is None or self.plan.request.resolution != resolution.size:
            self.apply_plan(self.make_plan(resolution, 1, True))
        person_latents, original_latents = self._retry_on_oom("encode", lambda: self._encode([masked, person_r]))
        original_latents = original_latents * self.components.vae.config.scaling_factor
        timings["encode_person"] = time.perf_counter() - t
        return PersonInputs(category, resolution, person_r, mask_r, masked, fit_info, intermediates,
                            person_latents, original_latents, timings)

    @torch.inference_mode()
    def prepare_garment(
        self, garment: ImageInput, category: str | Category, *,
        resolution: tuple[int, int] | str | Resolution = (768, 1024), fit: str = "pad",
    ) -> GarmentInputs:
        """Everything that depends on the garment only: prompt embeddings, latents, garment UNet features.
        Batch work reuses it across people."""
        category = Category.parse(category)
        check_model_category(self.model_type, category)
        resolution = parse_resolution(resolution)
        from ootd.images import fit_to_aspect

        timings: dict[str, float] = {}
        garment_img = _as_image(garment, "garment")
        # framed once, straight to the working resolution (docs/upstream.md §2)
        garment_r, _ = fit_to_aspect(garment_img, resolution.size, fit, pad_color="edge")
        t = time.perf_counter()
        prompt = self._conditioning(garment_r, category)
        timings["conditioning"] = time.perf_counter() - t
        t = time.perf_counter()
        if self.plan is None or self.plan.request is None or self.plan.request.resolution != resolution.size:
            self.apply_plan(self.make_plan(resolution, 1, True))
        (garment_latents,) = self._retry_on_oom("encode", lambda: self._encode([garment_r]))
        timings["encode_garment"] = time.perf_counter() - t
        t = time.perf_counter()
        features = self._retry_on_oom("garment UNet", lambda: self._garment_features(garment_latents, prompt))
        timings["garment_unet"] = time.perf_counter() - t
        return GarmentInputs(category, resolution, garment_r, prompt, features, timings)

    @torch.inference_mode()
    def generate(self, person: PersonInputs, garment: GarmentInputs, settings: SamplingSettings,
                 progress: Progress | None = None) -> TryOnResult:
        """The denoising loop and decode for one prepared person and garment."""
        if person.resolution != settings.resolution or garment.resolution != settings.resolution:
            raise UsageError("person, garment and settings were prepared at different resolutions")
        if person.category is not garment.category:
            raise UsageError("person and garment were prepared for different categories")
        timings: dict[str, float | list[float]] = {**person.timings, **garment.timings}
        self.apply_plan(self.make_plan(settings.resolution, settings.num_samples, settings.guidance_scale >= 1.0))
        tick = time.perf_counter()
        latent_mask = self._latent_mask(person.mask, person.original_latents.shape[-2:])

        def denoise() -> tuple[torch.Tensor, list[float]]:
            sched = build_scheduler(settings.scheduler, self.components.scheduler_config)
            sched.set_timesteps(settings.steps, device=self.device.torch_device)
            noise = self._initial_noise(settings, person.original_latents.shape[-2:])
            return self._denoise(sched, noise * sched.init_noise_sigma, noise, garment.prompt, garment.features,
                                 person.person_latents, person.original_latents, latent_mask, settings, progress)

        latents, step_times = self._retry_on_oom("denoising", denoise)
        require_finite_latents(latents, self.precision.unet)
        timings["denoise"] = time.perf_counter() - tick
        timings["steps"] = step_times
        t = time.perf_counter()
        decoded = self._retry_on_oom("decode", lambda: self._decode(latents, progress))
        images = [self._restore_framing(img, person.fit) for img in decoded]
        timings["decode"] = time.perf_counter() - t
        timings["total"] = sum(v for k, v in timings.items() if isinstance(v, float) and k != "total")
        return TryOnResult(
            images=images, mask=person.mask, masked_person=person.masked_person, seed=settings.seed,
            timings=timings, intermediates=dict(person.intermediates),
            settings={
                "model_type": self.model_type.value, "category": person.category.value,
                "samples": str(settings.num_samples), "steps": str(settings.steps),
                "scale": str(settings.guidance_scale), "seed": str(settings.seed),
                "resolution": str(settings.resolution), "scheduler": settings.scheduler.value,
            },
        )

    # -- steps ------------------------------------------------------------------------------------

    @staticmethod
    def _restore_framing(image: Image.Image, fit: FitInfo) -> Image.Image:
        """Cut the padding away again when the person was padded to 3:4 (no resample: the generated pixels)."""
        from ootd.images import restore_framing

        return restore_framing(image, fit, keep_scale=True)

    def _conditioning(self, garment: Image.Image, category: Category) -> torch.Tensor:
        c = self.components
        with self._stage(c.text_encoder, c.image_encoder), patch_sdpa(self.attention):  # CLIP calls SDPA directly
            embeds = prompt_embeddings(
                garment, category, self.model_type, c.tokenizer, c.text_encoder, c.image_processor, c.image_encoder
            )
        return embeds.to(self.device.torch_device, self.precision.unet)

    def _encode(self, images: list[Image.Image]) -> tuple[torch.Tensor, ...]:
        """VAE latents (mode of the posterior, unscaled) of several images in one batched call."""
        vae = self.components.vae
        pixels = torch.cat([self.image_processor.preprocess(img) for img in images])
        # dense in the chosen layout: the processor's output is a channels-last view, and PyTorch's CPU GroupNorm
        # kernel for channels-last input is ~1e-3 off in fp32 (one-pass float32 statistics)
        pixels = as_memory_format(pixels.to(self.device.torch_device, self.precision.vae), self.speed.channels_last)
        with self._stage(vae):
            if self.plan is None or self.plan.vae_encode_batched:
                latents = vae.encode(pixels).latent_dist.mode()
            else:
                latents = torch.cat([vae.encode(p[None]).latent_dist.mode() for p in pixels])
        return latents.to(self.precision.unet).chunk(len(images))

    def _garment_features(self, garment_latents: torch.Tensor, prompt: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run the garment UNet once at timestep 0 on [garment, zeros] (the zeros serve the unconditional
        half of guidance); the features are shared by every sample."""
        batch = as_memory_format(torch.cat([garment_latents, torch.zeros_like(garment_latents)]),
                                 self.speed.channels_last)
        unet = self.components.unet_garm
        with self._stage(unet), capture_block_inputs(unet, stop_early=True) as features:
            unet(batch, 0, encoder_hidden_states=prompt.expand(batch.shape[0], -1, -1), return_dict=False)
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
                model_in = as_memory_format(torch.cat([model_in, person_batch], dim=1), self.speed.channels_last)
                pred = self._unet_vton(unet, model_in, t, prompt_batch, sample_index, guidance)
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

    def _unet_vton(self, unet: torch.nn.Module, model_in: torch.Tensor, t: torch.Tensor, prompt: torch.Tensor,
                   sample_index: torch.Tensor, guidance: bool) -> torch.Tensor:
        """The try-on UNet on the whole guidance batch, or on its two halves when the plan says memory is short."""
        if not (guidance and self.plan is not None and self.plan.guidance_split):
            return unet(model_in, t, encoder_hidden_states=prompt, return_dict=False)[0]
        preds = []
        for part, index in zip(model_in.chunk(2), sample_index.chunk(2), strict=True):
            with self.fusion.rows(index):
                preds.append(unet(part, t, encoder_hidden_states=prompt[: part.shape[0]], return_dict=False)[0])
        return torch.cat(preds)

    def _decode(self, latents: torch.Tensor, progress: Progress | None) -> list[Image.Image]:
        """VAE decode; the plan switches the VAE's own slicing (one image at a time) and tiling on."""
        vae = self.components.vae
        with self._stage(vae):
            latents = as_memory_format((latents / vae.config.scaling_factor).to(self.precision.vae),
                                       self.speed.channels_last)
            pixels = vae.decode(latents, return_dict=False)[0]
        images = self.image_processor.postprocess(pixels.float(), output_type="pil")
        if progress is not None:
            progress("decode", len(images), len(images))
        return images
