"""Measure quantized try-on UNet calls against the float ones: seconds per call, weight bytes, output difference.

One full-size random-weight try-on UNet (the released architecture, ootd/bench/architectures.py) with the
fusion processors and the garment features of a full-size garment UNet run once, as the pipeline does; one
call = one denoising step's UNet call on a batch of `samples` x 2 (image guidance). Every variant gets a
warm-up call, then `--calls` timed ones, with the load average printed beside each (a shared machine).

    PYTHONPATH=$PWD python scripts/measure_quant.py --resolution 384x512 --samples 2 --variants fp32,int8-dynamic
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import time

import torch

from ootd.attention import build_attention, install_attention
from ootd.bench.architectures import ARCHITECTURES
from ootd.bench.profiling import load_average
from ootd.config import QuantizeName, parse_resolution
from ootd.device import detect_device
from ootd.dtypes import DTYPES
from ootd.fusion import TryOnFusion, capture_block_inputs
from ootd.quantize import module_weight_bytes, quantize_unets

VARIANTS = ("fp32", "int8-dynamic", "int8-weight", "bf16", "bf16+int8-dynamic")


class _Unets:
    """Stands in for Components where quantize_unets only needs the two UNets."""

    def __init__(self, unet_garm: torch.nn.Module | None, unet_vton: torch.nn.Module) -> None:
        self.unet_garm = unet_garm if unet_garm is not None else torch.nn.Module()
        self.unet_vton = unet_vton


def _unet(arch: str, in_channels: int) -> torch.nn.Module:
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(in_channels=in_channels, **ARCHITECTURES[arch].unet).eval().requires_grad_(False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", default="384x512")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--arch", default="full", choices=sorted(ARCHITECTURES))
    args = parser.parse_args()
    width, height = parse_resolution(args.resolution).size
    info = detect_device("cpu")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randn(1, 2, ARCHITECTURES[args.arch].unet["cross_attention_dim"], generator=gen)
    garment = torch.randn(1, 4, height // 8, width // 8, generator=gen)
    batch = 2 * args.samples
    sample = torch.randn(batch, 8, height // 8, width // 8, generator=gen)
    index = torch.arange(2).repeat_interleave(args.samples)
    with torch.inference_mode():
        garm = _unet(args.arch, 4)
        with capture_block_inputs(garm, stop_early=True) as captured:
            garm(torch.cat([garment, torch.zeros_like(garment)]), 0, encoder_hidden_states=prompt.expand(2, -1, -1),
                 return_dict=False)
        features = dict(captured)
    del garm, captured
    gc.collect()
    base = _unet(args.arch, 8)
    results: dict[str, dict] = {}
    reference: torch.Tensor | None = None
    for variant in args.variants.split(","):
        if "+" in variant:
            dtype_word, mode = variant.split("+")
        elif variant in QuantizeName.words():
            dtype_word, mode = "fp32", variant
        else:
            dtype_word, mode = variant, "none"
        dtype = DTYPES[dtype_word]
        unet = base if variant == "fp32" else copy.deepcopy(base).to(dtype)
        quantize_unets(_Unets(None, unet), mode, info)
        results[variant] = run_variant(unet, dtype, features, prompt, sample, index, info, args.calls)
        out = results[variant].pop("output")
        if reference is None and variant == "fp32":
            reference = out
        if reference is not None:
            diff = (out.float() - reference).abs()
            results[variant].update(max_abs_diff=float(diff.max()), mean_abs_diff=float(diff.mean()),
                                    reference_mean_abs=float(reference.abs().mean()))
        print(variant, json.dumps(results[variant]), flush=True)
        if unet is not base:
            del unet
        gc.collect()
    print(json.dumps({"resolution": [width, height], "batch": batch, "threads": torch.get_num_threads(),
                      "results": results}, indent=1))


def run_variant(unet: torch.nn.Module, dtype: torch.dtype, features: dict[str, torch.Tensor], prompt: torch.Tensor,
                sample: torch.Tensor, index: torch.Tensor, info, calls: int) -> dict:  # noqa: ANN001
    """A warm-up call and `calls` timed ones of the try-on UNet with the fusion processors and `sdpa` attention."""
    attention = build_attention("sdpa", info, dtype)
    fusion = TryOnFusion(unet, attention)
    install_attention([unet], attention)
    prompts = prompt.to(dtype).expand(sample.shape[0], -1, -1)
    feats = {k: v.to(dtype) for k, v in features.items()}
    timestep = torch.tensor(500)
    walls, loads = [], []
    out = None
    with torch.inference_mode(), fusion.garment(feats, index):
        for i in range(calls + 1):
            start = time.perf_counter()
            out = unet(sample.to(dtype), timestep, encoder_hidden_states=prompts, return_dict=False)[0]
            wall = time.perf_counter() - start
            print(f"  call {i} ({'warm-up' if i == 0 else 'timed'}): {wall:.2f} s (load {load_average()})",
                  flush=True)
            if i:
                walls.append(wall)
                loads.append(load_average())
    return {"seconds": walls, "median_seconds": statistics.median(walls), "load": loads,
            "weight_bytes": module_weight_bytes(unet), "output": out.float()}


if __name__ == "__main__":
    main()
