"""TryOnPipeline: one try-on as numbered steps of short methods (docs/upstream.md §2-§5).

The pipeline holds the models and runs the stages; it asks ootd/runtime.py how to run (device, precision,
attention), ootd/memory/residency.py where the models live (and to retry a stage after out-of-memory),
ootd/memory/planner.py for the plan, ootd/preprocessing.py for the person's mask and ootd/method/sampling.py for
the denoising loop. It is built by the model owner (ootd/models/: `Models.pipeline`), which loads its networks.
`__call__` takes a user's words and parses them once; the stage methods (`mask_person`, `encode_person`,
`prepare_garment`, `generate`) take typed values.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch
from diffusers.image_processor import VaeImageProcessor
from PIL import Image

from ootd.attention import AttentionFn, install_attention, patch_sdpa, sdpa_attention
from ootd.errors import UsageError
from ootd.hardware.device import DeviceInfo
from ootd.hardware.dtypes import dtype_name
from ootd.hardware.policy import Precision, SpeedOptions
from ootd.hardware.profiles import DeviceProfile, load_profile
from ootd.imaging.files import ImageInput
from ootd.imaging.framing import fit_to_aspect, restore_framing
from ootd.imaging.masks import as_image
from ootd.memory.planner import Plan
from ootd.memory.residency import Residency
from ootd.memory.sizes import ModelSizes
from ootd.method.conditioning import prompt_embeddings
from ootd.method.fusion import TryOnFusion, capture_block_inputs
from ootd.method.guidance import guided_model, initial_noise, latent_mask, sample_index
from ootd.method.sampling import Inpaint, StepCallback, StepTimer, chain, sample
from ootd.method.schedulers import build_scheduler, set_timesteps
from ootd.pipeline_types import GarmentInputs, PersonInputs, Progress, RunInfo, Timings, TryOnResult
from ootd.preprocessing import PersonMask, Preprocessor, frame_like_results, mask_person
from ootd.settings import (
    Category,
    FitMode,
    ModelType,
    ParsingProvider,
    QuantizeName,
    Resolution,
    SamplingSettings,
    SchedulerName,
    check_mask_grow,
    check_model_category,
)
from ootd.speedups.execution import as_memory_format, compile_module, set_memory_format
from ootd.speedups.feature_cache import feature_cache
from ootd.speedups.modes import FeatureCache, SpeedModes, TokenMerge
from ootd.speedups.token_merge import token_merging
from ootd.weights.fewstep import call_sampling
from ootd.weights.integrity import require_finite_latents
from ootd.weights.loading import Components
from ootd.weights.lora import LoraChoice

__all__ = ["GarmentInputs", "PersonInputs", "PersonMask", "TryOnPipeline", "TryOnResult"]


def encode_images(vae: torch.nn.Module, images: list[Image.Image], processor: VaeImageProcessor, device: torch.device,
                  dtype: torch.dtype, channels_last: bool = False, batched: bool = True) -> torch.Tensor:
    """VAE latents (the posterior's mode of [-1, 1] pixels, unscaled; docs/upstream.md §3) of `images`, [N, 4, h, w]
    in `dtype` on `device`: how the pipeline encodes the person and the garment, and `ootd train prepare` its
    cache entries (ootd/training/encode.py). `batched` False: one image per VAE call (less memory)."""
    pixels = torch.cat([processor.preprocess(img) for img in images])
    # dense in the VAE's layout: the processor's output is a channels-last view of NCHW-ordered numbers
    pixels = as_memory_format(pixels.to(device, dtype), channels_last)
    if batched:
        return vae.encode(pixels).latent_dist.mode()
    return torch.cat([vae.encode(p[None]).latent_dist.mode() for p in pixels])


class TryOnPipeline:
    """Person photo + garment photo -> photos of that person wearing that garment."""

    def __init__(
        self,
        components: Components,
        model_type: ModelType,
        device: DeviceInfo,
        precision: Precision,
        attention: AttentionFn = sdpa_attention,
        preprocessor: Preprocessor | Callable[[], Preprocessor] | None = None,  # pose + parsing, or its getter
        parsing_provider: ParsingProvider = ParsingProvider.CPU,
        max_memory: int | None = None,
        speed: SpeedOptions | None = None,
        profile: DeviceProfile | None = None,
        modes: SpeedModes | None = None,
    ) -> None:
        """A pipeline over loaded `components` (the model owner, ootd/models/, builds it; a library user asks
        `Models.pipeline`). `preprocessor`: pose + parsing, or the owner's getter, called when a mask is first
        made here (a run with a mask never loads them)."""
        self.components = components
        # the speed modes calls run with unless they say otherwise; `quantize` is what ootd/speedups/quantize.py
        # did to the UNets' Linear layers (before this)
        self.modes = modes or SpeedModes()
        self.model_type = model_type
        self.device = device
        self.precision = precision
        getter = preprocessor is not None and not isinstance(preprocessor, Preprocessor)
        self._preprocessor: Preprocessor | None = None if getter else preprocessor  # type: ignore[assignment]
        self._get_preprocessor = preprocessor if getter else None
        self.parsing_provider = parsing_provider
        self.image_processor = VaeImageProcessor(vae_scale_factor=8)
        self.attention = attention
        self.fusion = TryOnFusion(components.unet_vton, attention)
        # every other attention module of the UNets and the VAE through the same backend
        install_attention([components.unet_garm, components.unet_vton, components.vae], attention)
        self.load_seconds = 0.0
        self.lora: LoraChoice | None = None  # the adapter merged into the UNets (ootd/weights/lora.py)
        c = components
        # the one owner of memory: each call's plan, where the models live (the try-on UNet runs every step: it
        # never leaves the device), the retry after out-of-memory; a fine-tune's pipeline has no CLIP encoders
        held = [m for m in (c.text_encoder, c.image_encoder, c.vae, c.unet_garm, c.unet_vton) if m is not None]
        self.residency = Residency(held, c.unet_vton, device, attention, c.vae,
                                   sizes=lambda: ModelSizes.from_components(c), dtype=precision.unet,
                                   vae_dtype=precision.vae,
                                   profile=profile or load_profile(device),  # the memory plan reads its defaults
                                   max_memory=max_memory)
        self.speed = speed or SpeedOptions()
        set_memory_format([components.unet_garm, components.unet_vton], self.speed.channels_last)
        set_memory_format([components.vae], self.speed.vae_channels_last)  # NHWC in bf16 on the CPU
        if self.speed.compile:
            compile_module(components.unet_vton)  # the network that runs every step

    @property
    def quantize(self) -> QuantizeName:
        return self.modes.quantize

    @property
    def plan(self) -> Plan | None:
        """The memory plan of the latest call (ootd/memory/residency.py makes and applies it)."""
        return self.residency.plan

    @property
    def max_memory(self) -> int | None:
        return self.residency.max_memory

    @property
    def profile(self) -> DeviceProfile:
        return self.residency.profile

    def describe(self) -> RunInfo:
        """Device, precision, attention backend (with what it ran so far), speed options and the latest memory
        plan: what --json, --explain, the PNG record and logs report."""
        describe_attention = getattr(self.attention, "describe", None)
        device = str(self.device.torch_device)
        name = self.device.name
        precision = {k: dtype_name(v) for k, v in self.precision.dtypes().items()}
        return RunInfo(
            device=f"{device} ({name})" if name and name != device and "(" not in device else device,
            precision=precision["unet"],
            attention=describe_attention() if callable(describe_attention) else getattr(
                self.attention, "__name__", type(self.attention).__name__),
            threads=torch.get_num_threads(), device_name=name, arch=self.device.arch, vendor=self.device.vendor,
            model_type=self.model_type.value, precision_word=self.precision.word(),
            precision_by_component={k: str(v).removeprefix("torch.") for k, v in self.precision.dtypes().items()},
            channels_last=self.speed.channels_last, vae_channels_last=self.speed.vae_channels_last,
            compile=self.speed.compile, quantize=self.quantize.value,
            parsing_providers=self._preprocessor.parsing_providers if self._preprocessor is not None else None,
            plan=self.plan.to_dict() if self.plan is not None else None, described=True)

    # -- preprocessing stage (lazy) ----------------------------------------------------------------

    @property
    def preprocessor(self) -> Preprocessor:
        """Pose + parsing, asked for on first use (a run with a mask never loads them)."""
        if self._preprocessor is None:
            if self._get_preprocessor is None:
                raise UsageError("no mask given and no pose and parsing models for this pipeline: pass a mask")
            self._preprocessor = self._get_preprocessor()
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
        num_samples: int = SamplingSettings.num_samples,
        steps: int | None = None, guidance_scale: float | None = None,
        seed: int | None = None,
        resolution: tuple[int, int] | str | Resolution = SamplingSettings.resolution,
        scheduler: str | SchedulerName | None = None,
        cache_interval: int | None = None, token_merge: float | None = None,
        fit: str | FitMode = FitMode.PAD,
        mask_grow: int = 0,
        progress: Progress | None = None, callback: StepCallback | None = None,
    ) -> TryOnResult:
        """One try-on: `num_samples` pictures; None keeps the speed modes (`cache_interval`, `token_merge`) and takes
        a few-step adapter's own sampling, else the defaults (`steps`, `guidance_scale`, `scheduler`)."""
        settings = call_sampling(self.lora.few_step if self.lora is not None else None, num_samples=num_samples,
                                 steps=steps, guidance_scale=guidance_scale, seed=seed, resolution=resolution,
                                 scheduler=scheduler)
        modes = self.modes
        if cache_interval is not None:
            modes = replace(modes, feature_cache=FeatureCache(cache_interval))
        if token_merge is not None:
            modes = replace(modes, token_merge=TokenMerge(token_merge))
        category, fit = Category.parse(category), FitMode.parse(fit)
        person_inputs = self.prepare_person(person, category, mask=mask, resolution=settings.resolution, fit=fit,
                                            mask_grow=check_mask_grow(mask_grow))
        garment_inputs = self.prepare_garment(garment, category, resolution=settings.resolution, fit=fit,
                                              guidance=settings.guidance)
        return self.generate(person_inputs, garment_inputs, settings, progress=progress, callback=callback,
                             modes=modes)

    def mask_person(self, person: ImageInput, category: Category, *, mask: ImageInput | None = None,
                    resolution: Resolution = SamplingSettings.resolution, fit: FitMode = FitMode.PAD,
                    mask_grow: int = 0) -> PersonMask:
        """The person framed at the working resolution with its mask (pose + parsing, or the given one)."""
        check_model_category(self.model_type, category)
        return mask_person(as_image(person, "person"), category, self.model_type, resolution, fit, mask_grow,
                           mask=as_image(mask, "mask") if mask is not None else None,
                           preprocessor=self.preprocessor if mask is None else None)

    @torch.inference_mode()
    def prepare_person(
        self, person: ImageInput, category: Category, *, mask: ImageInput | None = None,
        resolution: Resolution = SamplingSettings.resolution, fit: FitMode = FitMode.PAD, mask_grow: int = 0,
    ) -> PersonInputs:
        """The person's side alone: framing, mask, masked person, their latents (a batch reuses it)."""
        t = time.perf_counter()
        masked = self.mask_person(person, category, mask=mask, resolution=resolution, fit=fit, mask_grow=mask_grow)
        seconds = time.perf_counter() - t
        prepared = self.encode_person(masked)
        prepared.timings = Timings({"preprocess": seconds, **prepared.timings.stages})
        return prepared

    @torch.inference_mode()
    def encode_person(self, masked: PersonMask) -> PersonInputs:
        """The latents of a masked person (made by `mask_person`, here or before the models loaded)."""
        if masked.model_type is not self.model_type:
            raise UsageError(f"the mask was made for the {masked.model_type.value} model, this is the "
                             f"{self.model_type.value} model")
        t = time.perf_counter()
        self.residency.plan_for_encodes(masked.resolution.size)
        person_latents, original_latents = self.residency.run(
            "encode", lambda: self._encode([masked.masked_person, masked.person]))
        original_latents = original_latents * self.components.vae.config.scaling_factor
        timings = Timings({"encode_person": time.perf_counter() - t})
        return PersonInputs(masked.category, masked.resolution, masked.person, masked.mask, masked.masked_person,
                            masked.fit, dict(masked.intermediates), person_latents, original_latents, timings,
                            masked.parse)

    @torch.inference_mode()
    def prepare_garment(self, garment: ImageInput, category: Category, *,
                        resolution: Resolution = SamplingSettings.resolution,
                        fit: FitMode = FitMode.PAD, guidance: bool = True) -> GarmentInputs:
        """The garment's side alone: prompt embeddings, latents, garment UNet features (a batch reuses it);
        `guidance` False (a scale below 1, as a few-step adapter's) leaves out guidance's unconditional item,
        which such a call never reads, and halves the garment UNet's work."""
        check_model_category(self.model_type, category)
        timings = Timings()
        # framed once, straight to the working resolution (docs/upstream.md §2)
        garment_r, _ = fit_to_aspect(as_image(garment, "garment"), resolution.size, fit, pad_color="edge")
        t = time.perf_counter()
        prompt = self._conditioning(garment_r, category)
        timings.add("conditioning", time.perf_counter() - t)
        t = time.perf_counter()
        self.residency.plan_for_encodes(resolution.size, guidance)  # the garment UNet's pass runs under it too
        (garment_latents,) = self.residency.run("encode", lambda: self._encode([garment_r]))
        timings.add("encode_garment", time.perf_counter() - t)
        t = time.perf_counter()
        features = self.residency.run("garment UNet",
                                      lambda: self.garment_features(garment_latents, prompt, unconditional=guidance))
        timings.add("garment_unet", time.perf_counter() - t)
        return GarmentInputs(category, resolution, garment_r, prompt, features, timings, unconditional=guidance)

    @torch.inference_mode()
    def generate(self, person: PersonInputs, garment: GarmentInputs, settings: SamplingSettings,
                 progress: Progress | None = None, callback: StepCallback | None = None,
                 modes: SpeedModes | None = None, photo_pixels: int = 0) -> TryOnResult:
        """The denoising loop and decode for one prepared person and garment, with the pipeline's speed modes
        or `modes` (token merging and feature caching may differ per call; quantization is the loaded one);
        `photo_pixels`: the caller brings the results to a photo this large (the plan counts it).

        `callback(step, t, latents)` runs after every step (after the inpainting blend) and may return new
        latents, as diffusers' callback_on_step_end."""
        modes = modes or self.modes
        if person.resolution != settings.resolution or garment.resolution != settings.resolution:
            raise UsageError("person, garment and settings were prepared at different resolutions")
        if person.category is not garment.category:
            raise UsageError("person and garment were prepared for different categories")
        if settings.guidance and not garment.unconditional:
            raise UsageError("the garment was prepared without guidance's unconditional half (guidance=False), "
                             f"and this call guides (guidance scale {settings.guidance_scale})")
        if modes.quantize is not self.quantize:
            raise UsageError(f"this pipeline was loaded with quantization {self.quantize.value}, not "
                             f"{modes.quantize.value}")
        if modes.feature_cache.on and self.speed.compile:
            raise UsageError("feature caching (cache interval above 1) does not work with a compiled UNet: "
                             "use one of them")
        timings = Timings({**person.timings.stages, **garment.timings.stages})
        self.residency.apply(self.residency.make_plan(settings.resolution.size, settings.num_samples,
                                                      settings.guidance, None, photo_pixels))
        tick = time.perf_counter()
        device, dtype, latent_hw = self.device.torch_device, self.precision.unet, person.original_latents.shape[-2:]
        mask = latent_mask(person.mask, latent_hw, device, dtype)

        def denoise() -> tuple[torch.Tensor, list[float]]:
            sched = build_scheduler(settings.scheduler, self.components.scheduler_config)
            set_timesteps(sched, settings.steps, self.device.torch_device)
            noise = initial_noise(settings.seed, settings.num_samples, latent_hw, device, dtype)
            inpaint = Inpaint(person.original_latents, noise, mask)
            return self._denoise(sched, noise * sched.init_noise_sigma, inpaint, garment, person.person_latents,
                                 settings, modes, progress, callback)

        latents, step_times = self.residency.run("denoising", denoise)
        require_finite_latents(latents, self.precision.unet)
        timings.add("denoise", time.perf_counter() - tick)
        timings.steps = step_times
        t = time.perf_counter()
        decoded = self.residency.run("decode", lambda: self._decode(latents, progress))
        # the padding cut away again when the person was padded to 3:4 (no resample: the generated pixels)
        images = [restore_framing(img, person.fit, keep_scale=True) for img in decoded]
        timings.add("decode", time.perf_counter() - t)
        return TryOnResult(
            images=images, mask=person.mask, masked_person=person.masked_person, seed=settings.seed,
            timings=timings, intermediates=frame_like_results(person.intermediates, person.fit),
            model_type=self.model_type,
            category=person.category, sampling=settings, modes=modes, lora=self.lora, fit=person.fit,
            ran=self.describe(),
        )

    # -- steps ------------------------------------------------------------------------------------

    def _conditioning(self, garment: Image.Image, category: Category) -> torch.Tensor:
        c = self.components
        if c.text_encoder is None or c.image_encoder is None:
            raise UsageError("this pipeline has no CLIP encoders (a fine-tune's: the prompt embeddings come from "
                             "its cache)")
        # CLIP calls SDPA directly
        with self.residency.visit(c.text_encoder, c.image_encoder), patch_sdpa(self.attention):
            embeds = prompt_embeddings(
                garment, category, self.model_type, c.tokenizer, c.text_encoder, c.image_processor, c.image_encoder
            )
        return embeds.to(self.device.torch_device, self.precision.unet)

    def _encode(self, images: list[Image.Image]) -> tuple[torch.Tensor, ...]:
        """VAE latents (mode of the posterior, unscaled) of several images in one batched call, or one at a time
        when the plan says so."""
        vae = self.components.vae
        with self.residency.visit(vae):
            latents = encode_images(vae, images, self.image_processor, self.device.torch_device, self.precision.vae,
                                    self.speed.vae_channels_last,
                                    batched=self.plan is None or self.plan.vae_encode_batched)
        # the latents in the default layout, whatever the VAE's (the UNets lay their inputs out themselves)
        return latents.to(self.precision.unet).contiguous().chunk(len(images))

    def garment_features(self, garment_latents: torch.Tensor, prompt: torch.Tensor,
                         unconditional: bool = True) -> dict[str, torch.Tensor]:
        """The garment UNet once at timestep 0 on [garment, zeros] (zeros: guidance's unconditional half), or on
        [garment] alone where no guidance will read the unconditional half."""
        items = [garment_latents, torch.zeros_like(garment_latents)] if unconditional else [garment_latents]
        batch = as_memory_format(torch.cat(items), self.speed.channels_last)
        unet = self.components.unet_garm
        with self.residency.visit(unet), capture_block_inputs(unet, stop_early=True) as features:
            unet(batch, 0, encoder_hidden_states=prompt.expand(batch.shape[0], -1, -1), return_dict=False)
        return dict(features)

    def _denoise(self, sched, latents: torch.Tensor, inpaint: Inpaint, garment: GarmentInputs,  # noqa: ANN001
                 person_latents: torch.Tensor, settings: SamplingSettings, modes: SpeedModes,
                 progress: Progress | None, callback: StepCallback | None = None) -> tuple[torch.Tensor, list[float]]:
        """ootd/method/sampling.py's loop with guidance and the speed modes' hooks; latents and step seconds."""
        index = sample_index(settings.num_samples, settings.guidance, latents.device)
        unet = self.components.unet_vton
        model_fn = guided_model(lambda *args: self._unet_vton(unet, *args), garment.prompt, person_latents, index,
                                settings.guidance_scale, settings.guidance)
        timer = StepTimer(len(sched.timesteps), progress)
        with (self.fusion.garment(garment.features, index), feature_cache(unet, modes.feature_cache) as cache,
              token_merging(self.fusion, modes.token_merge, latents.shape[-2:])):
            steps = chain(cache.on_step if cache is not None else None, callback, timer)
            latents = sample(model_fn, sched, latents, inpaint=inpaint, callback=steps, seed=settings.seed)
        return latents, timer.times

    def _unet_vton(self, unet: torch.nn.Module, model_in: torch.Tensor, t: torch.Tensor, prompt: torch.Tensor,
                   sample_index: torch.Tensor, guidance: bool) -> torch.Tensor:
        """The try-on UNet on the whole guidance batch, or on its two halves when the plan says memory is short."""
        model_in = as_memory_format(model_in, self.speed.channels_last)
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
        with self.residency.visit(vae):
            latents = as_memory_format((latents / vae.config.scaling_factor).to(self.precision.vae),
                                       self.speed.vae_channels_last)
            pixels = vae.decode(latents, return_dict=False)[0]
        images = self.image_processor.postprocess(pixels.float(), output_type="pil")
        if progress is not None:
            progress("decode", len(images), len(images))
        return images
