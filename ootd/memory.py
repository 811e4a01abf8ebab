"""Memory planner: estimate each stage's peak bytes and pick the cheapest memory savings that fit a budget.

Everything here is a pure function of its arguments (a DeviceInfo is passed in, never probed), so plans can
be tested with fake devices and printed before a single weight is loaded. The estimate is

    stage peak = resident weights + the stage's own weights + overhead x (tensors alive in the stage)

where the tensor terms scale with the latent tokens (UNets), the pixels (VAE) or the attention score
matrix (attention workspace of the chosen backend). The per-token and per-pixel coefficients were measured
by running the models on the meta device with a live-tensor counter (`trace_activations`), which costs no
memory and no compute; for the released SD1.5-size models they are constants below.

Savings, in the order they are switched on as the budget shrinks:

1. attention chunk budget (a fraction of the budget, capped; only the chunked backend uses it)
2. guidance as two half batches instead of one (`guidance_split`)
3. VAE slicing: encode and decode one image at a time
4. VAE tiling (diffusers' `enable_tiling`; only changes anything above the VAE's tile size)
5. model offload: the garment UNet and the text/image encoders wait on the CPU until their stage
6. sequential offload: every layer streams from the CPU (slow; the last resort)

A smaller budget never switches a saving off again (tests check it).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ootd.device import DeviceInfo, DeviceProfile

logger = logging.getLogger(__name__)

MIB = 1 << 20
GIB = 1 << 30

OFFLOAD_LEVELS = ("none", "model", "sequential")
FUSED_BACKENDS = ("flash", "sdpa")  # no score matrix in memory
STAGES = ("conditioning", "encode", "garment_unet", "denoise", "decode")

MIN_ATTENTION_BUDGET = 64 * MIB
# Fraction of the budget and cap for one chunked-attention step, when no device profile is given.
GPU_ATTENTION_FRACTION, GPU_ATTENTION_CAP = 0.25, 4 * GIB
CPU_ATTENTION_FRACTION, CPU_ATTENTION_CAP = 0.1, 1 * GIB
# Tensors the estimate cannot see: allocator rounding and fragmentation, convolution workspaces (GPU);
# on CPU also memory the C allocator keeps after frees. CPU: fitted to the peak RSS per stage of full-size
# fp32 runs (docs/benchmarks.md: -3%..+9% at 384x512 and 768x1024). GPU: not calibrated on a GPU yet.
GPU_OVERHEAD = 1.2
CPU_OVERHEAD = 1.3
# Images in the largest batched VAE encode: the pipeline encodes [masked person, person] together and the
# garment on its own.
ENCODE_BATCH = 2
# Resident memory of the Python process itself on CPU (interpreter, torch and its libraries: 0.31 GiB after
# the imports, 0.43 GiB beyond the weights once they are loaded).
CPU_RUNTIME_BYTES = 450 * MIB


def _itemsize(dtype: torch.dtype | str) -> int:
    if isinstance(dtype, torch.dtype):
        return dtype.itemsize
    names = {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2, "fp64": 8}
    try:
        return names[str(dtype).lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}") from None


def _dtype_name(dtype: torch.dtype | str) -> str:
    if isinstance(dtype, torch.dtype):
        return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, str(dtype))
    return str(dtype)


def _is_half(dtype: torch.dtype | str) -> bool:
    return _itemsize(dtype) == 2


def gib(n: float) -> str:
    """Bytes as 'x.xx GiB' for tables and logs."""
    return f"{n / GIB:.2f} GiB"


# ---------------------------------------------------------------------------------------------- model sizes


@dataclass(frozen=True)
class ModelSizes:
    """Parameter counts per component and activation footprints of one model set.

    Counts, not bytes: the same models are planned in fp32, fp16 or bf16 (`weight_bytes`). Activation
    coefficients are tensor elements alive at the peak of a stage, per batch item and per latent token
    (UNets) or per pixel and image (VAE), so they hold for every resolution and batch size.
    """

    unet_garm: int
    unet_vton: int
    vae: int
    text_encoder: int
    image_encoder: int
    largest_module: int  # parameters of the largest leaf module: what sequential offload keeps resident
    unet_activation: float = 8322.0  # try-on UNet forward with fusion, per item per latent token
    garm_activation: float = 10824.0  # garment UNet forward incl. the captured block inputs, per item per token
    garment_features: float = 2820.0  # captured block inputs, per garment item per latent token
    garment_kv: float = 5640.0  # cached garment keys and values, per garment item per latent token
    vae_encode_activation: float = 640.0  # per pixel per image
    vae_decode_activation: float = 768.1  # per pixel per image
    encoder_activation: int = 4_200_000  # CLIP image + text encoders, elements (fixed: 224x224 input)
    attn_heads: int = 8  # self-attention heads at the largest attention level
    attn_token_scale: float = 1.0  # tokens of the largest self-attention per latent token
    vae_attn_heads: int = 1
    vae_factor: int = 8  # pixels per latent, per side
    vae_tile: int = 512  # the VAE's tile size in pixels (config sample_size)
    latent_channels: int = 4

    def weight_params(self) -> dict[str, int]:
        return {
            "unet_garm": self.unet_garm, "unet_vton": self.unet_vton, "vae": self.vae,
            "text_encoder": self.text_encoder, "image_encoder": self.image_encoder,
        }

    def weight_bytes(self, dtype: torch.dtype | str, vae_dtype: torch.dtype | str | None = None) -> dict[str, int]:
        """Bytes per component when the UNets and encoders are in `dtype` and the VAE in `vae_dtype`."""
        size, vae_size = _itemsize(dtype), _itemsize(vae_dtype or dtype)
        return {name: n * (vae_size if name == "vae" else size) for name, n in self.weight_params().items()}

    @classmethod
    def released(cls) -> ModelSizes:
        """The released OOTDiffusion models: SD1.5 UNets (in_channels 4 and 8), SD VAE, CLIP text + ViT-L/14."""
        return RELEASED_SIZES

    @classmethod
    def from_components(cls, components: Any, *, trace: bool | None = None) -> ModelSizes:
        """Sizes of loaded components (`ootd.loading.Components`). Parameter counts are read from the modules;
        activation coefficients are the released constants when the architectures are the released ones,
        else measured on the meta device (`trace=True` forces the measurement)."""
        c = components
        counts = {name: _params(getattr(c, name)) for name in
                  ("unet_garm", "unet_vton", "vae", "text_encoder", "image_encoder")}
        largest = max(_largest_leaf(getattr(c, name)) for name in counts)
        unet_cfg, vae_cfg = dict(c.unet_vton.config), dict(c.vae.config)
        geometry = _attention_geometry(unet_cfg)
        fields_: dict[str, Any] = {
            **counts, "largest_module": largest,
            "attn_heads": geometry[0], "attn_token_scale": geometry[1],
            "vae_factor": 2 ** (len(vae_cfg.get("block_out_channels", (1, 1, 1, 1))) - 1),
            "vae_tile": _vae_tile(vae_cfg), "latent_channels": int(vae_cfg.get("latent_channels", 4)),
            "encoder_activation": _encoder_activation(c.image_encoder),
        }
        released = _unet_signature(unet_cfg) == _unet_signature(RELEASED_UNET_CONFIG) and (
            _vae_signature(vae_cfg) == _vae_signature(RELEASED_VAE_CONFIG))
        if trace or (trace is None and not released):
            fields_.update(trace_activations(dict(c.unet_garm.config), unet_cfg, vae_cfg))
        return cls(**fields_)


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _largest_leaf(module: torch.nn.Module) -> int:
    return max((sum(p.numel() for p in m.parameters(recurse=False)) for m in module.modules()), default=0)


def _attention_geometry(unet_cfg: dict) -> tuple[int, float]:
    """(heads, tokens per latent token) of the largest self-attention: the first level with attention."""
    down = list(unet_cfg.get("down_block_types", ()))
    level = next((i for i, name in enumerate(down) if "Attn" in name), 0)
    heads = unet_cfg.get("num_attention_heads") or unet_cfg.get("attention_head_dim") or 8
    if isinstance(heads, list | tuple):
        heads = heads[level]
    return int(heads), 4.0 ** -level


def _vae_tile(vae_cfg: dict) -> int:
    size = vae_cfg.get("sample_size", 512)
    return int(size[0] if isinstance(size, list | tuple) else size)


def _encoder_activation(image_encoder: torch.nn.Module) -> int:
    """Elements alive in one CLIP vision forward (tokens x widths, plus one head-wise score matrix)."""
    cfg = getattr(getattr(image_encoder, "config", None), "vision_config", None) or getattr(
        image_encoder, "config", None)
    try:
        tokens = (cfg.image_size // cfg.patch_size) ** 2 + 1
        return int(tokens * (4 * cfg.hidden_size + 2 * cfg.intermediate_size) + cfg.num_attention_heads * tokens**2)
    except AttributeError:
        return ModelSizes.__dataclass_fields__["encoder_activation"].default


def _unet_signature(cfg: dict) -> tuple:
    keys = ("block_out_channels", "layers_per_block", "down_block_types", "up_block_types", "attention_head_dim",
            "num_attention_heads", "transformer_layers_per_block", "mid_block_type")
    return tuple(str(tuple(v) if isinstance(v, list) else v) for v in (cfg.get(k) for k in keys))


def _vae_signature(cfg: dict) -> tuple:
    keys = ("block_out_channels", "layers_per_block", "latent_channels")
    return tuple(str(tuple(v) if isinstance(v, list) else v) for v in (cfg.get(k) for k in keys)) + (
        _vae_tile(cfg),)


# The released architectures (SD1.5 UNet, SD VAE, CLIP ViT-L/14 vision, SD1.5 CLIP text): bench.py builds
# them with random weights, and the constants below were measured on them.
RELEASED_UNET_CONFIG: dict[str, Any] = {
    "sample_size": 64, "out_channels": 4, "layers_per_block": 2, "block_out_channels": (320, 640, 1280, 1280),
    "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    "cross_attention_dim": 768, "attention_head_dim": 8, "norm_num_groups": 32,
}
RELEASED_VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 4, "layers_per_block": 2,
    "down_block_types": ("DownEncoderBlock2D",) * 4, "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (128, 256, 512, 512), "sample_size": 512, "scaling_factor": 0.18215,
    "norm_num_groups": 32, "act_fn": "silu",
}
RELEASED_SIZES = ModelSizes(
    unet_garm=859_520_964, unet_vton=859_532_484, vae=83_653_863, text_encoder=123_060_480,
    image_encoder=303_966_208, largest_module=37_945_344,  # the text encoder's token embedding
)


# ---------------------------------------------------------------------------------------------- measuring


class _LiveTensorBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts bytes of tensor storages created inside the mode while they are alive; `peak` is the maximum.

    Storages that existed before (weights, inputs) are not counted, and views share their base's count.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._refs: dict[int, list[int]] = {}  # storage id -> [python tensors alive, bytes]

    def reset_peak(self) -> None:
        self.peak = self.live

    def _release(self, key: int) -> None:
        entry = self._refs.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        flat_in = torch.utils._pytree.tree_leaves((args, kwargs))
        inputs = {t.untyped_storage()._cdata for t in flat_in if isinstance(t, torch.Tensor)}
        for tensor in torch.utils._pytree.tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key = storage._cdata
            if key in self._refs:
                self._refs[key][0] += 1
            elif key in inputs:
                continue  # a view of (or in-place op on) a tensor we do not count
            else:
                self._refs[key] = [1, storage.nbytes()]
                self.live += storage.nbytes()
            weakref.finalize(tensor, self._release, key)
        self.peak = max(self.peak, self.live)
        return out


def _shape_only_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any
                          ) -> torch.Tensor:
    """Attention's output without its workspace: the workspace is estimated per backend separately."""
    return q.new_empty(*q.shape[:-1], v.shape[-1])


@contextlib.contextmanager
def _shape_only_sdpa() -> Iterator[None]:
    import torch.nn.functional as F

    saved = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _shape_only_attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = saved


def trace_activations(garm_config: dict, vton_config: dict, vae_config: dict,
                      latent_hw: tuple[int, int] = (32, 32)) -> dict[str, float]:
    """Measure the activation coefficients of ModelSizes by running the architectures on the meta device.

    Uses the pipeline's own fusion code, so the numbers follow it. Attention kernels are replaced by their
    output shape (their workspace depends on the backend and is added by `estimate`). Takes about a second
    per SD1.5-size UNet and no real memory.
    """
    from diffusers import AutoencoderKL, UNet2DConditionModel

    from ootd.fusion import TryOnFusion, capture_block_inputs

    h, w = latent_hw
    tokens = h * w
    elem = 4  # traced in fp32
    with torch.device("meta"):
        garm = UNet2DConditionModel.from_config(garm_config)
        vton = UNet2DConditionModel.from_config(vton_config)
        vae = AutoencoderKL.from_config(vae_config)
    fusion = TryOnFusion(vton, _shape_only_attention)
    cross = int(vton_config.get("cross_attention_dim", 768))
    meta = torch.device("meta")
    with torch.inference_mode(), _shape_only_sdpa():
        prompt = torch.empty(2, 2, cross, device=meta)
        with _LiveTensorBytes() as counter:
            garment = torch.empty(2, int(garm_config.get("in_channels", 4)), h, w, device=meta)
            base = counter.live
            with capture_block_inputs(garm) as captured:
                garm(garment, 0, encoder_hidden_states=prompt, return_dict=False)
            features = dict(captured)
            del captured, garment
            garm_peak = counter.peak - base
            feature_bytes = counter.live
            with fusion.garment(features, torch.arange(2, device=meta)):
                kv_bytes = counter.live - feature_bytes
                sample = torch.empty(2, int(vton_config.get("in_channels", 8)), h, w, device=meta)
                before = counter.live
                counter.reset_peak()
                vton(sample, 10, encoder_hidden_states=prompt, return_dict=False)
                vton_peak = counter.peak - before
        factor = 2 ** (len(vae.config.block_out_channels) - 1)
        size = 16 * factor  # pixels per side: small, the coefficients do not depend on it
        with _LiveTensorBytes() as counter:
            pixels = torch.empty(1, 3, size, size, device=meta)
            base = counter.live
            vae.encode(pixels).latent_dist.mode()
            encode_peak = counter.peak - base
        with _LiveTensorBytes() as counter:
            latents = torch.empty(1, vae.config.latent_channels, size // factor, size // factor, device=meta)
            base = counter.live
            vae.decode(latents, return_dict=False)
            decode_peak = counter.peak - base
    per_token = 2 * tokens * elem
    return {
        "unet_activation": round(vton_peak / per_token, 1),
        "garm_activation": round(garm_peak / per_token, 1),
        "garment_features": round(feature_bytes / per_token, 1),
        "garment_kv": round(kv_bytes / per_token, 1),
        "vae_encode_activation": round(encode_peak / (size * size * elem), 1),
        "vae_decode_activation": round(decode_peak / (size * size * elem), 1),
    }


# ---------------------------------------------------------------------------------------------- estimating


def _score_bytes(dtype: torch.dtype | str) -> int:
    """Bytes per score entry in one chunked-attention step (matches ootd.attention.chunked.score_bytes)."""
    return 4 + 2 * _itemsize(dtype) if _is_half(dtype) else _itemsize(dtype)


def attention_workspace(backend: str, batch: int, heads: int, queries: int, keys: int,
                        dtype: torch.dtype | str, budget_bytes: int) -> int:
    """Bytes one attention call needs beyond q, k, v and its output.

    math materialises fp32 scores and probabilities; chunked stays within its budget; fused kernels (flash,
    PyTorch SDPA's fused ones) keep only a log-sum-exp per query. `auto` may fall back to chunked, so it is
    counted as chunked.
    """
    entries = batch * heads * queries * keys
    if backend == "math":
        return entries * 2 * max(4, _itemsize(dtype))
    if backend in FUSED_BACKENDS:
        return batch * heads * queries * 4
    return min(int(budget_bytes), entries * _score_bytes(dtype))


def _vae_pixels(width: int, height: int, tiling: bool, tile: int) -> int:
    """Pixels one VAE pass works on at a time: a tile when tiling applies (diffusers tiles only above it)."""
    if tiling and (width > tile or height > tile):
        return min(width, tile) * min(height, tile)
    return width * height


def estimate(
    resolution: tuple[int, int],
    num_samples: int,
    guidance: bool,
    dtype: torch.dtype | str,
    attention: str,
    sizes: ModelSizes,
    *,
    attention_budget_bytes: int = 1 * GIB,
    guidance_split: bool = False,
    vae_slicing: bool = False,
    vae_tiling: bool = False,
    offload: str = "none",
    vae_dtype: torch.dtype | str | None = None,
    device_type: str = "cuda",
    vae_encode_batched: bool = True,
) -> dict[str, int]:
    """Peak bytes of each stage of one call (keys: STAGES, plus "peak" and the parts they are made of).

    `resolution` is (width, height) in pixels. Weights: the UNets and encoders in `dtype`, the VAE in
    `vae_dtype` (default `dtype`). `device_type` "cpu" adds the process's own memory and a smaller overhead.
    """
    if offload not in OFFLOAD_LEVELS:
        raise ValueError(f"offload must be one of {OFFLOAD_LEVELS}, not {offload!r}")
    width, height = resolution
    size, vae_size = _itemsize(dtype), _itemsize(vae_dtype or dtype)
    f = sizes.vae_factor
    tokens = (width // f) * (height // f)
    attn_tokens = max(1, int(tokens * sizes.attn_token_scale))
    garment_items = 2 if guidance else 1
    batch = num_samples * garment_items
    step_batch = num_samples if (guidance and guidance_split) else batch
    overhead = CPU_OVERHEAD if device_type == "cpu" else GPU_OVERHEAD
    runtime = CPU_RUNTIME_BYTES if device_type == "cpu" else 0

    w = sizes.weight_bytes(dtype, vae_dtype)
    if offload == "none":
        resident = sum(w.values())
        stage_weights = dict.fromkeys(STAGES, 0)
    elif offload == "model":
        resident = w["unet_vton"] + w["vae"]
        stage_weights = dict.fromkeys(STAGES, 0)
        stage_weights["conditioning"] = w["text_encoder"] + w["image_encoder"]
        stage_weights["garment_unet"] = w["unet_garm"]
    else:
        resident = 2 * sizes.largest_module * max(size, vae_size)
        stage_weights = dict.fromkeys(STAGES, 0)

    latent = sizes.latent_channels * tokens
    # latents alive through the loop: noise, latents, person and original person latents, mask, garment
    small = latent * size * (3 * num_samples + 4)
    features = int(garment_items * tokens * sizes.garment_features * size)
    kv = int(garment_items * tokens * sizes.garment_kv * size)

    encode_images = ENCODE_BATCH if vae_encode_batched and not vae_slicing else 1
    encode_px = _vae_pixels(width, height, vae_tiling, sizes.vae_tile)
    vae_attn_tokens = encode_px // (f * f)
    encode_act = int(encode_images * encode_px * sizes.vae_encode_activation * vae_size
                     + 3 * 3 * width * height * vae_size  # the three input images in pixels
                     + attention_workspace(attention, encode_images, sizes.vae_attn_heads, vae_attn_tokens,
                                           vae_attn_tokens, vae_dtype or dtype, attention_budget_bytes))
    decode_images = 1 if vae_slicing else num_samples
    decode_act = int(decode_images * encode_px * sizes.vae_decode_activation * vae_size
                     + num_samples * 3 * width * height * 4  # decoded images, fp32 for post-processing
                     + attention_workspace(attention, decode_images, sizes.vae_attn_heads, vae_attn_tokens,
                                           vae_attn_tokens, vae_dtype or dtype, attention_budget_bytes))
    garm_act = int(garment_items * tokens * sizes.garm_activation * size
                   + attention_workspace(attention, garment_items, sizes.attn_heads, attn_tokens, attn_tokens,
                                         dtype, attention_budget_bytes))
    unet_act = int(step_batch * tokens * sizes.unet_activation * size)
    unet_attn = attention_workspace(attention, step_batch, sizes.attn_heads, attn_tokens, 2 * attn_tokens,
                                    dtype, attention_budget_bytes)
    cond_act = sizes.encoder_activation * size

    tensors = {
        "conditioning": cond_act,
        "encode": encode_act + small,
        "garment_unet": garm_act + small,
        "denoise": features + kv + unet_act + unet_attn + small,
        "decode": decode_act + small,
    }
    result: dict[str, int] = {
        stage: int(runtime + resident + stage_weights[stage] + overhead * tensors[stage]) for stage in STAGES
    }
    result["peak"] = max(result[s] for s in STAGES)
    result.update({
        "weights_resident": int(resident), "weights_total": int(sum(w.values())),
        "garment_features": features + kv, "unet_activations": unet_act, "attention_workspace": int(unet_attn),
        "vae_encode_activations": encode_act, "vae_decode_activations": decode_act, "runtime": runtime,
    })
    return result


# ---------------------------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class PlanRequest:
    """What a plan was made for (kept so that `Plan.halved` can plan again)."""

    device: DeviceInfo
    resolution: tuple[int, int]
    num_samples: int
    guidance: bool
    dtype: str
    attention: str
    sizes: ModelSizes
    max_memory: int | None = None
    vae_dtype: str | None = None
    profile: DeviceProfile | None = None


@dataclass(frozen=True)
class Plan:
    """Memory choices for one call, the per-stage estimate they give, and whether that fits the budget."""

    budget_bytes: int
    attention_budget_bytes: int
    guidance_split: bool
    vae_encode_batched: bool
    vae_slicing: bool
    vae_tiling: bool
    offload: str  # "none" | "model" | "sequential"
    estimate: dict[str, int] = field(hash=False)  # follows from the choices above; a dict cannot be hashed
    fits: bool
    request: PlanRequest | None = field(default=None, repr=False, compare=False)

    @property
    def level(self) -> int:
        """How many savings are on (0 = none); larger is more frugal, for comparing plans."""
        return (int(self.guidance_split) + int(self.vae_slicing) + int(self.vae_tiling)
                + OFFLOAD_LEVELS.index(self.offload))

    def halved(self) -> Plan:
        """The plan for half this budget: what to retry with after an out-of-memory error."""
        base = self.budget_bytes or self.estimate["peak"]  # an unknown budget: half of what was estimated
        return with_budget(self, max(1, base // 2))

    def to_dict(self) -> dict[str, Any]:
        """Plain data for --json."""
        data = {k: v for k, v in asdict(self).items() if k != "request"}
        data["estimate"] = dict(self.estimate)
        if self.request is not None:
            r = self.request
            data["request"] = {
                "device": r.device.name, "device_type": r.device.type, "resolution": list(r.resolution),
                "num_samples": r.num_samples, "guidance": r.guidance, "dtype": r.dtype, "attention": r.attention,
                "max_memory": r.max_memory, "vae_dtype": r.vae_dtype,
            }
        return data

    def explain(self) -> str:
        """A table of the choices and the per-stage estimates, for people."""
        lines = []
        if self.request is not None:
            r = self.request
            width, height = r.resolution
            lines.append(
                f"memory plan: {width}x{height}, {r.num_samples} sample(s), guidance {'on' if r.guidance else 'off'}"
                f", {r.dtype}, attention {r.attention}, on {r.device.name} ({r.device.type})")
        source = "--max-memory" if self.request is not None and self.request.max_memory else "free memory - margin"
        lines.append(f"  budget                 {gib(self.budget_bytes):>11}  ({source})")
        lines.append(f"  attention chunk budget {gib(self.attention_budget_bytes):>11}")
        batch = ""
        if self.request is not None:
            r = self.request
            full = r.num_samples * (2 if r.guidance else 1)
            batch = f" (UNet batch {full // 2 if self.guidance_split else full})"
        lines.append(f"  guidance               {'two halves' if self.guidance_split else 'one batch':>11}{batch}")
        lines.append(f"  VAE encode             {'batched' if self.vae_encode_batched else 'one by one':>11}")
        lines.append(f"  VAE slicing            {'on' if self.vae_slicing else 'off':>11}")
        lines.append(f"  VAE tiling             {'on' if self.vae_tiling else 'off':>11}")
        lines.append(f"  offload                {self.offload:>11}")
        lines.append("  stage                     estimate")
        for stage in (*STAGES, "peak"):
            lines.append(f"    {stage:<20} {gib(self.estimate[stage]):>11}")
        parts = ("weights_resident", "garment_features", "unet_activations", "attention_workspace")
        lines.append("    (" + ", ".join(f"{p} {gib(self.estimate[p])}" for p in parts) + ")")
        verdict = "fits" if self.fits else "DOES NOT FIT even with every saving on"
        lines.append(f"  peak {gib(self.estimate['peak'])} of {gib(self.budget_bytes)}: {verdict}")
        return "\n".join(lines)


def safety_margin(device: DeviceInfo) -> int:
    """Memory kept free: for the allocator, other processes and (CPU) the operating system."""
    total = device.total_memory or device.free_memory or 0
    if device.type == "cpu":
        return max(1 * GIB, total // 10)
    if device.unified_memory:
        return max(2 * GIB, total // 10)
    return max(512 * MIB, total // 20)


def memory_budget(device: DeviceInfo, max_memory: int | None = None) -> int | None:
    """Bytes a call may use: `max_memory` when given, else free (or total) memory minus the safety margin;
    None when the device does not say (e.g. MPS)."""
    if max_memory is not None:
        return int(max_memory)
    memory = device.free_memory if device.free_memory is not None else device.total_memory
    if memory is None:
        return None
    return max(0, int(memory) - safety_margin(device))


def attention_budget_for(budget: int, device: DeviceInfo, profile: DeviceProfile | None = None,
                         reserved: int = 0) -> int:
    """Bytes for one chunked-attention step: a fraction of what the budget leaves after `reserved` (the
    weights), capped, never below 64 MiB.

    It grows with the budget, and never by more than a fraction of it, which keeps plans monotone.
    """
    if profile is not None:
        fraction, cap = profile.attention_budget_fraction, profile.attention_budget_max_mib * MIB
    elif device.type == "cpu":
        fraction, cap = CPU_ATTENTION_FRACTION, CPU_ATTENTION_CAP
    else:
        fraction, cap = GPU_ATTENTION_FRACTION, GPU_ATTENTION_CAP
    return int(max(MIN_ATTENTION_BUDGET, min(cap, (budget - reserved) * min(fraction, 0.5))))


UNLIMITED = 1 << 62
LOCAL_SAVINGS = {"guidance_split": False, "vae_slicing": False, "vae_tiling": False}


def _offload_levels(device: DeviceInfo) -> tuple[str, ...]:
    """Offloading to the CPU from the CPU saves nothing."""
    return ("none",) if device.type == "cpu" else OFFLOAD_LEVELS


def _choose_local(fits: Any, guidance: bool) -> dict[str, bool]:
    """At offload "none": each stage-local saving only if its own stage needs it.

    Guidance split only changes the denoising stage and VAE slicing/tiling only the VAE stages, so each is
    decided by its stages alone (slicing before tiling), and none is switched on that another stage needed.
    """
    chosen = dict(LOCAL_SAVINGS)
    if guidance and not fits(chosen, ("denoise",)):
        chosen["guidance_split"] = True
    if not fits(chosen, ("encode", "decode")):
        chosen["vae_slicing"] = True
        if not fits(chosen, ("encode", "decode")):
            chosen["vae_tiling"] = True
    return chosen


def make_plan(
    device: DeviceInfo,
    resolution: tuple[int, int],
    num_samples: int,
    guidance: bool,
    dtype: torch.dtype | str,
    attention: str,
    sizes: ModelSizes,
    max_memory: int | None = None,
    *,
    vae_dtype: torch.dtype | str | None = None,
    profile: DeviceProfile | None = None,
) -> Plan:
    """The cheapest settings whose estimated peak fits the budget (see the module docstring for the order).

    The budget is `max_memory`, else the device's free memory minus a safety margin (pass a DeviceInfo
    measured before the models are loaded). The attention chunk budget is a fraction of the budget. With
    everything resident, guidance split and VAE slicing/tiling are switched on only for the stages that
    need them; offloading comes only after all of them are on. When nothing fits, every saving is on and
    `fits` is False. A smaller budget never gives a plan with fewer savings.
    """
    if num_samples < 1:
        raise ValueError("num_samples must be at least 1")
    budget = memory_budget(device, max_memory)
    budget_bytes = budget if budget is not None else UNLIMITED
    weights = sum(sizes.weight_bytes(dtype, vae_dtype).values())
    attention_budget = attention_budget_for(budget if budget is not None else weights + 16 * GIB, device, profile,
                                            reserved=weights)
    request = PlanRequest(
        device=device, resolution=(int(resolution[0]), int(resolution[1])), num_samples=num_samples,
        guidance=guidance, dtype=_dtype_name(dtype), attention=attention, sizes=sizes, max_memory=max_memory,
        vae_dtype=_dtype_name(vae_dtype) if vae_dtype is not None else None, profile=profile,
    )

    # the profile may prefer one image at a time even where a batch fits (faster on the CPU)
    batch_encodes = profile.vae_encode_batched if profile is not None else True

    def numbers_for(settings: dict[str, Any]) -> dict[str, int]:
        return estimate(request.resolution, num_samples, guidance, dtype, attention, sizes,
                        attention_budget_bytes=attention_budget, vae_dtype=vae_dtype, device_type=device.type,
                        vae_encode_batched=batch_encodes, **settings)

    every = {"guidance_split": guidance, "vae_slicing": True, "vae_tiling": True}
    settings: dict[str, Any] = {}
    numbers: dict[str, int] = {}
    for offload in _offload_levels(device):
        if offload == "none":
            def fits(local: dict[str, bool], stages: tuple[str, ...]) -> bool:
                found = numbers_for({**local, "offload": "none"})
                return all(found[s] <= budget_bytes for s in stages)

            settings = {**_choose_local(fits, guidance), "offload": "none"}
        else:
            settings = {**every, "offload": offload}
        numbers = numbers_for(settings)
        if numbers["peak"] <= budget_bytes:
            break
    else:
        settings = {**every, "offload": _offload_levels(device)[-1]}
        numbers = numbers_for(settings)
    fits_budget = numbers["peak"] <= budget_bytes
    plan = Plan(
        budget_bytes=budget if budget is not None else 0, attention_budget_bytes=attention_budget,
        guidance_split=settings["guidance_split"], vae_encode_batched=batch_encodes and not settings["vae_slicing"],
        vae_slicing=settings["vae_slicing"], vae_tiling=settings["vae_tiling"], offload=settings["offload"],
        estimate=numbers, fits=fits_budget, request=request,
    )
    if not fits_budget:
        logger.warning("estimated peak %s exceeds the memory budget %s even with every saving on",
                       gib(numbers["peak"]), gib(budget_bytes))
    return plan


def with_budget(plan: Plan, budget_bytes: int) -> Plan:
    """The same request planned for another budget."""
    if plan.request is None:
        raise ValueError("this plan does not know what it was made for")
    r = plan.request
    return make_plan(r.device, r.resolution, r.num_samples, r.guidance, r.dtype, r.attention, r.sizes,
                     max_memory=budget_bytes, vae_dtype=r.vae_dtype, profile=r.profile)


def apply_plan_to_vae(vae: Any, plan: Plan) -> None:
    """Switch the VAE's own slicing and tiling on or off as the plan says (diffusers AutoencoderKL)."""
    if plan.vae_slicing:
        vae.enable_slicing()
    else:
        vae.disable_slicing()
    if plan.vae_tiling:
        vae.enable_tiling()
    else:
        vae.disable_tiling()


def describe_bytes(estimate_: dict[str, int]) -> dict[str, str]:
    """The estimate with human units (for logs)."""
    return {k: gib(v) for k, v in estimate_.items()}


__all__ = [
    "GIB", "MIB", "OFFLOAD_LEVELS", "RELEASED_SIZES", "RELEASED_UNET_CONFIG", "RELEASED_VAE_CONFIG", "STAGES",
    "ModelSizes", "Plan", "PlanRequest", "apply_plan_to_vae", "attention_budget_for", "attention_workspace",
    "describe_bytes", "estimate", "gib", "make_plan", "memory_budget", "safety_margin", "trace_activations",
    "with_budget",
]
