"""Model sizes for the memory planner: parameter counts per component and activation coefficients.

Counts, not bytes, so one ModelSizes plans fp32, fp16 and bf16 alike. The activation coefficients of the
released architectures were measured once with ootd/memory/trace.py and are constants here; other
architectures are measured on the meta device when loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from ootd.hardware.dtypes import itemsize
from ootd.hardware.units import size_text
from ootd.memory.trace import trace_activations
from ootd.weights.released import (
    RELEASED_LARGEST_MODULE,
    RELEASED_PARAMETERS,
    RELEASED_UNET_CONFIG,
    RELEASED_VAE_CONFIG,
)

# a quantized Linear layer's per-row extras: a float32 scale and an int8 zero point (torchao's int8 layout; its
# float8 layout has the scale only)
QUANTIZED_ROW_BYTES = 5


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
    # weight elements and output rows of the Linear layers of one UNet (the two UNets share them): what
    # quantization (ootd/speedups/quantize.py) stores in one byte each, plus a scale and a zero point per row
    unet_linear: int = 270_049_280
    unet_linear_rows: int = 234_880
    unets_quantized: bool = False

    def weight_params(self) -> dict[str, int]:
        return {
            "unet_garm": self.unet_garm, "unet_vton": self.unet_vton, "vae": self.vae,
            "text_encoder": self.text_encoder, "image_encoder": self.image_encoder,
        }

    def weight_bytes(self, dtype: torch.dtype | str, vae_dtype: torch.dtype | str | None = None) -> dict[str, int]:
        """Bytes per component when the UNets and encoders are in `dtype` and the VAE in `vae_dtype`."""
        size, vae_size = itemsize(dtype), itemsize(vae_dtype or dtype)
        sizes = {name: n * (vae_size if name == "vae" else size) for name, n in self.weight_params().items()}
        if self.unets_quantized:
            linear = self.unet_linear * (size - 1) - self.unet_linear_rows * QUANTIZED_ROW_BYTES
            sizes.update({name: sizes[name] - linear for name in ("unet_garm", "unet_vton")})
        return sizes

    def quantized(self) -> ModelSizes:
        """These sizes with the UNets' Linear layers quantized: for planning before a quantized load."""
        return replace(self, unets_quantized=True)

    @classmethod
    def released(cls) -> ModelSizes:
        """The released OOTDiffusion models: SD1.5 UNets (in_channels 4 and 8), SD VAE, CLIP text + ViT-L/14."""
        return RELEASED_SIZES

    @classmethod
    def from_components(cls, components: Any, *, trace: bool | None = None) -> ModelSizes:
        """Sizes of loaded components (`ootd.weights.loading.Components`). Parameter counts are read from the modules;
        activation coefficients are the released constants when the architectures are the released ones,
        else measured on the meta device (`trace=True` forces the measurement)."""
        c = components
        counts = {name: _params(getattr(c, name)) for name in
                  ("unet_garm", "unet_vton", "vae", "text_encoder", "image_encoder")}
        largest = max(_largest_leaf(getattr(c, name)) for name in counts)
        linear, rows, quantized = _linear_layers(c.unet_vton)
        unet_cfg, vae_cfg = dict(c.unet_vton.config), dict(c.vae.config)
        geometry = _attention_geometry(unet_cfg)
        fields_: dict[str, Any] = {
            **counts, "largest_module": largest,
            "attn_heads": geometry[0], "attn_token_scale": geometry[1],
            "vae_factor": 2 ** (len(vae_cfg.get("block_out_channels", (1, 1, 1, 1))) - 1),
            "vae_tile": _vae_tile(vae_cfg), "latent_channels": int(vae_cfg.get("latent_channels", 4)),
            "encoder_activation": _encoder_activation(c.image_encoder),
            "unet_linear": linear, "unet_linear_rows": rows, "unets_quantized": quantized,
        }
        released = _unet_signature(unet_cfg) == _unet_signature(RELEASED_UNET_CONFIG) and (
            _vae_signature(vae_cfg) == _vae_signature(RELEASED_VAE_CONFIG))
        if trace or (trace is None and not released):
            fields_.update(trace_activations(dict(c.unet_garm.config), unet_cfg, vae_cfg))
        return cls(**fields_)


def _params(module: torch.nn.Module | None) -> int:
    return sum(p.numel() for p in module.parameters()) if module is not None else 0


def _linear_layers(unet: torch.nn.Module) -> tuple[int, int, bool]:
    """(weight elements, output rows, whether any weight is quantized) of the Linear layers of a UNet."""
    layers = [m for m in unet.modules() if isinstance(m, torch.nn.Linear)]
    quantized = any(type(m.weight) not in (torch.Tensor, torch.nn.Parameter) for m in layers)
    return sum(m.weight.numel() for m in layers), sum(m.out_features for m in layers), quantized


def _largest_leaf(module: torch.nn.Module | None) -> int:
    if module is None:
        return 0
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


RELEASED_SIZES = ModelSizes(**RELEASED_PARAMETERS, largest_module=RELEASED_LARGEST_MODULE)


def clip_text_parameters(config: dict[str, Any]) -> int:
    """Parameters of CLIP's text tower with its projection (transformers' CLIPTextModelWithProjection) from the
    CLIP folder's config (`CLIPConfig.to_dict()`), without loading it: what `--category auto` loads before the
    try-on, on top of the image tower the try-on loads anyway."""
    text = config.get("text_config", config)
    hidden, inner, layers = text["hidden_size"], text["intermediate_size"], text["num_hidden_layers"]
    projection = config.get("projection_dim", text.get("projection_dim", hidden))
    layer = 4 * (hidden * hidden + hidden) + 4 * hidden + (hidden * inner + inner) + (inner * hidden + hidden)
    embeddings = (text["vocab_size"] + text["max_position_embeddings"]) * hidden
    return embeddings + layers * layer + 2 * hidden + hidden * projection


def classifier_lines(text_parameters: int, bytes_per_parameter: int = 4) -> list[str]:
    """The memory plan's lines for `--category auto`: the text tower's weights (fp32), held only while the prompt
    features are computed, before any diffusion model loads."""
    size = text_parameters * bytes_per_parameter
    return [f"  classifier text tower  {size_text(size):>10}  ({text_parameters:,} parameters, fp32; "
            "--category auto: loaded before the try-on models, dropped once its prompt features are computed)"]
