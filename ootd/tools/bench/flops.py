"""FLOPs of a denoising step and of the once-per-call garment work, ours vs the original formulation, counted by
torch.utils.flop_counter on the meta device (shapes only: no memory, no compute)."""

from __future__ import annotations

from typing import Any

import torch

from ootd.method.fusion import capture_block_inputs
from ootd.tools.bench.reference import original_formulation
from ootd.weights.loading import quiet_loading
from ootd.weights.released import RELEASED_UNET_CONFIG

_META = torch.device("meta")


def count_step_flops(unet_config: dict | None = None, *, num_samples: int = 4,
                     resolution: tuple[int, int] = (768, 1024), guidance: bool = True,
                     cross_tokens: int = 2) -> dict[str, Any]:
    """FLOPs (2 per multiply-add) of one denoising step and of the garment UNet, ours vs the original; defaults
    to the released SD1.5 UNet architecture. `by_op` splits the step figures by kind of work."""
    from diffusers import UNet2DConditionModel

    from ootd.attention import install_attention, sdpa_attention

    cfg = dict(unet_config or RELEASED_UNET_CONFIG)
    with torch.device("meta"), quiet_loading():  # shapes only: nothing is allocated
        garm = UNet2DConditionModel.from_config({**cfg, "in_channels": 4})
        vton = UNet2DConditionModel.from_config({**cfg, "in_channels": 8})
    width, height = resolution
    copies = 2 if guidance else 1
    shapes = _Shapes(copies, num_samples, height // 8, width // 8,
                     torch.empty(1, cross_tokens, int(cfg.get("cross_attention_dim", 768)), device=_META))
    result: dict[str, Any] = {}
    with torch.inference_mode():
        # stock processors first (the original's), then ours (folded cross-attention) on both UNets;
        # the original runs the same garment UNet on 2 x samples: FLOPs are linear in the batch
        result["original_garment_unet"] = _flops(lambda: shapes.garment_unet(garm)) * shapes.batch // copies
        install_attention([garm, vton], sdpa_attention)
        with _counter() as counter, capture_block_inputs(garm, stop_early=True) as captured:
            shapes.garment_unet(garm)
        features = dict(captured)
        result["ours_garment_unet"] = counter.get_total_flops()
        result.update(_ours_step(vton, features, shapes))
        batch_features = {k: v.repeat_interleave(num_samples, dim=0) for k, v in features.items()}
        with original_formulation(vton, batch_features), _counter() as counter:
            shapes.tryon_unet(vton)
        result["original_step"] = counter.get_total_flops()
        result["by_op"]["original_step"] = _flops_by_op(counter)
    result["by_op"] = result.pop("by_op")  # last, as the report has always had it
    return result


class _Shapes:
    """Empty meta tensors of one call's shapes, and the two UNet calls on them."""

    def __init__(self, copies: int, num_samples: int, h: int, w: int, prompt: torch.Tensor) -> None:
        self.copies, self.num_samples, self.batch = copies, num_samples, num_samples * copies
        self.h, self.w, self.prompt = h, w, prompt

    def garment_unet(self, unet: torch.nn.Module) -> None:
        unet(torch.empty(self.copies, 4, self.h, self.w, device=_META), 0,
             encoder_hidden_states=self.prompt.expand(self.copies, -1, -1), return_dict=False)

    def tryon_unet(self, unet: torch.nn.Module) -> None:
        unet(torch.empty(self.batch, 8, self.h, self.w, device=_META), 10,
             encoder_hidden_states=self.prompt.expand(self.batch, -1, -1), return_dict=False)


def _ours_step(vton: torch.nn.Module, features: dict[str, torch.Tensor], shapes: _Shapes) -> dict[str, Any]:
    """Our garment keys/values (once per call) and our step, with the fusion processors installed."""
    from ootd.method.fusion import TryOnFusion

    fusion = TryOnFusion(vton)
    sample_index = torch.arange(shapes.copies, device=_META).repeat_interleave(shapes.num_samples)
    with fusion.garment(features, sample_index):
        with _counter() as counter:
            for name, processor in fusion.processors.items():
                processor.set_garment(fusion.blocks[name].attn1, features[name], sample_index)
        kv = counter.get_total_flops()
        with _counter() as counter:
            shapes.tryon_unet(vton)
    return {"ours_garment_kv": kv, "ours_step": counter.get_total_flops(),
            "by_op": {"ours_step": _flops_by_op(counter)}}


def _counter() -> Any:
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False)


def _flops(run: Any) -> int:
    with _counter() as counter:
        run()
    return counter.get_total_flops()


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
