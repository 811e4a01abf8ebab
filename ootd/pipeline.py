"""TryOnPipeline: one try-on as numbered steps of short methods (docs/upstream.md §2-§5).

The pipeline holds the models and runs the stages; it asks ootd/runtime.py how to run (device, precision,
attention), ootd/memory/residency.py where the models live (and to retry a stage after out-of-memory),
ootd/memory/planner.py for the plan, ootd/preprocessing.py for the person's mask and ootd/method/sampling.py for
the denoising loop. The public entry points (`from_pretrained`, `__call__`) take a user's words and parse them
once; the stage methods (`mask_person`, `encode_person`, `prepare_garment`, `generate`) take typed values.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

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
from ootd.pipeline_types import GarmentInputs, PersonInputs, Progress, TryOnResult
from ootd.preprocessing import PersonMask, Preprocessor, mask_person
from ootd.runtime import Runtime, RuntimeRequest, resolve_runtime
from ootd.settings import (
    AttentionName,
    Category,
    FitMode,
    ModelType,
    ParsingProvider,
    PrecisionName,
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
from ootd.speedups.quantize import quantize_unets, require_torchao
from ootd.speedups.token_merge import token_merging
from ootd.weights.fewstep import call_sampling
from ootd.weights.integrity import require_finite_latents
from ootd.weights.loading import Components, load_components
from ootd.weights.lora import LoraChoice, apply_lora, read_choice

__all__ = ["GarmentInputs", "PersonInputs", "PersonMask", "TryOnPipeline", "TryOnResult"]


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
        preprocessor: Preprocessor | None = None,  # pose + parsing; loaded lazily when None
        parsing_provider: ParsingProvider = ParsingProvider.CPU,
        max_memory: int | None = None,
        speed: SpeedOptions | None = None,
        profile: DeviceProfile | None = None,
        modes: SpeedModes | None = None,
    ) -> None:
        self.components = components
        # the speed modes calls run with unless they say otherwise; `quantize` is what ootd/speedups/quantize.py
        # did to the UNets' Linear layers (before this)
        self.modes = modes or SpeedModes()
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
        self.lora: LoraChoice | None = None  # the adapter merged into the UNets (ootd/weights/lora.py)
        c = components
        # the one owner of memory: each call's plan, where the models live (the try-on UNet runs every step: it
        # never leaves the device), the retry after out-of-memory
        self.residency = Residency([c.text_encoder, c.image_encoder, c.vae, c.unet_garm, c.unet_vton],
                                   c.unet_vton, device, attention, c.vae, sizes=lambda: ModelSizes.from_components(c),
                                   dtype=precision.unet, vae_dtype=precision.vae,
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

    @classmethod
    def from_pretrained(
        cls,
        checkpoints_dir: str | Path,
        model_type: str | ModelType = "hd",
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        attention: str | AttentionFn = AttentionName.AUTO,
        preprocessor: Preprocessor | None = None,
        parsing_provider: str = "cpu",
        profile: str | Path | None = None,
        max_memory: int | None = None,
        channels_last: bool | None = None,
        compile: bool | None = None,
        progress: Progress | None = None,
        quantize: str | QuantizeName | None = None,
        speed: SpeedModes | None = None,
        lora: str | Path | LoraChoice | None = None, lora_scale: float = 1.0,
    ) -> TryOnPipeline:
        """Load every component of the hd or dc model from a checkpoints tree in the released layout.

        `device` None picks the best available; `dtype` None follows the device profile (fp32 on CPU);
        `attention` is a backend name (auto, flash, sdpa, chunked, math) or an attention function;
        `profile` a TOML file overriding the device profile from configs/profiles/. `speed`: the speed modes
        (ootd/speedups/modes.py) calls run with; `channels_last`, `compile` and `quantize` (none, int8-dynamic,
        int8-weight, fp8: the UNets' Linear layers, needs the `quant` extra) override its fields, and None
        follows it (channels_last and compile: the device profile). `progress` hears ("load", done, total) as
        each component loads. `lora`: an adapter `ootd train` wrote, merged at `lora_scale` (ootd/weights/lora.py).
        """
        choice = lora if isinstance(lora, LoraChoice) else LoraChoice.parse(lora, lora_scale)
        given = {"channels_last": channels_last, "compile": compile,
                 "quantize": QuantizeName.parse(quantize) if quantize is not None else None}
        modes = replace(speed or SpeedModes(), **{k: v for k, v in given.items() if v is not None})
        if isinstance(dtype, torch.dtype):
            dtype = dtype_name(dtype)
        request = RuntimeRequest(
            device=device, precision=PrecisionName.parse(dtype or PrecisionName.AUTO, "precision"),
            attention=AttentionName.parse(attention, "attention backend") if isinstance(attention, str)
            else AttentionName.AUTO, quantize=modes.quantize, channels_last=modes.channels_last,
            compile=modes.compile, profile=Path(profile) if profile else None)
        runtime = resolve_runtime(request, attention=None if isinstance(attention, str) else attention)
        return cls.load(Path(checkpoints_dir), ModelType.parse(model_type), runtime, modes=modes,
                        preprocessor=preprocessor, parsing_provider=ParsingProvider.parse(parsing_provider,
                                                                                          "parsing provider"),
                        max_memory=max_memory, progress=progress, lora=choice)

    @classmethod
    def load(cls, checkpoints: Path, model_type: ModelType, runtime: Runtime, *, modes: SpeedModes | None = None,
             preprocessor: Preprocessor | None = None, parsing_provider: ParsingProvider = ParsingProvider.CPU,
             max_memory: int | None = None, progress: Progress | None = None,
             lora: LoraChoice | None = None) -> TryOnPipeline:
        """Load the hd or dc model on a resolved runtime (typed: the application layer resolves one per process and
        loads every model with it); `modes` as `from_pretrained`'s `speed`; `lora` an adapter merged at its
        scale."""
        start = time.perf_counter()
        modes = modes or SpeedModes()
        if runtime.quantize is not QuantizeName.NONE:
            require_torchao()  # a missing extra is said before minutes of loading
        adapter = read_choice(lora, checkpoints, model_type)  # a damaged or misfit file fails before loading
        attention = runtime.attention_fn()  # a backend that cannot run here fails before the loading too
        components = load_components(checkpoints, model_type, runtime.precision.dtypes(), progress)
        # after the strict loading checks, before the residency places the models (quantized: the merged weights)
        apply_lora(components, model_type, adapter, lora.scale if lora is not None else 1.0)
        quantized = quantize_unets(components, runtime.quantize, runtime.device)
        pipe = cls(components, model_type, runtime.device, runtime.precision, attention, checkpoints, preprocessor,
                   parsing_provider, max_memory, runtime.speed, runtime.profile, replace(modes, quantize=quantized))
        pipe.load_seconds, pipe.lora = time.perf_counter() - start, lora
        return pipe

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

    def describe(self) -> dict[str, object]:
        """Device, precision and attention backend, for --json, --explain and logs."""
        describe_attention = getattr(self.attention, "describe", None)
        return {
            "device": str(self.device.torch_device), "device_name": self.device.name, "arch": self.device.arch,
            "vendor": self.device.vendor, "model_type": self.model_type.value,
            "precision": {k: str(v).removeprefix("torch.") for k, v in self.precision.dtypes().items()},
            "precision_word": self.precision.word(),
            "attention": describe_attention() if callable(describe_attention) else getattr(
                self.attention, "__name__", type(self.attention).__name__),
            "channels_last": self.speed.channels_last, "vae_channels_last": self.speed.vae_channels_last,
            "compile": self.speed.compile, "quantize": self.quantize.value,
            "parsing_providers": self._preprocessor.parsing_providers if self._preprocessor is not None else None,
            "plan": self.plan.to_dict() if self.plan is not None else None,
        }

    # -- preprocessing stage (lazy) ----------------------------------------------------------------

    @property
    def preprocessor(self) -> Preprocessor:
        """Pose + parsing, loaded on first use (a run with a mask never loads them)."""
        if self._preprocessor is None:
            if self.checkpoints_dir is None:
                raise UsageError("no mask given and no checkpoints folder for pose/parsing: pass a mask")
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
        garment_inputs = self.prepare_garment(garment, category, resolution=settings.resolution, fit=fit)
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
        prepared.timings = {"preprocess": seconds, **prepared.timings}
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
        timings = {"encode_person": time.perf_counter() - t}
        return PersonInputs(masked.category, masked.resolution, masked.person, masked.mask, masked.masked_person,
                            masked.fit, dict(masked.intermediates), person_latents, original_latents, timings)

    @torch.inference_mode()
    def prepare_garment(self, garment: ImageInput, category: Category, *,
                        resolution: Resolution = SamplingSettings.resolution,
                        fit: FitMode = FitMode.PAD) -> GarmentInputs:
        """The garment's side alone: prompt embeddings, latents, garment UNet features (a batch reuses it)."""
        check_model_category(self.model_type, category)
        timings: dict[str, float] = {}
        # framed once, straight to the working resolution (docs/upstream.md §2)
        garment_r, _ = fit_to_aspect(as_image(garment, "garment"), resolution.size, fit, pad_color="edge")
        t = time.perf_counter()
        prompt = self._conditioning(garment_r, category)
        timings["conditioning"] = time.perf_counter() - t
        t = time.perf_counter()
        self.residency.plan_for_encodes(resolution.size)
        (garment_latents,) = self.residency.run("encode", lambda: self._encode([garment_r]))
        timings["encode_garment"] = time.perf_counter() - t
        t = time.perf_counter()
        features = self.residency.run("garment UNet", lambda: self.garment_features(garment_latents, prompt))
        timings["garment_unet"] = time.perf_counter() - t
        return GarmentInputs(category, resolution, garment_r, prompt, features, timings)

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
        if modes.quantize is not self.quantize:
            raise UsageError(f"this pipeline was loaded with quantization {self.quantize.value}, not "
                             f"{modes.quantize.value}")
        if modes.feature_cache.on and self.speed.compile:
            raise UsageError("feature caching (cache interval above 1) does not work with a compiled UNet: "
                             "use one of them")
        timings: dict[str, float | list[float]] = {**person.timings, **garment.timings}
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
        timings["denoise"] = time.perf_counter() - tick
        timings["steps"] = step_times
        t = time.perf_counter()
        decoded = self.residency.run("decode", lambda: self._decode(latents, progress))
        # the padding cut away again when the person was padded to 3:4 (no resample: the generated pixels)
        images = [restore_framing(img, person.fit, keep_scale=True) for img in decoded]
        timings["decode"] = time.perf_counter() - t
        timings["total"] = sum(v for k, v in timings.items() if isinstance(v, float) and k != "total")
        return TryOnResult(
            images=images, mask=person.mask, masked_person=person.masked_person, seed=settings.seed,
            timings=timings, intermediates=dict(person.intermediates), model_type=self.model_type,
            category=person.category, sampling=settings, modes=modes, lora=self.lora, fit=person.fit,
        )

    # -- steps ------------------------------------------------------------------------------------

    def _conditioning(self, garment: Image.Image, category: Category) -> torch.Tensor:
        c = self.components
        # CLIP calls SDPA directly
        with self.residency.visit(c.text_encoder, c.image_encoder), patch_sdpa(self.attention):
            embeds = prompt_embeddings(
                garment, category, self.model_type, c.tokenizer, c.text_encoder, c.image_processor, c.image_encoder
            )
        return embeds.to(self.device.torch_device, self.precision.unet)

    def _encode(self, images: list[Image.Image]) -> tuple[torch.Tensor, ...]:
        """VAE latents (mode of the posterior, unscaled) of several images in one batched call."""
        vae = self.components.vae
        pixels = torch.cat([self.image_processor.preprocess(img) for img in images])
        # dense in the VAE's layout: the processor's output is a channels-last view of NCHW-ordered numbers
        pixels = as_memory_format(pixels.to(self.device.torch_device, self.precision.vae),
                                  self.speed.vae_channels_last)
        with self.residency.visit(vae):
            if self.plan is None or self.plan.vae_encode_batched:
                latents = vae.encode(pixels).latent_dist.mode()
            else:
                latents = torch.cat([vae.encode(p[None]).latent_dist.mode() for p in pixels])
        # the latents in the default layout, whatever the VAE's (the UNets lay their inputs out themselves)
        return latents.to(self.precision.unet).contiguous().chunk(len(images))

    def garment_features(self, garment_latents: torch.Tensor, prompt: torch.Tensor) -> dict[str, torch.Tensor]:
        """The garment UNet once at timestep 0 on [garment, zeros] (zeros: guidance's unconditional half)."""
        batch = as_memory_format(torch.cat([garment_latents, torch.zeros_like(garment_latents)]),
                                 self.speed.channels_last)
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
