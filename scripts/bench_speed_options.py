#!/usr/bin/env python
"""A/B of the speed options on one try-on UNet call (the whole cost of a denoising step).

The same models, latents and garment features; after one untimed call each, the variants take turns
call by call, so a changing background load hits them alike. `compile` runs last (a compiled UNet stays
compiled) and its first call, which compiles, is reported separately.

    python scripts/bench_speed_options.py --random-weights full --resolution 384x512 --samples 2 --repeats 3
    python scripts/bench_speed_options.py --variants default,channels_last,compile --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("default", "channels_last", "compile")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--random-weights", choices=("full", "tiny"), default="full")
    p.add_argument("--resolution", default="384x512")
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--variants", default="default,channels_last", help=f"comma-separated: {', '.join(VARIANTS)}")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if not variants or set(variants) - set(VARIANTS):
        print(f"variants must be among {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    variants = sorted(variants, key=lambda v: v == "compile")  # compile last: it cannot be undone

    import torch

    from ootd.attention import install_attention, sdpa_attention
    from ootd.method.fusion import TryOnFusion, capture_block_inputs
    from ootd.models import Models
    from ootd.runtime import RuntimeRequest
    from ootd.settings import PrecisionName, parse_resolution
    from ootd.speedups.execution import as_memory_format, compile_module, set_memory_format
    from ootd.tools.bench.random_weights import build_random_components

    if args.threads:
        torch.set_num_threads(args.threads)
    precision = Models(None, RuntimeRequest(device="cpu", precision=PrecisionName.FP32)).runtime().precision
    c = build_random_components(args.random_weights, precision)
    width, height = parse_resolution(args.resolution).size
    h, w = height // 8, width // 8
    gen = torch.Generator().manual_seed(0)
    cross = int(c.unet_vton.config.cross_attention_dim)
    prompt = torch.randn(1, 2, cross, generator=gen)
    garment = torch.randn(1, 4, h, w, generator=gen)
    batch = 2 * args.samples  # guidance: conditional and unconditional halves
    sample = torch.randn(batch, 8, h, w, generator=gen)
    timestep = torch.tensor(500)
    unet = c.unet_vton
    fusion = TryOnFusion(unet, sdpa_attention)
    install_attention([c.unet_garm, unet], sdpa_attention)
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    outputs: dict[str, torch.Tensor] = {}
    first_compile_call = None
    with torch.inference_mode():
        with capture_block_inputs(c.unet_garm, stop_early=True) as captured:
            c.unet_garm(torch.cat([garment, torch.zeros_like(garment)]), 0,
                        encoder_hidden_states=prompt.expand(2, -1, -1), return_dict=False)
        features = dict(captured)
        index = torch.arange(2).repeat_interleave(args.samples)
        prompts = prompt.expand(batch, -1, -1)
        with fusion.garment(features, index):
            def call(variant: str) -> tuple[float, float]:
                channels_last = variant != "default"
                set_memory_format([unet], channels_last)
                x = as_memory_format(sample, channels_last)
                wall, cpu = time.perf_counter(), time.process_time()
                outputs[variant] = unet(x, timestep, encoder_hidden_states=prompts, return_dict=False)[0]
                return time.perf_counter() - wall, time.process_time() - cpu

            eager = [v for v in variants if v != "compile"]
            for variant in eager:  # untimed warm-up: kernel selection, first-touch allocations
                call(variant)
            if "compile" in variants:
                for _ in range(args.repeats):
                    for variant in eager:
                        times[variant].append(call(variant))
                compile_module(unet)
                first_compile_call = call("compile")
                for _ in range(args.repeats):
                    times["compile"].append(call("compile"))
            else:
                for _ in range(args.repeats):
                    for variant in variants:
                        times[variant].append(call(variant))
    base = outputs[variants[0]].float()
    report = {
        "resolution": [width, height], "samples": args.samples, "batch": batch, "threads": torch.get_num_threads(),
        "random_weights": args.random_weights,
        "variants": {v: {"wall": [t[0] for t in times[v]], "cpu": [t[1] for t in times[v]],
                         "median_wall": statistics.median(t[0] for t in times[v]),
                         "median_cpu": statistics.median(t[1] for t in times[v]),
                         "max_abs_diff_vs_first": float((outputs[v].float() - base).abs().max())}
                     for v in variants},
        "first_compiled_call_wall": first_compile_call[0] if first_compile_call else None,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for v, r in report["variants"].items():
            walls = ", ".join(f"{x:.2f}" for x in r["wall"])
            print(f"{v:<14} median {r['median_wall']:.2f} s wall, {r['median_cpu']:.2f} s CPU ({walls}); "
                  f"max abs diff vs {variants[0]} {r['max_abs_diff_vs_first']:.1e}")
        if first_compile_call:
            print(f"first compiled call (compiles): {first_compile_call[0]:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
