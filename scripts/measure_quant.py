"""Measure quantized try-on UNet calls against the float ones: seconds per call, weight bytes, output difference.

One full-size random-weight try-on UNet (the released architecture, ootd/tools/bench/architectures.py) with the
fusion processors and the garment features of a full-size garment UNet run once, as the pipeline does; one
call = one denoising step's UNet call on a batch of `samples` x 2 (image guidance). Every variant gets a
warm-up call, then `--calls` timed ones, with the load average printed beside each (a shared machine);
`--alternate` holds all variants at once and calls them in turn, so a changing background load hits each alike.

    PYTHONPATH=$PWD python scripts/measure_quant.py --resolution 384x512 --samples 2 --variants fp32,int8-dynamic
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import statistics
import time

import torch

from ootd.attention import build_attention, install_attention
from ootd.hardware.dtypes import DTYPES
from ootd.method.fusion import TryOnFusion, capture_block_inputs
from ootd.models import Models
from ootd.runtime import RuntimeRequest
from ootd.settings import QuantizeName, parse_resolution
from ootd.speedups.quantize import module_weight_bytes, quantize_unets
from ootd.tools.bench.architectures import ARCHITECTURES
from ootd.tools.bench.profiling import load_average

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
    parser.add_argument("--alternate", action="store_true",
                        help="hold every variant at once and call them in turn (fairer on a shared machine)")
    args = parser.parse_args()
    width, height = parse_resolution(args.resolution).size
    info = Models(None, RuntimeRequest(device="cpu")).runtime().device  # the device as a run resolves it
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
    variants = args.variants.split(",")
    groups = [variants] if args.alternate else [[v] for v in variants]
    results: dict[str, dict] = {}
    for group in groups:  # the variants of a group are held at once and called in turn
        runs = {v: _Variant(v, base, features, info) for v in group}
        with contextlib.ExitStack() as stack, torch.inference_mode():
            for run in runs.values():
                stack.enter_context(run.fusion.garment(run.features, index))
            for i in range(args.calls + 1):
                for run in runs.values():
                    run.call(sample, prompt, timed=i > 0)
        for name, run in runs.items():
            results[name] = run.summary()
            print(name, json.dumps({k: v for k, v in results[name].items() if k != "output"}), flush=True)
        del runs
        gc.collect()
    reference = results.get("fp32", {}).pop("output", None)
    for result in results.values():
        out = result.pop("output", None)
        if reference is not None and out is not None:
            diff = (out - reference).abs()
            result.update(max_abs_diff=float(diff.max()), mean_abs_diff=float(diff.mean()),
                          reference_mean_abs=float(reference.abs().mean()))
    if reference is not None:
        results["fp32"].update(max_abs_diff=0.0, mean_abs_diff=0.0)
    print(json.dumps({"resolution": [width, height], "batch": batch, "threads": torch.get_num_threads(),
                      "alternate": args.alternate, "results": results}, indent=1))


class _Variant:
    """One variant of the try-on UNet (a dtype, a quantization) with the fusion processors and `sdpa` attention."""

    def __init__(self, name: str, base: torch.nn.Module, features: dict[str, torch.Tensor], info) -> None:  # noqa: ANN001
        if "+" in name:
            dtype_word, mode = name.split("+")
        elif name in QuantizeName.words():
            dtype_word, mode = "fp32", name
        else:
            dtype_word, mode = name, "none"
        self.name, self.dtype = name, DTYPES[dtype_word]
        self.unet = base if name == "fp32" else copy.deepcopy(base).to(self.dtype)
        quantize_unets(_Unets(None, self.unet), mode, info)
        attention = build_attention("sdpa", info, self.dtype)
        self.fusion = TryOnFusion(self.unet, attention)
        install_attention([self.unet], attention)
        self.features = {k: v.to(self.dtype) for k, v in features.items()}
        self.walls: list[float] = []
        self.loads: list[str] = []
        self.output: torch.Tensor | None = None

    def call(self, sample: torch.Tensor, prompt: torch.Tensor, *, timed: bool) -> None:
        prompts = prompt.to(self.dtype).expand(sample.shape[0], -1, -1)
        start = time.perf_counter()
        out = self.unet(sample.to(self.dtype), torch.tensor(500), encoder_hidden_states=prompts, return_dict=False)[0]
        wall = time.perf_counter() - start
        print(f"  {self.name} {'timed' if timed else 'warm-up'} call: {wall:.2f} s (load {load_average()})",
              flush=True)
        self.output = out.float()
        if timed:
            self.walls.append(wall)
            self.loads.append(load_average())

    def summary(self) -> dict:
        return {"seconds": self.walls, "median_seconds": statistics.median(self.walls), "load": self.loads,
                "weight_bytes": module_weight_bytes(self.unet), "output": self.output}


if __name__ == "__main__":
    main()
