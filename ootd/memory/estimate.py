"""Per-stage peak memory estimates of one try-on call (pure functions; the planner in ootd/memory/planner.py searches
over them). The estimate is

    stage peak = resident weights + the stage's own weights + overhead x (tensors alive in the stage)

where the tensor terms scale with the latent tokens (UNets), the pixels (VAE) or the attention score
matrix (the attention workspace of the chosen backend), with coefficients from ootd/memory/sizes.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ootd.attention.chunked import score_bytes
from ootd.hardware.device import DeviceInfo
from ootd.hardware.dtypes import as_dtype, dtype_name, itemsize
from ootd.hardware.profiles import DeviceProfile
from ootd.memory.sizes import ModelSizes
from ootd.settings import AttentionName

MIB = 1 << 20
GIB = 1 << 30

OFFLOAD_LEVELS = ("none", "model", "sequential")
FUSED_BACKENDS = (AttentionName.FLASH, AttentionName.SDPA)  # no score matrix in memory
STAGES = ("conditioning", "encode", "garment_unet", "denoise", "decode")
# Tensors the estimate cannot see: allocator rounding and fragmentation, convolution workspaces (GPU);
# on CPU also memory the C allocator keeps after frees. CPU: fitted to the peak RSS per stage of full-size
# fp32 runs (docs/benchmarks.md: -3%..+9% at 384x512 and 768x1024). GPU: not calibrated on a GPU yet.
GPU_OVERHEAD = 1.2
CPU_OVERHEAD = 1.3
# Images in the largest batched VAE encode: the pipeline encodes [masked person, person] together and the
# garment on its own.
ENCODE_BATCH = 2
# Bytes per photo pixel of bringing results back to the photo (ootd/imaging/photo.py), at most: the photo and
# its copy (RGBA), the generated picture at the photo's size, the mask, its binary and feathered forms, the
# blended region's crops (docs/benchmarks.md, "Results at the photo's size"). Host memory: counted on the CPU.
# Not times the samples: the pictures are made one at a time, each closed before the next is made
# (JobOutcome.pictures, PhotoPictures), so one exists at a time (measured: the same peak for 1 and 3 samples).
PHOTO_BYTES_PER_PIXEL = 16
# Resident memory of the Python process itself on CPU (interpreter, torch and its libraries: 0.31 GiB after
# the imports, 0.43 GiB beyond the weights once they are loaded).
CPU_RUNTIME_BYTES = 450 * MIB


@dataclass(frozen=True)
class PlanRequest:
    """What one call asks of memory: where it runs, its size, precision and attention backend, and the models'
    sizes; the one request the estimate and the planner (ootd/memory/planner.py) both take. Dtypes may be given
    as torch dtypes or names; they are kept as names."""

    device: DeviceInfo
    resolution: tuple[int, int]  # (width, height) in pixels
    num_samples: int
    guidance: bool
    dtype: torch.dtype | str  # the UNets' and encoders'
    attention: str
    sizes: ModelSizes
    max_memory: int | None = None  # the budget; None: the device's free memory less a margin
    vae_dtype: torch.dtype | str | None = None  # None: `dtype`
    profile: DeviceProfile | None = None
    photo_pixels: int = 0  # results brought back to a photo this large (--keep-unmasked), on the CPU

    def __post_init__(self) -> None:
        if self.num_samples < 1:
            raise ValueError("num_samples must be at least 1")
        set_ = object.__setattr__
        set_(self, "resolution", (int(self.resolution[0]), int(self.resolution[1])))
        set_(self, "dtype", dtype_name(self.dtype))
        set_(self, "vae_dtype", dtype_name(self.vae_dtype) if self.vae_dtype is not None else None)

    def with_budget(self, max_memory: int | None) -> PlanRequest:
        return replace(self, max_memory=max_memory)


def attention_workspace(backend: str, batch: int, heads: int, queries: int, keys: int,
                        dtype: torch.dtype | str, budget_bytes: int) -> int:
    """Bytes one attention call needs beyond q, k, v and its output.

    math materialises fp32 scores and probabilities; chunked stays within its budget; fused kernels (flash,
    PyTorch SDPA's fused ones) keep only a log-sum-exp per query. `auto` may fall back to chunked, so it is
    counted as chunked.
    """
    entries = batch * heads * queries * keys
    if backend == "math":
        return entries * 2 * max(4, itemsize(dtype))
    if backend in FUSED_BACKENDS:
        return batch * heads * queries * 4
    return min(int(budget_bytes), entries * score_bytes(as_dtype(dtype)))


def _vae_pixels(width: int, height: int, tiling: bool, tile: int) -> int:
    """Pixels one VAE pass works on at a time: a tile when tiling applies (diffusers tiles only above it)."""
    if tiling and (width > tile or height > tile):
        return min(width, tile) * min(height, tile)
    return width * height


def _weights(w: dict[str, int], offload: str, streamed: int) -> tuple[int, dict[str, int]]:
    """(bytes resident through the call, bytes each stage brings to the device) for an offload mode;
    `streamed` is what sequential offload keeps resident (the largest layers in flight)."""
    stage_weights = dict.fromkeys(STAGES, 0)
    if offload == "none":
        return sum(w.values()), stage_weights
    if offload == "model":
        stage_weights["conditioning"] = w["text_encoder"] + w["image_encoder"]
        stage_weights["garment_unet"] = w["unet_garm"]
        return w["unet_vton"] + w["vae"], stage_weights
    return streamed, stage_weights


def _vae_activations(resolution: tuple[int, int], num_samples: int, sizes: ModelSizes, attention: str,
                     vae_dtype: torch.dtype | str, attention_budget_bytes: int, vae_slicing: bool, vae_tiling: bool,
                     vae_encode_batched: bool) -> tuple[int, int]:
    """Bytes of tensors alive in the VAE encode and decode stages (activations, images, attention)."""
    width, height = resolution
    encode_images = ENCODE_BATCH if vae_encode_batched and not vae_slicing else 1
    encode_px = _vae_pixels(width, height, vae_tiling, sizes.vae_tile)
    vae_attn_tokens = encode_px // (sizes.vae_factor ** 2)
    encode_act = int(encode_images * encode_px * sizes.vae_encode_activation * itemsize(vae_dtype)
                     + 3 * 3 * width * height * itemsize(vae_dtype)  # the three input images in pixels
                     + attention_workspace(attention, encode_images, sizes.vae_attn_heads, vae_attn_tokens,
                                           vae_attn_tokens, vae_dtype, attention_budget_bytes))
    decode_images = 1 if vae_slicing else num_samples
    decode_act = int(decode_images * encode_px * sizes.vae_decode_activation * itemsize(vae_dtype)
                     + num_samples * 3 * width * height * 4  # decoded images, fp32 for post-processing
                     + attention_workspace(attention, decode_images, sizes.vae_attn_heads, vae_attn_tokens,
                                           vae_attn_tokens, vae_dtype, attention_budget_bytes))
    return encode_act, decode_act


def estimate(
    request: PlanRequest,
    *,
    attention_budget_bytes: int = 1 * GIB,
    guidance_split: bool = False,
    vae_slicing: bool = False,
    vae_tiling: bool = False,
    offload: str = "none",
    vae_encode_batched: bool = True,
) -> dict[str, int]:
    """Peak bytes of each stage of one call with these savings (keys: STAGES, plus "peak" and the parts they are
    made of). Weights: the UNets and encoders in the request's `dtype`, the VAE in its `vae_dtype`. On the CPU the
    process's own memory is added and the overhead is smaller. (`max_memory` and `profile` are the planner's.)
    """
    if offload not in OFFLOAD_LEVELS:
        raise ValueError(f"offload must be one of {OFFLOAD_LEVELS}, not {offload!r}")
    r = request
    sizes, device_type = r.sizes, r.device.type
    size, vae_size = itemsize(r.dtype), itemsize(r.vae_dtype or r.dtype)
    overhead = CPU_OVERHEAD if device_type == "cpu" else GPU_OVERHEAD
    runtime = CPU_RUNTIME_BYTES if device_type == "cpu" else 0

    w = sizes.weight_bytes(r.dtype, r.vae_dtype)
    resident, stage_weights = _weights(w, offload, 2 * sizes.largest_module * max(size, vae_size))
    tensors, parts = _stage_tensors(r, attention_budget_bytes, guidance_split, vae_slicing, vae_tiling,
                                    vae_encode_batched)
    result: dict[str, int] = {
        stage: int(runtime + resident + stage_weights[stage] + overhead * tensors[stage]) for stage in STAGES
    }
    if r.photo_pixels and device_type == "cpu":  # after the decode, with the models still resident
        result["photo"] = int(runtime + resident + overhead * (PHOTO_BYTES_PER_PIXEL * r.photo_pixels
                                                               + parts.pop("small")))
    parts.pop("small", None)
    result["peak"] = max(result[s] for s in (*STAGES, "photo") if s in result)
    result.update({"weights_resident": int(resident), "weights_total": int(sum(w.values())), **parts,
                   "runtime": runtime})
    return result


def _stage_tensors(r: PlanRequest, attention_budget_bytes: int, guidance_split: bool, vae_slicing: bool,
                   vae_tiling: bool, vae_encode_batched: bool) -> tuple[dict[str, int], dict[str, int]]:
    """The tensors alive at each stage's peak (bytes, before the overhead factor), and the parts reported."""
    num_samples, guidance, dtype, attention, sizes, vae_dtype = (r.num_samples, r.guidance, r.dtype, r.attention,
                                                                 r.sizes, r.vae_dtype)
    width, height = r.resolution
    size = itemsize(dtype)
    f = sizes.vae_factor
    tokens = (width // f) * (height // f)
    attn_tokens = max(1, int(tokens * sizes.attn_token_scale))
    garment_items = 2 if guidance else 1
    batch = num_samples * garment_items
    step_batch = num_samples if (guidance and guidance_split) else batch

    latent = sizes.latent_channels * tokens
    # latents alive through the loop: noise, latents, person and original person latents, mask, garment
    small = latent * size * (3 * num_samples + 4)
    features = int(garment_items * tokens * sizes.garment_features * size)
    kv = int(garment_items * tokens * sizes.garment_kv * size)

    encode_act, decode_act = _vae_activations(r.resolution, num_samples, sizes, attention, vae_dtype or dtype,
                                              attention_budget_bytes, vae_slicing, vae_tiling, vae_encode_batched)
    garm_act = int(garment_items * tokens * sizes.garm_activation * size
                   + attention_workspace(attention, garment_items, sizes.attn_heads, attn_tokens, attn_tokens,
                                         dtype, attention_budget_bytes))
    unet_act = int(step_batch * tokens * sizes.unet_activation * size)
    unet_attn = attention_workspace(attention, step_batch, sizes.attn_heads, attn_tokens, 2 * attn_tokens,
                                    dtype, attention_budget_bytes)
    tensors = {
        "conditioning": sizes.encoder_activation * size,
        "encode": encode_act + small,
        "garment_unet": garm_act + small,
        "denoise": features + kv + unet_act + unet_attn + small,
        "decode": decode_act + small,
    }
    parts = {"garment_features": features + kv, "unet_activations": unet_act, "attention_workspace": int(unet_attn),
             "vae_encode_activations": encode_act, "vae_decode_activations": decode_act, "small": small}
    return tensors, parts
