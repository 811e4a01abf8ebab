#!/usr/bin/env python
"""Every speed mode side by side in one process, on full-size random weights: s/step, the whole call, peak
memory, and how far each mode's images are from the first mode's (the exact fp32 path) on the same seed.

    python scripts/bench_speed_modes.py --resolution 384x512 --samples 2 --steps 20 \\
        --modes exact-fp32,exact-bf16,cache3-bf16,tome0.5-bf16,fast-bf16,int8-fp32 --original-steps 2
    python scripts/bench_speed_modes.py --resolution 768x1024 --samples 1 --steps 6 --extrapolate 20 \\
        --modes exact-fp32,exact-bf16,fast-bf16 --original-steps 1

A mode is `<what>-<precision>[@steps]`: what = exact | fast | cacheN | tomeR | int8 | fast+cl (channels_last on
top) | lcmN[+tomeR] (a few-step adapter: N steps of the lcm scheduler, guidance off, a random rank-64 adapter merged
into the try-on UNet as `--lora` merges one; a stand-in, nothing was distilled: only its time means anything),
precision = fp32 | bf16, steps overriding --steps for that mode (its images are then compared with nothing).
An lcm mode's whole call is its own N steps, measured; put it last: its merged adapter changes the built models.
Models are built once per precision (quantized ones on a fresh build). With
`--extrapolate N` the whole call is also given for N steps from the measured stages: the fixed stages as
measured, plus N steps at the median refresh / cached step times (feature caching's steps alternate between the
two). The original formulation (`ootd/tools/bench/reference.py`) runs `--original-steps` steps on the exact fp32 models
and is extrapolated the same way. Random weights say nothing about how the images look: judge a mode on the
released weights with `ootd compare`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

FIXED_STAGES = ("conditioning", "encode", "garment_unet", "decode")


def parse_mode(spec: str) -> dict[str, Any]:
    from ootd.settings import SpeedPreset
    from ootd.speedups.modes import PRESETS

    match = re.fullmatch(r"(exact|fast(\+cl)?|cache(\d+)|tome([0-9.]+)|int8|lcm(\d+)(?:\+tome([0-9.]+))?)"
                         r"-(fp32|bf16)(?:@(\d+))?", spec)
    if match is None:
        raise SystemExit(f"bad mode {spec!r}: <exact|fast|fast+cl|cacheN|tomeR|int8|lcmN[+tomeR]>-<fp32|bf16>[@steps]")
    what, cl, interval, ratio, few, few_ratio, precision, steps = match.groups()
    mode = {"name": spec, "dtype": precision, "cache_interval": 1, "token_merge": 0.0, "quantize": "none",
            "channels_last": False, "steps": int(steps) if steps else None, "few_step": None}
    if few:  # a few-step adapter: its own steps, the lcm scheduler, no guidance pass
        mode.update(few_step=int(few), steps=int(few), token_merge=float(few_ratio or 0.0))
        return mode
    if what.startswith("fast"):
        fast = PRESETS[SpeedPreset.FAST]
        mode.update(cache_interval=fast.feature_cache.interval, token_merge=fast.token_merge.ratio,
                    quantize=fast.quantize.value, channels_last=bool(cl) or bool(fast.channels_last))
    elif interval:
        mode["cache_interval"] = int(interval)
    elif ratio:
        mode["token_merge"] = float(ratio)
    elif what == "int8":
        mode["quantize"] = "int8-dynamic"
    return mode


def whole_call(run: dict[str, Any], steps: int, interval: int) -> float:
    """Fixed stages + `steps` steps at the measured median refresh / cached step times (wall seconds)."""
    return compose({s: run.get(s, 0.0) for s in FIXED_STAGES}, run["steps"], steps, interval)


def compose(fixed: dict[str, float | None], times: list[float], steps: int, interval: int) -> float:
    """The fixed stages' seconds + `steps` steps at the median refresh / cached times of the measured `times`."""
    timed = list(enumerate(times))[1:] if len(times) > 2 else list(enumerate(times))
    refresh = [t for i, t in timed if i % interval == 0] or [t for _, t in timed]
    cached = [t for i, t in timed if i % interval != 0]
    per_refresh, per_cached = statistics.median(refresh), statistics.median(cached) if cached else 0.0
    n_refresh = len(range(0, steps, interval))
    return sum(v or 0.0 for v in fixed.values()) + n_refresh * per_refresh + (steps - n_refresh) * per_cached


def cpu_figures(ours: dict[str, Any], target: int, mode: dict[str, Any]) -> dict[str, Any]:
    """Process-CPU seconds of the call: as measured, per fixed stage, per step, the denoising, and the whole call
    composed alike in every mode, the fixed stages plus the steps (a few-step mode's own steps as measured, the
    others' `target` steps at the median refresh / cached step, as `whole_call` composes wall seconds)."""
    stages = {s: ours["stage_cpu"].get(s) for s in FIXED_STAGES}
    steps = ours["steps_cpu"]
    whole = sum(v or 0.0 for v in stages.values()) + sum(steps) if mode["few_step"] else \
        compose(stages, steps, target, mode["cache_interval"])
    return {"call": ours["cpu"], "stages": stages, "steps": steps, "s_per_step": ours["s_per_it_cpu"],
            "denoise": sum(steps), "unet_calls": ours["stages"]["cpu"].get("denoise", []), f"whole_{target}": whole,
            f"denoise_{target}": sum(steps) if mode["few_step"] else compose({}, steps, target, mode["cache_interval"])}


def load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def merge_random_adapter(components: Any, seed: int, rank: int = 64) -> None:
    """A stand-in few-step adapter merged into the try-on UNet as `--lora` merges one (peft: added, fused at scale
    1, its layers removed): the plain layers run after, at the cost of the base model's."""
    import torch

    from ootd.training.adapters import add_lora, target_modules

    unet = components.unet_vton
    add_lora(unet, target_modules(unet), rank, rank, seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in unet.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 1e-3)
    unet.fuse_lora(lora_scale=1.0)
    unet.unload_lora()
    unet.requires_grad_(False)


def differences(reference: Path, folder: Path) -> dict[str, float]:
    """`ootd compare`'s figures for two folders of sample_<i>.png; PSNR of the worst sample."""
    from ootd.tools.compare import compare_folders

    compared = compare_folders(reference, folder).compared
    return {"max_pixel": max(c.max_abs for c in compared), "mean_pixel": statistics.mean(c.mean_abs for c in compared),
            "psnr_db": min(c.psnr for c in compared), "ssim": min(c.ssim for c in compared)}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--resolution", default="384x512")
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--extrapolate", type=int, default=None, help="also give the whole call for this many steps")
    p.add_argument("--modes", default="exact-fp32,exact-bf16,fast-bf16")
    p.add_argument("--original-steps", type=int, default=0, help="also run the original formulation (fp32)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kind", default="full", choices=("full", "tiny"), help="tiny: a quick check of the script")
    p.add_argument("--out", type=Path, default=None, help="write the JSON report there")
    return p.parse_args()


def log(line: str) -> None:
    print("   ", line, flush=True)


def components_for(mode: dict[str, Any], built: dict[str, Any], args: argparse.Namespace, info: Any) -> Any:
    """The random-weight models of `mode`'s precision: those built for it before, else a fresh build (always for
    a quantized mode, whose quantization changes them; kept for the next mode otherwise)."""
    from ootd.hardware.policy import choose_precision
    from ootd.tools.bench.random_weights import build_random_components

    if mode["quantize"] == "none" and mode["dtype"] in built:
        return built[mode["dtype"]]
    built.clear()
    gc.collect()
    components = build_random_components(args.kind, choose_precision(info, mode["dtype"]), "cpu", args.seed)
    if mode["quantize"] == "none":
        built[mode["dtype"]] = components
    return components


def bench_mode(mode: dict[str, Any], components: Any, built: dict[str, Any], args: argparse.Namespace,
               common: dict[str, Any], folder: Path) -> dict[str, Any]:
    """One mode's call (its images into folder/<mode>), and the original formulation's after the exact fp32
    one where --original-steps asks for it: run_bench's report."""
    from ootd.app.tryon.config import build_config
    from ootd.tools.bench.drivers import BenchOptions, run_bench

    few = {"scheduler": "lcm", "scale": 0.0} if mode["few_step"] else {}
    if mode["few_step"]:
        merge_random_adapter(components, args.seed)
        built.clear()  # the merged adapter stays in these models
    config = build_config(**common, precision=mode["dtype"], steps=mode["steps"] or args.steps,
                          cache_interval=mode["cache_interval"], token_merge=mode["token_merge"],
                          quantize=mode["quantize"], channels_last=mode["channels_last"], **few)
    report = run_bench(config, components=components, log=log, options=BenchOptions(save_images=folder / mode["name"]))
    if args.original_steps and mode["name"].startswith("exact-fp32"):
        print(f"== the original formulation, fp32, {args.original_steps} step(s)", flush=True)
        original = build_config(**common, precision="fp32", steps=args.original_steps)
        report["original"] = run_bench(original, components=components, log=log,
                                       options=BenchOptions(run_ours=False, compare_original=True))["original"]
    return report


def mode_row(mode: dict[str, Any], report: dict[str, Any], target: int, steps: int,
             compared: dict[str, float] | None, loads: dict[str, list[float] | None]) -> dict[str, Any]:
    """A mode's row of the report: its figures, `compared` (its images against the first mode's, None where the
    step counts differ), the load average `loads` before and after, and the original formulation's figures where
    it ran."""
    import torch

    ours = report["ours"]
    row = {"mode": mode, "s_per_step": ours["s_per_it"], "steps": ours["steps"], "wall": ours["wall"],
           "stages": {s: ours.get(s) for s in FIXED_STAGES}, "denoise": ours.get("denoise"),
           "cpu": cpu_figures(ours, target, mode), "load_average": loads,
           "threads": torch.get_num_threads(), "peak_rss_gib": ours["peak_memory"] / 2**30,
           f"whole_{target}": ours["wall"] if mode["few_step"] else whole_call(ours, target, mode["cache_interval"]),
           "diff_from_first": compared, "steps_run": steps}
    if report.get("original") is not None:
        orig = report["original"]
        row["original"] = {"s_per_step": orig["s_per_it"], "steps": orig["steps"],
                           "stages": {s: orig.get(s) for s in FIXED_STAGES},
                           f"whole_{target}": whole_call(orig, target, 1), "peak_rss_gib": orig["peak_memory"] / 2**30}
    return row


def main() -> None:
    args = parse_args()

    import torch

    from ootd.memory.planner import memory_budget
    from ootd.models import Models
    from ootd.runtime import RuntimeRequest

    if args.threads:
        torch.set_num_threads(args.threads)
    modes = [parse_mode(m) for m in args.modes.split(",")]
    target = args.extrapolate or args.steps
    info = Models(None, RuntimeRequest(device="cpu")).runtime().device  # the device as a run resolves it
    # the budget as a run would see it, before any weights are in memory (run_bench, given built components,
    # would otherwise plan for what is left beside them and switch VAE tiling on where a run would not)
    budget = memory_budget(info)
    with tempfile.TemporaryDirectory(prefix="ootd-speed-modes-") as folder:  # the pictures compared, then gone
        rows = run_modes(args, modes, info, budget, Path(folder))
    _table(rows, target)
    _cpu_table(rows, target)
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=1,
                                       default=str) + "\n")


def run_modes(args: argparse.Namespace, modes: list[dict[str, Any]], info: Any, budget: int,
              folder: Path) -> list[dict[str, Any]]:
    """Each mode's row, its pictures written under `folder` and compared with the first mode's."""
    import torch

    target = args.extrapolate or args.steps
    rows, reference, built = [], None, {}
    common = {"checkpoints": Path("."), "device": "cpu", "resolution": args.resolution, "samples": args.samples,
              "seed": args.seed, "attention": "sdpa", "max_memory": str(budget)}
    for mode in modes:
        components = components_for(mode, built, args, info)
        print(f"== {mode['name']} (load average {load()}, {torch.get_num_threads()} thread(s))", flush=True)
        load_before = load()
        steps = mode["steps"] or args.steps
        report = bench_mode(mode, components, built, args, common, folder)
        reference = reference or (folder / mode["name"], steps)
        loads = {"before": load_before, "after": load()}
        compared = differences(reference[0], folder / mode["name"]) if reference[1] == steps else None
        rows.append(mode_row(mode, report, target, steps, compared, loads))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "mode"}, default=str), flush=True)
    return rows


def _table(rows: list[dict[str, Any]], target: int) -> None:
    first = rows[0]
    base = first.get("original", first)
    against = "original" if "original" in first else first["mode"]["name"]
    print(f"\n| mode | s/step | whole {target}-step call | vs {against}"
          " | encode / garment UNet / decode | peak RSS | max / mean pixel diff | PSNR | steps run |")
    print("|---|---:|---:|---:|---|---:|---|---:|---:|")
    if "original" in first:
        o = first["original"]
        st = o["stages"]
        print(f"| original formulation fp32 | {o['s_per_step']:.1f} s | {o[f'whole_{target}']:.0f} s | 1.00x | "
              f"{st['encode']:.1f} / {st['garment_unet']:.1f} / {st['decode']:.1f} s | {o['peak_rss_gib']:.1f} GiB |"
              f" | | {len(o['steps'])} |")
    for r in rows:
        st, d = r["stages"], r["diff_from_first"]
        ratio = base[f"whole_{target}"] / r[f"whole_{target}"]
        diff = f"{d['max_pixel']} / {d['mean_pixel']:.2f} | {d['psnr_db']:.1f} dB" if d else "(other steps) | "
        print(f"| {r['mode']['name']} | {r['s_per_step']:.1f} s | {r[f'whole_{target}']:.0f} s | {ratio:.2f}x | "
              f"{st['encode']:.1f} / {st['garment_unet']:.1f} / {st['decode']:.1f} s | {r['peak_rss_gib']:.1f} GiB | "
              f"{diff} | {r['steps_run']} |")


def _cpu_table(rows: list[dict[str, Any]], target: int) -> None:
    """Process-CPU seconds (with one thread: the work done, whatever else runs on the machine), each mode against
    the first and against the first `fast` one: the whole call and the denoising alone."""
    others = [rows[0]] + [r for r in rows if r["mode"]["name"].startswith("fast")][:1]
    names = " | ".join(f"vs {o['mode']['name']} (call / denoising)" for o in others)
    print(f"\n| mode | CPU: conditioning / encodes / garment UNet / decode | CPU s/step | denoising, {target} steps"
          f" (few-step: its own) | whole call, CPU | whole call, wall | {names} | load before / after |")
    print("|---|---|---:|---:|---:|---:|" + "---:|" * len(others) + "---|")
    for r in rows:
        c, st = r["cpu"], r["cpu"]["stages"]
        fixed = " / ".join(f"{st[s]:.1f}" if st[s] is not None else "-" for s in FIXED_STAGES)
        ratios = " | ".join(f"{o['cpu'][f'whole_{target}'] / c[f'whole_{target}']:.2f}x / "
                            f"{o['cpu'][f'denoise_{target}'] / c[f'denoise_{target}']:.2f}x" for o in others)
        loads = r["load_average"]
        print(f"| {r['mode']['name']} | {fixed} s | {c['s_per_step']:.2f} s | {c[f'denoise_{target}']:.1f} s | "
              f"{c[f'whole_{target}']:.1f} s | {r[f'whole_{target}']:.1f} s | {ratios} | "
              f"{(loads['before'] or ['?'])[0]} / {(loads['after'] or ['?'])[0]} |")


if __name__ == "__main__":
    main()
