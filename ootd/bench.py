"""Benchmark of the try-on pipeline: per-stage wall time, peak memory next to the planner's estimate, and,
for comparison, the original OOTDiffusion formulation run on the same weights and inputs.

The original formulation lives here and only here (it is what the library replaces): every try-on
transformer block's self-attention runs over the concatenated [person; garment] tokens (2N of them) through
plain `F.scaled_dot_product_attention`, keeping the first N outputs; the garment UNet runs on a batch of
2 x samples; the three images are VAE-encoded one call each; the whole batch is decoded at once.

`run_bench` takes plain arguments and returns a plain dict (the CLI and `scripts/bench_pipeline.py` print
it). Models come from a checkpoints tree or are built in memory with random weights: "full" is the released
architectures (SD1.5 UNets with 4 and 8 input channels, the SD VAE, CLIP ViT-L/14 vision, the SD1.5 CLIP
text encoder), "tiny" is a few-channel version of them for tests.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import re
import resource
import statistics
import tempfile
import time
import types
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ootd.config import Category, ModelType, parse_resolution
from ootd.device import (
    DeviceInfo,
    Precision,
    SpeedOptions,
    choose_precision,
    choose_speed,
    detect_device,
    load_profile,
)
from ootd.errors import UsageError
from ootd.fusion import capture_block_inputs, transformer_blocks
from ootd.loading import Components, load_components, quiet_libraries
from ootd.memory import (
    RELEASED_UNET_CONFIG,
    RELEASED_VAE_CONFIG,
    STAGES,
    ModelSizes,
    Plan,
    apply_plan_to_vae,
    make_plan,
)
from ootd.speed import as_memory_format, temporary_memory_format, uncompiled

logger = logging.getLogger(__name__)

Log = Callable[[str], None]

# The Stable Diffusion 1.5 scheduler file the released folder carries (read by PNDMScheduler, SPEC 4).
SD15_SCHEDULER_CONFIG: dict[str, Any] = {
    "_class_name": "PNDMScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085,
    "num_train_timesteps": 1000, "set_alpha_to_one": False, "skip_prk_steps": True, "steps_offset": 1,
    "trained_betas": None, "clip_sample": False,
}
TEXT_CONFIG_FULL = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                    "max_position_embeddings": 77, "projection_dim": 768, "hidden_act": "quick_gelu",
                    "vocab_size": 49408}
VISION_CONFIG_FULL = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                      "num_attention_heads": 16, "image_size": 224, "patch_size": 14, "projection_dim": 768,
                      "hidden_act": "quick_gelu"}
TINY_HIDDEN = 32
UNET_CONFIG_TINY: dict[str, Any] = {
    "sample_size": 64, "out_channels": 4, "layers_per_block": 1, "block_out_channels": (32, 64),
    # attention at the second level only (as SDXL does), which keeps CPU tests fast
    "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D"), "up_block_types": ("CrossAttnUpBlock2D", "UpBlock2D"),
    "cross_attention_dim": TINY_HIDDEN, "attention_head_dim": 2, "norm_num_groups": 32,
}
VAE_CONFIG_TINY: dict[str, Any] = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 4, "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4, "block_out_channels": (8, 16, 32, 32), "layers_per_block": 1,
    "norm_num_groups": 8, "sample_size": 64,
}
TEXT_CONFIG_TINY = {"hidden_size": TINY_HIDDEN, "intermediate_size": 37, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "max_position_embeddings": 77, "projection_dim": TINY_HIDDEN}
VISION_CONFIG_TINY = {"hidden_size": TINY_HIDDEN, "intermediate_size": 37, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "image_size": 224, "patch_size": 32, "projection_dim": TINY_HIDDEN}


# ---------------------------------------------------------------------------------------------- models


def _byte_alphabet() -> list[str]:
    """CLIP's byte-level BPE alphabet: a printable stand-in for each of the 256 bytes."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def write_tokenizer(folder: Path) -> Path:
    """A minimal CLIP tokenizer (every byte a token, no merges): enough to run the text encoder."""
    alphabet = _byte_alphabet()
    vocab = alphabet + [c + "</w>" for c in alphabet] + ["<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return folder


def _tokenizer() -> Any:
    from transformers import CLIPTokenizer

    with tempfile.TemporaryDirectory(prefix="ootd-bench-tok-") as tmp:
        with quiet_libraries():
            return CLIPTokenizer.from_pretrained(write_tokenizer(Path(tmp)))


def _image_processor() -> Any:
    try:  # the PIL-based processor, as ootd.loading uses
        from transformers import CLIPImageProcessorPil as Processor
    except ImportError:
        from transformers import CLIPImageProcessor as Processor
    return Processor()  # the defaults are CLIP's 224 pixels, mean and std


def _scheduler_config() -> dict:
    from diffusers import PNDMScheduler

    with quiet_libraries():
        return dict(PNDMScheduler.from_config(SD15_SCHEDULER_CONFIG).config)


def build_random_components(kind: str, precision: Precision, device: torch.device | str = "cpu",
                            seed: int = 0) -> Components:
    """The released architectures ("full") or a tiny version ("tiny") with random weights, built in memory on
    `device` (building on a GPU is much faster than on the CPU)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPVisionConfig, CLIPVisionModelWithProjection

    if kind not in ("full", "tiny"):
        raise UsageError(f"random weights must be full or tiny, not {kind!r}")
    full = kind == "full"
    unet_cfg = RELEASED_UNET_CONFIG if full else UNET_CONFIG_TINY
    vae_cfg = RELEASED_VAE_CONFIG if full else VAE_CONFIG_TINY
    tokenizer = _tokenizer()
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    text_cfg = dict(TEXT_CONFIG_FULL if full else {**TEXT_CONFIG_TINY, "vocab_size": len(tokenizer)}, **ids)
    vision_cfg = VISION_CONFIG_FULL if full else VISION_CONFIG_TINY
    torch.manual_seed(seed)
    with quiet_libraries(), torch.device(device):
        def unet(in_channels: int) -> torch.nn.Module:
            return UNet2DConditionModel(in_channels=in_channels, **unet_cfg).to(precision.unet)

        components = Components(
            tokenizer=tokenizer,
            text_encoder=CLIPTextModel(CLIPTextConfig(**text_cfg)).to(precision.text_encoder),
            image_encoder=CLIPVisionModelWithProjection(CLIPVisionConfig(**vision_cfg)).to(precision.image_encoder),
            image_processor=_image_processor(),
            vae=AutoencoderKL(**vae_cfg).to(precision.vae),
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


# ---------------------------------------------------------------------------------------------- memory


class PeakMemory:
    """Peak memory of this process: GPU allocations (max_memory_allocated) or CPU resident set (VmHWM,
    reset through /proc/self/clear_refs; ru_maxrss where that is not possible, which cannot be reset)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            self.kind = "cuda_max_memory_allocated"
        elif _vm_hwm() is not None and _can_reset_hwm():
            self.kind = "rss_vmhwm"
        else:
            self.kind = "ru_maxrss_not_resettable"

    def reset(self) -> None:
        if self.kind.startswith("cuda"):
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.kind == "rss_vmhwm":
            _can_reset_hwm()

    def read(self) -> int:
        if self.kind.startswith("cuda"):
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        if self.kind == "rss_vmhwm":
            return int(_vm_hwm() or 0)
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def current(self) -> int:
        if self.kind.startswith("cuda"):
            return int(torch.cuda.memory_allocated(self.device))
        return _vm_rss() or 0


def _status_kib(key: str) -> int | None:
    try:
        match = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def _vm_hwm() -> int | None:
    return _status_kib("VmHWM")


def _vm_rss() -> int | None:
    return _status_kib("VmRSS")


def _can_reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class StageRecord:
    """Per stage (a module's forward calls): peak memory, and wall and process-CPU seconds of every call."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def to_dict(self) -> dict[str, Any]:
        return {"peak_memory": dict(self.peaks), "wall": dict(self.wall), "cpu": dict(self.cpu)}


@contextlib.contextmanager
def stage_meter(meter: PeakMemory, modules: dict[str, torch.nn.Module]) -> Iterator[StageRecord]:
    """Measure each named module's forward calls: peak memory (reset before, read after), wall time and the
    process's CPU time (which, unlike wall time, hardly changes when other processes share the CPU)."""
    record = StageRecord()
    handles = []
    started: dict[str, tuple[float, float]] = {}
    for label, module in modules.items():
        def pre(_module, _args, _label=label) -> None:  # noqa: ANN001
            meter.reset()
            started[_label] = (time.perf_counter(), time.process_time())

        def post(_module, _args, _out, _label=label) -> None:  # noqa: ANN001
            if meter.device.type == "cuda":
                torch.cuda.synchronize(meter.device)
            wall0, cpu0 = started.pop(_label)
            record.wall.setdefault(_label, []).append(time.perf_counter() - wall0)
            record.cpu.setdefault(_label, []).append(time.process_time() - cpu0)
            record.peaks[_label] = max(record.peaks.get(_label, 0), meter.read())

        # always_call: the garment UNet stops early by raising from a hook once its features are captured
        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post, always_call=True)]
    try:
        yield record
    finally:
        for handle in handles:
            handle.remove()


def _stage_modules(c: Components) -> dict[str, torch.nn.Module]:
    return {"conditioning": c.image_encoder, "encode": c.vae.encoder, "garment_unet": c.unet_garm,
            "denoise": c.unet_vton, "decode": c.vae.decoder}


# ---------------------------------------------------------------------------------------------- original


def _original_block_forward(block: torch.nn.Module, hidden_states: torch.Tensor,
                            attention_mask: torch.Tensor | None = None,
                            encoder_hidden_states: torch.Tensor | None = None,
                            encoder_attention_mask: torch.Tensor | None = None,
                            *args: Any, garment: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """The original try-on block: self-attention over cat([person, garment]) (2N tokens, full 2N x 2N
    attention), residual over all 2N, keep the first N; cross-attention and feed-forward on those N."""
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
    for name, block in blocks.items():
        if getattr(block, "norm_type", "layer_norm") != "layer_norm" or block.attn2 is None:
            raise UsageError(f"block {name} is not an SD1.5-style block; the original formulation needs one")
    with stock_attention([unet_vton]):
        for name, block in blocks.items():
            block.forward = types.MethodType(partial(_original_block_forward, garment=features[name]), block)
        try:
            yield
        finally:
            for block in blocks.values():
                del block.forward


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_original(components: Components, model_type: ModelType, device: DeviceInfo, precision: Precision,
                 person: Image.Image, garment: Image.Image, mask: Image.Image, category: str = "upper", *,
                 num_samples: int = 1, steps: int = 20, guidance_scale: float = 2.0, seed: int = 0,
                 scheduler: str = "unipc", resolution: tuple[int, int] = (768, 1024),
                 ) -> tuple[list[Image.Image], dict[str, Any]]:
    """One call as the original computes it (see the module docstring), on our components. Inputs are resized
    to `resolution` as the original does. Returns the images and the same timings keys as TryOnResult.
    The networks run as the original runs them: default memory layout, not compiled."""
    c = components
    with temporary_memory_format([c.unet_garm, c.unet_vton, c.vae], False), uncompiled(c.unet_vton), \
            stock_attention([c.unet_garm, c.vae]):
        return _run_original(components, model_type, device, precision, person, garment, mask, category,
                             num_samples=num_samples, steps=steps, guidance_scale=guidance_scale, seed=seed,
                             scheduler=scheduler, resolution=resolution)


def _run_original(components: Components, model_type: ModelType, device: DeviceInfo, precision: Precision,
                  person: Image.Image, garment: Image.Image, mask: Image.Image, category: str, *,
                  num_samples: int, steps: int, guidance_scale: float, seed: int, scheduler: str,
                  resolution: tuple[int, int]) -> tuple[list[Image.Image], dict[str, Any]]:
    from diffusers.image_processor import VaeImageProcessor
    from diffusers.utils.torch_utils import randn_tensor

    from ootd.conditioning import prompt_embeddings
    from ootd.config import SchedulerName
    from ootd.pipeline import binarize_mask, masked_person_image
    from ootd.schedulers import build_scheduler

    c = components
    dev = device.torch_device
    timings: dict[str, Any] = {}
    tick = time.perf_counter()
    processor = VaeImageProcessor(vae_scale_factor=8)
    vae = c.vae
    sf = vae.config.scaling_factor
    saved = (getattr(vae, "use_slicing", False), getattr(vae, "use_tiling", False))
    vae.disable_slicing()
    vae.disable_tiling()
    try:
        with torch.inference_mode():
            t = time.perf_counter()
            person = person.convert("RGB").resize(resolution)
            garment = garment.convert("RGB").resize(resolution)
            mask = binarize_mask(mask.resize(resolution, Image.NEAREST))
            masked = masked_person_image(person, mask)
            timings["preprocess"] = time.perf_counter() - t

            t = time.perf_counter()
            prompt = prompt_embeddings(garment, Category.parse(category), model_type, c.tokenizer, c.text_encoder,
                                       c.image_processor, c.image_encoder).to(dev, precision.unet)
            _sync(dev)
            timings["conditioning"] = time.perf_counter() - t

            t = time.perf_counter()  # three separate encodes
            def encode(img: Image.Image) -> torch.Tensor:
                pixels = processor.preprocess(img).to(dev, precision.vae).contiguous()
                return vae.encode(pixels).latent_dist.mode().to(precision.unet)

            garment_latents = encode(garment)
            person_latents = encode(masked)
            original_latents = encode(person) * sf
            _sync(dev)
            timings["encode"] = time.perf_counter() - t

            guidance = guidance_scale >= 1.0
            copies = 2 if guidance else 1
            batch = num_samples * copies
            t = time.perf_counter()  # garment UNet on 2 x samples
            garm_batch = torch.cat([garment_latents] * num_samples)
            if guidance:
                garm_batch = torch.cat([garm_batch, torch.zeros_like(garm_batch)])
            with capture_block_inputs(c.unet_garm) as captured:
                c.unet_garm(garm_batch, 0, encoder_hidden_states=prompt.expand(batch, -1, -1), return_dict=False)
            features = dict(captured)
            del captured
            _sync(dev)
            timings["garment_unet"] = time.perf_counter() - t

            sched = build_scheduler(SchedulerName.parse(scheduler), c.scheduler_config)
            sched.set_timesteps(steps, device=dev)
            latent_hw = original_latents.shape[-2:]
            generator = torch.Generator("cpu").manual_seed(seed)
            noise = randn_tensor((num_samples, 4, *latent_hw), generator=generator, device=dev, dtype=precision.unet)
            latents = noise * sched.init_noise_sigma
            arr = torch.from_numpy((np.asarray(mask) >= 127).astype(np.float32))[None, None]
            latent_mask = torch.nn.functional.interpolate(arr, size=tuple(latent_hw)).to(dev, precision.unet)
            person_batch = torch.cat([person_latents] * batch)
            prompt_batch = prompt.expand(batch, -1, -1)
            step_times: list[float] = []
            t = time.perf_counter()
            with original_formulation(c.unet_vton, features):
                for i, step_t in enumerate(sched.timesteps):
                    start = time.perf_counter()
                    model_in = torch.cat([latents] * copies)
                    model_in = torch.cat([sched.scale_model_input(model_in, step_t), person_batch], dim=1)
                    pred = c.unet_vton(model_in, step_t, encoder_hidden_states=prompt_batch, return_dict=False)[0]
                    if guidance:
                        cond, uncond = pred.chunk(2)
                        pred = uncond + guidance_scale * (cond - uncond)
                    latents = sched.step(pred, step_t, latents, return_dict=False)[0]
                    init = original_latents
                    if i < len(sched.timesteps) - 1:
                        init = sched.add_noise(init, noise, sched.timesteps[i + 1: i + 2])
                    latents = (1 - latent_mask) * init + latent_mask * latents
                    _sync(dev)
                    step_times.append(time.perf_counter() - start)
            timings["denoise"] = time.perf_counter() - t
            timings["steps"] = step_times
            del features

            t = time.perf_counter()  # the whole batch at once
            pixels = vae.decode((latents / sf).to(precision.vae), return_dict=False)[0]
            images = processor.postprocess(pixels.float(), output_type="pil")
            _sync(dev)
            timings["decode"] = time.perf_counter() - t
    finally:
        (vae.enable_slicing if saved[0] else vae.disable_slicing)()
        (vae.enable_tiling if saved[1] else vae.disable_tiling)()
    timings["total"] = time.perf_counter() - tick
    return images, timings


# ---------------------------------------------------------------------------------------------- steps


def compare_steps(components: Components, device: DeviceInfo, precision: Precision, *,
                  resolution: tuple[int, int] = (768, 1024), num_samples: int = 1, guidance: bool = True,
                  repeats: int = 2, attention: Any = None, speed: SpeedOptions | None = None,
                  log: Log | None = None) -> dict[str, Any]:
    """Try-on UNet calls (the whole cost of a denoising step), ours and the original's, alternating, on the
    same random latents and the same garment features: per-step figures that a changing background load
    (a shared machine) affects alike. Reports wall and process-CPU seconds of every call. Ours runs with
    `speed` (memory layout, compile), the original in the default layout, eagerly, as the original does."""
    from ootd.fusion import TryOnFusion

    say = log or (lambda line: logger.info("%s", line))
    dev = device.torch_device
    c = components
    width, height = resolution
    h, w = height // 8, width // 8
    copies = 2 if guidance else 1
    batch = num_samples * copies
    gen = torch.Generator("cpu").manual_seed(0)
    cross = int(c.unet_vton.config.cross_attention_dim)
    prompt = torch.randn(1, 2, cross, generator=gen).to(dev, precision.unet)
    garment = torch.randn(1, 4, h, w, generator=gen).to(dev, precision.unet)
    sample = torch.randn(batch, 8, h, w, generator=gen).to(dev, precision.unet)
    timestep = torch.tensor(500, device=dev)
    fusion = TryOnFusion(c.unet_vton, attention) if attention is not None else TryOnFusion(c.unet_vton)
    result: dict[str, Any] = {"resolution": list(resolution), "num_samples": num_samples, "batch": batch,
                              "threads": torch.get_num_threads(), "ours": {"wall": [], "cpu": []},
                              "original": {"wall": [], "cpu": []}}
    with torch.inference_mode():
        g = torch.cat([garment, torch.zeros_like(garment)]) if guidance else garment
        with capture_block_inputs(c.unet_garm) as captured:
            c.unet_garm(g, 0, encoder_hidden_states=prompt.expand(copies, -1, -1), return_dict=False)
        features = dict(captured)
        del captured
        batch_features = {k: v.repeat_interleave(num_samples, dim=0) for k, v in features.items()}
        sample_index = torch.arange(copies, device=dev).repeat_interleave(num_samples)
        outputs: dict[str, torch.Tensor] = {}

        def timed(label: str, run: Callable[[], torch.Tensor]) -> None:
            wall, cpu = time.perf_counter(), time.process_time()
            outputs[label] = run()
            _sync(dev)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            result[label]["wall"].append(wall)
            result[label]["cpu"].append(cpu)
            say(f"  {label} UNet call: {wall:.2f} s wall, {cpu:.2f} s CPU (load {_load()})")

        prompts = prompt.expand(batch, -1, -1)
        speed = speed or SpeedOptions()
        ours_sample = as_memory_format(sample, speed.channels_last)
        for _ in range(repeats):
            with fusion.garment(features, sample_index), \
                    temporary_memory_format([c.unet_vton], speed.channels_last):
                timed("ours", lambda: c.unet_vton(ours_sample, timestep, encoder_hidden_states=prompts,
                                                  return_dict=False)[0])
            with original_formulation(c.unet_vton, batch_features), uncompiled(c.unet_vton), \
                    temporary_memory_format([c.unet_vton], False):
                timed("original", lambda: c.unet_vton(sample, timestep, encoder_hidden_states=prompts,
                                                      return_dict=False)[0])
        result["max_abs_diff"] = float((outputs["ours"].float() - outputs["original"].float()).abs().max())
    for label in ("ours", "original"):
        for kind in ("wall", "cpu"):
            result[label][f"median_{kind}"] = statistics.median(result[label][kind])
    result["ratio_wall"] = result["original"]["median_wall"] / result["ours"]["median_wall"]
    result["ratio_cpu"] = result["original"]["median_cpu"] / result["ours"]["median_cpu"]
    return result


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


# ---------------------------------------------------------------------------------------------- FLOPs


def count_step_flops(unet_config: dict | None = None, *, num_samples: int = 4,
                     resolution: tuple[int, int] = (768, 1024), guidance: bool = True,
                     cross_tokens: int = 2) -> dict[str, Any]:
    """FLOPs (2 per multiply-add) of one denoising step and of the once-per-call garment work, ours vs the
    original, counted by torch.utils.flop_counter on the meta device (shapes only: no memory, no compute).

    Defaults to the released SD1.5 UNet architecture.
    """
    from diffusers import UNet2DConditionModel
    from torch.utils.flop_counter import FlopCounterMode

    from ootd.attention import install_attention, sdpa_attention
    from ootd.fusion import TryOnFusion

    cfg = dict(unet_config or RELEASED_UNET_CONFIG)
    meta = torch.device("meta")
    with torch.device(meta), quiet_libraries():
        garm = UNet2DConditionModel.from_config({**cfg, "in_channels": 4})
        vton = UNet2DConditionModel.from_config({**cfg, "in_channels": 8})
    width, height = resolution
    h, w = height // 8, width // 8
    copies = 2 if guidance else 1
    batch = num_samples * copies
    cross = int(cfg.get("cross_attention_dim", 768))
    prompt = torch.empty(1, cross_tokens, cross, device=meta)

    result: dict[str, Any] = {}
    garment_in = torch.empty(copies, 4, h, w, device=meta)
    with torch.inference_mode():
        # stock processors first (the original's), then ours (folded cross-attention) on both UNets
        with FlopCounterMode(display=False) as counter:
            garm(garment_in, 0, encoder_hidden_states=prompt.expand(copies, -1, -1), return_dict=False)
        # the original runs the same garment UNet on 2 x samples: FLOPs are linear in the batch
        result["original_garment_unet"] = counter.get_total_flops() * batch // copies
        install_attention([garm, vton], sdpa_attention)
        with FlopCounterMode(display=False) as counter, capture_block_inputs(garm, stop_early=True) as captured:
            garm(garment_in, 0, encoder_hidden_states=prompt.expand(copies, -1, -1), return_dict=False)
        features = dict(captured)
        result["ours_garment_unet"] = counter.get_total_flops()
        fusion = TryOnFusion(vton)
        sample_index = torch.arange(copies, device=meta).repeat_interleave(num_samples)
        by_op: dict[str, dict[str, int]] = {}
        with fusion.garment(features, sample_index):
            with FlopCounterMode(display=False) as counter:  # the garment keys/values, once per call
                for name, processor in fusion.processors.items():
                    processor.set_garment(fusion.blocks[name].attn1, features[name], sample_index)
            result["ours_garment_kv"] = counter.get_total_flops()
            with FlopCounterMode(display=False) as counter:
                vton(torch.empty(batch, 8, h, w, device=meta), 10, encoder_hidden_states=prompt.expand(batch, -1, -1),
                     return_dict=False)
            result["ours_step"] = counter.get_total_flops()
            by_op["ours_step"] = _flops_by_op(counter)
        batch_features = {k: v.repeat_interleave(num_samples, dim=0) for k, v in features.items()}
        with original_formulation(vton, batch_features), FlopCounterMode(display=False) as counter:
            vton(torch.empty(batch, 8, h, w, device=meta), 10, encoder_hidden_states=prompt.expand(batch, -1, -1),
                 return_dict=False)
        result["original_step"] = counter.get_total_flops()
        by_op["original_step"] = _flops_by_op(counter)
    result["by_op"] = by_op
    return result


def _flops_by_op(counter: Any) -> dict[str, int]:
    """FLOPs per kind of work: convolution, linear layers (mm/addmm), attention (bmm; SDPA decomposes into it
    on the meta device)."""
    kinds = {"convolution": "convolution", "addmm": "linear", "mm": "linear", "bmm": "attention"}
    out: dict[str, int] = {}
    for op, flops in counter.get_flop_counts().get("Global", {}).items():
        name = str(op).split(".")[-1]
        kind = kinds.get(name, name)
        out[kind] = out.get(kind, 0) + int(flops)
    return out


# ---------------------------------------------------------------------------------------------- profiling


def profile_step(run: Callable[[], Any], row_limit: int = 15) -> str:
    """The top operators (self CPU/GPU time) of `run()` under torch.profiler, as a table."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=False) as prof:
        run()
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=row_limit)


# ---------------------------------------------------------------------------------------------- the bench


def _attention_fn(name: str, device: DeviceInfo, dtype: torch.dtype, budget: int) -> Any:
    """The attention function the CLI would use for `--attention name` (plain SDPA if the backends are absent)."""
    try:
        from ootd.attention import build_attention
    except ImportError:  # pragma: no cover - the attention package is always there in this repo
        from ootd.attention import sdpa_attention

        return sdpa_attention
    return build_attention(name, device, dtype, budget)


def versions() -> dict[str, str]:
    import diffusers
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "diffusers": diffusers.__version__,
            "transformers": transformers.__version__, "cuda": str(torch.version.cuda), "hip": str(torch.version.hip)}


def machine(device: DeviceInfo) -> dict[str, Any]:
    info: dict[str, Any] = {
        "device_type": device.type, "device_name": device.name, "arch": device.arch, "vendor": device.vendor,
        "total_memory": device.total_memory, "free_memory": device.free_memory, "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    with contextlib.suppress(OSError):
        info["load_average"] = list(os.getloadavg())
    with contextlib.suppress(OSError, StopIteration):
        text = Path("/proc/cpuinfo").read_text()
        info["cpu_model"] = next(line.split(":", 1)[1].strip() for line in text.splitlines()
                                 if line.startswith("model name"))
    return info


def _summary(timings: dict[str, Any]) -> dict[str, Any]:
    steps = [float(s) for s in timings.get("steps", [])]
    timed = steps[1:] if len(steps) > 2 else steps  # the first step pays for kernel selection / warm-up
    out = {k: float(v) for k, v in timings.items() if k != "steps"}
    if "encode" not in out:  # the pipeline times the person and garment encodes separately
        out["encode"] = sum(v for k, v in out.items() if k.startswith("encode"))
    out["steps"] = steps
    out["s_per_it"] = statistics.median(timed) if timed else float("nan")
    return out


def _median_step(run: dict[str, Any], kind: str) -> float:
    """Median seconds of one try-on UNet call (the bulk of a step), wall or CPU, from the stage record."""
    calls = run["stages"][kind].get("denoise", [])
    timed = calls[1:] if len(calls) > 2 else calls
    return statistics.median(timed) if timed else float("nan")


def _max_abs_diff(a: Sequence[Image.Image], b: Sequence[Image.Image]) -> float:
    return max(float(np.abs(np.asarray(x, dtype=np.float32) - np.asarray(y, dtype=np.float32)).max()) / 255.0
               for x, y in zip(a, b, strict=True))


def run_bench(
    checkpoints: str | Path | None = None,
    *,
    random_weights: str | None = None,
    components: Components | None = None,
    model_type: str = "hd",
    device: str | None = None,
    dtype: str = "auto",
    attention: str = "sdpa",
    resolution: tuple[int, int] | str = (768, 1024),
    num_samples: int = 1,
    steps: int = 2,
    guidance_scale: float = 2.0,
    seed: int = 0,
    scheduler: str = "unipc",
    max_memory: int | None = None,
    channels_last: bool | None = None,
    compile: bool | None = None,
    compare_original: bool = False,
    count_flops: bool = False,
    flops_samples: int = 4,
    flops_resolution: tuple[int, int] | str = (768, 1024),
    run_ours: bool = True,
    warmup: bool = False,
    step_repeats: int = 0,
    threads: int | None = None,
    profile: bool = False,
    log: Log | None = None,
) -> dict[str, Any]:
    """Run one try-on call (and optionally the original's) and return a report dict: machine, versions,
    config, load time, the memory plan, per-stage times and s/it, peak memory measured vs estimated, and
    (optionally) ours/original ratios and FLOPs per step.

    Models: `checkpoints` (a released-layout tree), `random_weights` ("full" or "tiny"), or `components`
    already built (the matrix run reuses them). `warmup` first runs each formulation once with one step (GPU
    kernels, cuDNN/oneDNN primitives), untimed. `step_repeats` > 0 adds `compare_steps` (alternating UNet
    calls, ours vs original). `channels_last` and `compile` (None: the device profile's choice) apply to ours
    only; the original formulation runs in the default layout, eagerly. `threads` sets torch's CPU threads
    (1 makes CPU-time figures immune to other processes' load). `log` gets one line per finished part (for live output).
    """
    say = log or (lambda line: logger.info("%s", line))
    sources = sum(x is not None for x in (checkpoints, random_weights, components))
    if sources != 1:
        raise UsageError("give exactly one of checkpoints, random_weights or components")
    if threads is not None:
        torch.set_num_threads(threads)
    res = parse_resolution(resolution).size
    flops_res = parse_resolution(flops_resolution).size
    info = detect_device(device)  # before the weights are loaded: the plan's budget is what is free now
    precision = choose_precision(info, dtype)
    speed = choose_speed(info, channels_last=channels_last, compile=compile)
    mtype = ModelType(str(model_type).lower())
    report: dict[str, Any] = {
        "machine": machine(info), "versions": versions(),
        "config": {"checkpoints": str(checkpoints) if checkpoints else None,
                   "random_weights": random_weights, "model_type": mtype.value, "dtype": str(precision.unet),
                   "vae_dtype": str(precision.vae), "attention": attention, "resolution": list(res),
                   "num_samples": num_samples, "steps": steps, "guidance_scale": guidance_scale, "seed": seed,
                   "scheduler": scheduler, "max_memory": max_memory,
                   "channels_last": speed.channels_last, "compile": speed.compile},
    }
    meter = PeakMemory(info.torch_device)
    report["memory_before_load"] = meter.current()

    t = time.perf_counter()
    if components is None:
        if checkpoints is not None:
            dtypes = {"unet": precision.unet, "vae": precision.vae, "text_encoder": precision.text_encoder,
                      "image_encoder": precision.image_encoder}
            components = load_components(Path(checkpoints), mtype, dtypes)
        else:
            assert random_weights is not None
            components = build_random_components(random_weights, precision, info.torch_device, seed)
    report["load_seconds"] = time.perf_counter() - t
    say(f"models ready in {report['load_seconds']:.1f} s")

    sizes = ModelSizes.from_components(components)
    guidance = guidance_scale >= 1.0
    device_profile = load_profile(info)
    plan: Plan = make_plan(info, res, num_samples, guidance, precision.unet, attention, sizes, max_memory,
                           vae_dtype=precision.vae, profile=device_profile)
    report["plan"] = plan.to_dict()
    report["plan_text"] = plan.explain()
    say(plan.explain())

    from ootd.pipeline import TryOnPipeline

    attention_fn = _attention_fn(attention, info, precision.unet, plan.attention_budget_bytes)
    pipe = TryOnPipeline(components, mtype, info, precision, attention=attention_fn, speed=speed,
                         profile=device_profile)
    apply_plan_to_vae(components.vae, plan)
    report["memory_after_load"] = meter.current()
    person, garment, mask = synthetic_inputs(seed=seed)
    category = "upper"
    call = {"mask": mask, "num_samples": num_samples, "steps": steps, "guidance_scale": guidance_scale,
            "seed": seed, "resolution": res, "scheduler": scheduler}
    import inspect

    if "plan" in inspect.signature(pipe.__call__).parameters:
        call["plan"] = plan

    ours_images = None
    if run_ours:
        if warmup:
            pipe(person, garment, category, **{**call, "steps": 1})
        meter.reset()
        wall, cpu = time.perf_counter(), time.process_time()
        with stage_meter(meter, _stage_modules(components)) as record:
            result = pipe(person, garment, category, **call)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        ours_images = result.images
        peaks = record.peaks
        report["ours"] = _summary(result.timings)
        report["ours"].update(wall=wall, cpu=cpu, stages=record.to_dict())
        report["ours"]["peak_memory"] = max([meter.read(), *peaks.values()])
        say(_timing_line("ours", report["ours"]))
        report["memory"] = {
            "kind": meter.kind, "estimated_peak": plan.estimate["peak"], "measured_peak": report["ours"]["peak_memory"],
            "stages": {s: {"estimated": plan.estimate[s], "measured": peaks.get(s)} for s in STAGES},
        }
        if attention_fn is not None and hasattr(attention_fn, "describe"):
            report["attention_used"] = attention_fn.describe()
        if profile:
            report["ours"]["profile"] = profile_step(lambda: pipe(person, garment, category, **{**call, "steps": 1}))

    if compare_original:
        original_call = partial(run_original, components, mtype, info, precision, person, garment, mask, category,
                                num_samples=num_samples, guidance_scale=guidance_scale, seed=seed,
                                scheduler=scheduler, resolution=res)
        if warmup:
            original_call(steps=1)
        meter.reset()
        wall, cpu = time.perf_counter(), time.process_time()
        with stage_meter(meter, _stage_modules(components)) as record:
            images, timings = original_call(steps=steps)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        report["original"] = _summary(timings)
        report["original"].update(wall=wall, cpu=cpu, stages=record.to_dict())
        report["original"]["peak_memory"] = max([meter.read(), *record.peaks.values()])
        say(_timing_line("original", report["original"]))
        if run_ours:
            ours, orig = report["ours"], report["original"]
            report["ratio"] = {
                "step": orig["s_per_it"] / ours["s_per_it"], "call": orig["wall"] / ours["wall"],
                "step_cpu": _median_step(orig, "cpu") / _median_step(ours, "cpu"),
                "call_cpu": orig["cpu"] / ours["cpu"],
                "garment_unet": orig["garment_unet"] / ours["garment_unet"],
                "encode": orig["encode"] / ours["encode"], "decode": orig["decode"] / ours["decode"],
            }
            assert ours_images is not None
            report["images_max_abs_diff"] = _max_abs_diff(ours_images, images)
            say("original / ours: " + ", ".join(f"{k} {v:.2f}x" for k, v in report["ratio"].items()))
        if profile:
            report["original"]["profile"] = profile_step(lambda: original_call(steps=1))

    if step_repeats > 0:
        say(f"alternating try-on UNet calls, ours vs original, {step_repeats} each")
        report["steps_compare"] = compare_steps(components, info, precision, resolution=res, num_samples=num_samples,
                                                guidance=guidance, repeats=step_repeats, attention=attention_fn,
                                                speed=speed, log=say)
        sc = report["steps_compare"]
        say(f"UNet call original / ours: {sc['ratio_wall']:.2f}x wall, {sc['ratio_cpu']:.2f}x CPU "
            f"(max abs diff {sc['max_abs_diff']:.2e})")

    if count_flops:
        t = time.perf_counter()
        flops = count_step_flops(dict(components.unet_vton.config), num_samples=flops_samples,
                                 resolution=flops_res, guidance=guidance)
        flops["ratio_step"] = flops["original_step"] / flops["ours_step"]
        flops.update({"num_samples": flops_samples, "resolution": list(flops_res), "guidance": guidance,
                      "seconds": time.perf_counter() - t})
        report["flops"] = flops
        say(f"FLOPs per step at {flops_res[0]}x{flops_res[1]}, {flops_samples} samples: ours "
            f"{flops['ours_step'] / 1e12:.2f} T, original {flops['original_step'] / 1e12:.2f} T "
            f"({flops['ratio_step']:.2f}x)")
    return report


def _timing_line(label: str, s: dict[str, Any]) -> str:
    parts = [f"{k} {s[k]:.2f}s" for k in ("conditioning", "encode", "garment_unet", "denoise", "decode", "total")
             if k in s]
    steps = " ".join(f"{x:.2f}" for x in s.get("steps", []))
    peak = s["peak_memory"] / 2**30
    return f"{label}: {', '.join(parts)}; steps [{steps}] s, {s['s_per_it']:.3f} s/it; peak {peak:.2f} GiB"


def run_matrix(
    *,
    random_weights: str = "full",
    device: str | None = None,
    dtypes: Sequence[str] = ("bf16", "fp16"),
    attentions: Sequence[str] = ("flash", "sdpa", "chunked"),
    resolution: tuple[int, int] | str = (768, 1024),
    num_samples: int = 4,
    steps: int = 3,
    original: bool = True,
    count_flops: bool = True,
    time_limit: float | None = None,
    warmup: bool = True,
    speed_variants: Sequence[str] = (),
    log: Log | None = None,
    on_update: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every (dtype, attention backend) pair on the same random weights, plus the original formulation per
    dtype: s/it, whole call and peak memory next to the estimate. Backends that cannot run here are recorded
    as skipped; runs that would start after `time_limit` seconds are skipped too. `speed_variants`
    ("channels_last", "compile") add, per dtype, a run of the first backend that ran with that option on (the
    compile run comes last: its compiled UNet stays with the components). `on_update` gets the report so far
    after every run (to save partial results if the whole is cut short)."""
    unknown = set(speed_variants) - {"channels_last", "compile"}
    if unknown:
        raise UsageError(f"unknown speed variants {sorted(unknown)}: use channels_last, compile")
    say = log or (lambda line: logger.info("%s", line))
    start = time.perf_counter()
    info = detect_device(device)
    out: dict[str, Any] = {"machine": machine(info), "versions": versions(), "runs": [], "skipped": [],
                           "config": {"random_weights": random_weights, "resolution": list(parse_resolution(
                               resolution).size), "num_samples": num_samples, "steps": steps, "warmup": warmup}}

    def update() -> None:
        out["seconds"] = time.perf_counter() - start
        if on_update is not None:
            on_update(out)

    if count_flops:
        flops = count_step_flops(num_samples=num_samples, resolution=parse_resolution(resolution).size)
        flops["ratio_step"] = flops["original_step"] / flops["ours_step"]
        out["flops"] = flops
    for dtype in dtypes:
        try:
            precision = choose_precision(info, dtype)
        except Exception as exc:  # noqa: BLE001 - any refusal is recorded, not fatal
            out["skipped"].append({"dtype": dtype, "reason": str(exc)})
            continue
        components = build_random_components(random_weights, precision, info.torch_device)
        first = True
        ran: list[str] = []
        variants = [(a, {}) for a in attentions]
        variants += [(None, {v: True}) for v in ("channels_last", "compile") if v in speed_variants]
        for attention, options in variants:
            if attention is None:  # a speed option, on the first backend that ran
                if not ran:
                    continue
                attention = ran[0]
            if time_limit is not None and time.perf_counter() - start > time_limit:
                out["skipped"].append({"dtype": dtype, "attention": attention, **options, "reason": "time limit"})
                continue
            try:
                _attention_fn(attention, info, precision.unet, 1 << 30)
            except Exception as exc:  # noqa: BLE001
                out["skipped"].append({"dtype": dtype, "attention": attention, "reason": str(exc)})
                say(f"{dtype} {attention}: skipped ({exc})")
                continue
            say(f"{dtype} {attention}{''.join(f' {k}' for k in options)} ...")
            try:
                report = run_bench(components=components, device=device, dtype=dtype, attention=attention,
                                   resolution=resolution, num_samples=num_samples, steps=steps,
                                   channels_last=options.get("channels_last", False),
                                   compile=options.get("compile", False),
                                   compare_original=original and first, warmup=warmup, log=say)
            except torch.OutOfMemoryError as exc:
                out["skipped"].append({"dtype": dtype, "attention": attention, **options,
                                       "reason": f"out of memory: {exc}"})
                continue
            first = False
            if not options:
                ran.append(attention)
            out["runs"].append({"dtype": dtype, "attention": attention, "channels_last": bool(options.get(
                "channels_last")), "compile": bool(options.get("compile")), **{k: report[k] for k in report if k in (
                    "ours", "original", "ratio", "memory", "plan", "images_max_abs_diff", "attention_used")}})
            update()
        del components
        if info.type == "cuda":
            torch.cuda.empty_cache()
    update()
    return out
