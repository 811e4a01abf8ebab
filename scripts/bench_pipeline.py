#!/usr/bin/env python
"""Benchmark the try-on pipeline (per-stage times, s/it, peak memory vs the planner's estimate), optionally
against the original OOTDiffusion formulation on the same weights, and count FLOPs per denoising step.

    python scripts/bench_pipeline.py --random-weights full --resolution 384x512 --samples 2 --steps 1 \\
        --compare-original
    python scripts/bench_pipeline.py --checkpoints ./checkpoints --steps 20 --json
    python scripts/bench_pipeline.py --flops-only --flops-samples 4 --flops-resolution 768x1024
    python scripts/bench_pipeline.py --plan-only --device cuda --dtype fp16 --samples 4 --max-memory-gib 8
    python scripts/bench_pipeline.py --matrix --random-weights full --dtypes bf16,fp16 \\
        --attentions flash,sdpa,chunked --samples 4 --steps 3 --out gpu.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoints", type=Path, help="a checkpoints tree in the released layout")
    src.add_argument("--random-weights", choices=("full", "tiny"),
                     help="build the released architectures (full) or tiny ones in memory with random weights")
    p.add_argument("--model-type", default="hd", choices=("hd", "dc"))
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: the best available)")
    p.add_argument("--dtype", default="auto", help="auto, fp32, fp16, bf16")
    p.add_argument("--attention", default="sdpa", help="auto, flash, sdpa, chunked, math")
    p.add_argument("--resolution", default="768x1024", help="768x1024 or 384x512")
    p.add_argument("--samples", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--scale", type=float, default=2.0, help="guidance scale (>= 1 turns guidance on)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scheduler", default="unipc")
    p.add_argument("--max-memory-gib", type=float, default=None, help="plan for this budget instead of free memory")
    p.add_argument("--channels-last", dest="channels_last", action="store_true", default=None,
                   help="ours in channels_last layout (default: the device profile's choice)")
    p.add_argument("--no-channels-last", dest="channels_last", action="store_false")
    p.add_argument("--compile", action="store_true", default=None, help="torch.compile our try-on UNet")
    p.add_argument("--compare-original", action="store_true", help="also run the original formulation")
    p.add_argument("--no-ours", action="store_true", help="skip our pipeline (with --compare-original)")
    p.add_argument("--no-call", action="store_true", help="skip the whole calls (with --step-repeats)")
    p.add_argument("--step-repeats", type=int, default=0,
                   help="also time N try-on UNet calls of ours and of the original, alternating")
    p.add_argument("--warmup", action="store_true", help="an untimed 1-step call of each formulation first")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--flops", action="store_true", help="count FLOPs per step, ours vs original")
    p.add_argument("--flops-only", action="store_true", help="only count FLOPs (meta device, no weights)")
    p.add_argument("--plan-only", action="store_true",
                   help="only print the memory plan for the released models on this device (nothing is loaded)")
    p.add_argument("--flops-samples", type=int, default=4)
    p.add_argument("--flops-resolution", default="768x1024")
    p.add_argument("--profile", action="store_true", help="torch.profiler table of one extra 1-step call")
    p.add_argument("--matrix", action="store_true",
                   help="every --dtypes x --attentions pair plus the original per dtype (random weights)")
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--attentions", default="flash,sdpa,chunked")
    p.add_argument("--speed-variants", default="",
                   help="matrix: also run these options on the first backend, e.g. channels_last,compile")
    p.add_argument("--time-limit", type=float, default=None, help="matrix: start no run after this many seconds")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report to this file")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _save(path: Path | None, report: dict) -> None:
    """Write the report (also partial ones, so a run cut short still leaves its results)."""
    if path is not None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
        tmp.replace(path)


def _config(args: argparse.Namespace, max_memory: int | None):  # noqa: ANN202
    """The RunConfig these flags ask for, built as `ootd bench` builds it."""
    from ootd.app.tryon.config import build_config

    return build_config(checkpoints=args.checkpoints or Path("."), device=args.device, precision=args.dtype,
                        attention=args.attention, resolution=args.resolution, samples=args.samples, steps=args.steps,
                        scale=args.scale, seed=args.seed, scheduler=args.scheduler,
                        max_memory=str(max_memory) if max_memory else None, channels_last=args.channels_last,
                        compile=args.compile)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    from ootd.settings import ModelType, parse_resolution
    from ootd.tools.bench.drivers import BenchOptions, run_bench
    from ootd.tools.bench.flops import count_step_flops
    from ootd.tools.bench.matrix import run_matrix

    def log(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    max_memory = int(args.max_memory_gib * 2**30) if args.max_memory_gib else None
    if args.plan_only:
        from ootd.hardware.policy import choose_precision
        from ootd.memory.estimate import PlanRequest
        from ootd.memory.planner import make_plan
        from ootd.memory.sizes import ModelSizes
        from ootd.models import Models

        # the device as a run resolves it, before any weights are loaded (as run_bench plans)
        info = Models(None, _config(args, max_memory).runtime_request).runtime().device
        precision = choose_precision(info, args.dtype)
        plan = make_plan(PlanRequest(info, parse_resolution(args.resolution).size, args.samples, args.scale >= 1,
                                     precision.unet, args.attention, ModelSizes.released(), max_memory,
                                     vae_dtype=precision.vae))
        report = {"plan": plan.to_dict()}
        log(plan.explain())
    elif args.flops_only:
        flops = count_step_flops(num_samples=args.flops_samples,
                                 resolution=parse_resolution(args.flops_resolution).size, guidance=args.scale >= 1)
        flops["ratio_step"] = flops["original_step"] / flops["ours_step"]
        report = {"flops": flops}
        log(f"FLOPs per step: ours {flops['ours_step'] / 1e12:.2f} T, original {flops['original_step'] / 1e12:.2f} T "
            f"({flops['ratio_step']:.2f}x); garment UNet ours {flops['ours_garment_unet'] / 1e12:.2f} T, "
            f"original {flops['original_garment_unet'] / 1e12:.2f} T")
    elif args.matrix:
        report = run_matrix(_config(args, max_memory), random_weights=args.random_weights or "full",
                            dtypes=[d for d in args.dtypes.split(",") if d],
                            attentions=[a for a in args.attentions.split(",") if a],
                            original=True, count_flops=args.flops, time_limit=args.time_limit, log=log,
                            speed_variants=[v for v in args.speed_variants.split(",") if v],
                            on_update=lambda partial: _save(args.out, partial))
    else:
        if args.checkpoints is None and args.random_weights is None:
            print("give --checkpoints DIR or --random-weights full|tiny", file=sys.stderr)
            return 2
        options = BenchOptions(compare_original=args.compare_original and not args.no_call,
                               run_ours=not (args.no_ours or args.no_call), warmup=args.warmup,
                               step_repeats=args.step_repeats, threads=args.threads, count_flops=args.flops,
                               flops_samples=args.flops_samples,
                               flops_resolution=parse_resolution(args.flops_resolution), profile=args.profile)
        report = run_bench(_config(args, max_memory), model_type=ModelType.parse(args.model_type),
                           random_weights=args.random_weights, options=options, log=log)
        if args.profile:
            for label in ("ours", "original"):
                if "profile" in report.get(label, {}):
                    log(f"--- profile, {label} (one 1-step call) ---\n{report[label]['profile']}")
        if "memory" in report:
            mem = report["memory"]
            log(f"peak memory ({mem['kind']}): measured {mem['measured_peak'] / 2**30:.2f} GiB, "
                f"estimated {mem['estimated_peak'] / 2**30:.2f} GiB")
            for stage, pair in mem["stages"].items():
                measured = "-" if pair["measured"] is None else f"{pair['measured'] / 2**30:.2f}"
                log(f"  {stage:<13} measured {measured:>6} GiB  estimated {pair['estimated'] / 2**30:.2f} GiB")
        log("versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
        m = report["machine"]
        log(f"machine: {m.get('cpu_model', m['processor'])}, {m['cpu_count']} CPUs, torch threads "
            f"{m['torch_threads']}, device {m['device_name']} ({m['device_type']}), load {m.get('load_average')}")
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    _save(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
