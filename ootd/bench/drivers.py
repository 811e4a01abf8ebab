"""`run_bench`: one configuration of the benchmark (per-stage times, peak memory next to the planner's estimate,
optionally the original formulation, alternating step comparisons and FLOPs), as a plain dict that `ootd bench`
and `scripts/bench_pipeline.py` print. `run_matrix` (ootd/bench/matrix.py) calls it once per configuration."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ootd.attention import Dispatcher, build_attention
from ootd.bench.compare import compare_steps
from ootd.bench.flops import count_step_flops
from ootd.bench.profiling import PeakMemory, machine, profile_step, stage_meter, stage_modules, versions
from ootd.bench.random_weights import build_random_components, synthetic_inputs
from ootd.bench.reference import run_original
from ootd.config import ModelType, QuantizeName, parse_resolution
from ootd.device import DeviceInfo, detect_device
from ootd.device_policy import Precision, SpeedOptions, choose_precision, choose_speed
from ootd.errors import UsageError
from ootd.loading import Components, load_components
from ootd.memory import STAGES, ModelSizes, Plan, apply_plan_to_vae, make_plan
from ootd.profiles import load_profile
from ootd.quantize import quantize_unets

logger = logging.getLogger(__name__)

Log = Callable[[str], None]


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
    cache_interval: int = 1,
    token_merge: float = 0.0,
    quantize: str = "none",
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
    save_images: str | Path | None = None,
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
    (1 makes CPU-time figures immune to other processes' load). `save_images` writes our call's images there as
    sample_<i>.png (to judge a speed mode with `ootd compare`). `log` gets one line per finished part (for live
    output).
    """
    say = log or (lambda line: logger.info("%s", line))
    if sum(x is not None for x in (checkpoints, random_weights, components)) != 1:
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
                   "scheduler": scheduler, "cache_interval": cache_interval, "token_merge": token_merge,
                   "quantize": quantize, "max_memory": max_memory,
                   "channels_last": speed.channels_last, "compile": speed.compile},
    }
    meter = PeakMemory(info.torch_device)
    report["memory_before_load"] = meter.current()
    t = time.perf_counter()
    if components is None:
        components = _load(checkpoints, random_weights, mtype, info, precision, seed)
    quantized = quantize_unets(components, quantize, info)  # in place: components passed in stay quantized
    report["load_seconds"] = time.perf_counter() - t
    say(f"models ready in {report['load_seconds']:.1f} s")

    guidance = guidance_scale >= 1.0
    bench = _Bench(components, mtype, info, precision, meter, res, seed, say)
    bench.plan_and_pipeline(report, num_samples, guidance, attention, max_memory, speed, quantized)
    call = {"mask": bench.mask, "num_samples": num_samples, "steps": steps, "guidance_scale": guidance_scale,
            "seed": seed, "resolution": res, "scheduler": scheduler, "cache_interval": cache_interval,
            "token_merge": token_merge}
    if run_ours:
        bench.ours(report, call, warmup=warmup, profile=profile)
        if save_images is not None:
            report["images_saved"] = _save_images(bench.images, Path(save_images))
    if compare_original:
        bench.original(report, call, warmup=warmup, profile=profile)
    if step_repeats > 0:
        bench.compare_steps(report, num_samples, guidance, step_repeats, speed)
    if count_flops:
        report["flops"] = _flops(dict(components.unet_vton.config), flops_samples, flops_res, guidance, say)
    return report


def _load(checkpoints: str | Path | None, random_weights: str | None, model_type: ModelType, info: DeviceInfo,
          precision: Precision, seed: int) -> Components:
    if checkpoints is None:
        return build_random_components(str(random_weights), precision, info.torch_device, seed)
    return load_components(Path(checkpoints), model_type, precision.dtypes())


@dataclass
class _Bench:
    """One benchmark's components, device and synthetic inputs; fills the report part by part."""

    components: Components
    model_type: ModelType
    info: DeviceInfo
    precision: Precision
    meter: PeakMemory
    resolution: tuple[int, int]
    seed: int
    say: Log
    plan: Plan = field(init=False)  # these three are set by plan_and_pipeline, before any run
    pipe: Any = field(init=False)
    attention_fn: Dispatcher = field(init=False)

    def __post_init__(self) -> None:
        self.person, self.garment, self.mask = synthetic_inputs(seed=self.seed)
        self.images: list[Image.Image] = []  # ours, to compare the original's with

    def plan_and_pipeline(self, report: dict[str, Any], num_samples: int, guidance: bool, attention: str,
                          max_memory: int | None, speed: SpeedOptions,
                          quantize: QuantizeName = QuantizeName.NONE) -> None:
        """The memory plan (into the report) and our pipeline on the components."""
        from ootd.pipeline import TryOnPipeline

        device_profile = load_profile(self.info)
        plan = make_plan(self.info, self.resolution, num_samples, guidance, self.precision.unet, attention,
                         ModelSizes.from_components(self.components), max_memory, vae_dtype=self.precision.vae,
                         profile=device_profile)
        report["plan"] = plan.to_dict()
        report["plan_text"] = plan.explain()
        self.say(plan.explain())
        self.plan = plan
        attention_fn = build_attention(attention, self.info, self.precision.unet, plan.attention_budget_bytes)
        self.pipe = TryOnPipeline(self.components, self.model_type, self.info, self.precision,
                                  attention=attention_fn, speed=speed, profile=device_profile, quantize=quantize,
                                  max_memory=max_memory)  # the call plans with the budget the report shows
        apply_plan_to_vae(self.components.vae, plan)
        report["memory_after_load"] = self.meter.current()
        self.attention_fn = attention_fn

    def ours(self, report: dict[str, Any], call: dict[str, Any], *, warmup: bool, profile: bool) -> None:
        run = partial(self.pipe, self.person, self.garment, "upper", **call)
        if warmup:
            run(steps=1)
        result, report["ours"], peaks = self._measured(lambda: _timed_result(run))
        self.images = result.images
        self.say(_timing_line("ours", report["ours"]))
        report["memory"] = {
            "kind": self.meter.kind, "estimated_peak": self.plan.estimate["peak"],
            "measured_peak": report["ours"]["peak_memory"],
            "stages": {s: {"estimated": self.plan.estimate[s], "measured": peaks.get(s)} for s in STAGES},
        }
        report["attention_used"] = self.attention_fn.describe()
        if profile:
            report["ours"]["profile"] = profile_step(lambda: run(steps=1))

    def original(self, report: dict[str, Any], call: dict[str, Any], *, warmup: bool, profile: bool) -> None:
        run = partial(run_original, self.components, self.model_type, self.info, self.precision, self.person,
                      self.garment, self.mask, "upper", num_samples=call["num_samples"],
                      guidance_scale=call["guidance_scale"], seed=call["seed"], scheduler=call["scheduler"],
                      resolution=call["resolution"])
        if warmup:
            run(steps=1)
        images, report["original"], _ = self._measured(lambda: run(steps=call["steps"]))
        self.say(_timing_line("original", report["original"]))
        if "ours" in report:
            report["ratio"] = _ratios(report["ours"], report["original"])
            report["images_max_abs_diff"] = _max_abs_diff(self.images, images)
            self.say("original / ours: " + ", ".join(f"{k} {v:.2f}x" for k, v in report["ratio"].items()))
        if profile:
            report["original"]["profile"] = profile_step(lambda: run(steps=1))

    def compare_steps(self, report: dict[str, Any], num_samples: int, guidance: bool, repeats: int,
                      speed: SpeedOptions) -> None:
        self.say(f"alternating try-on UNet calls, ours vs original, {repeats} each")
        sc = report["steps_compare"] = compare_steps(
            self.components, self.info, self.precision, resolution=self.resolution, num_samples=num_samples,
            guidance=guidance, repeats=repeats, attention=self.attention_fn, speed=speed, log=self.say)
        self.say(f"UNet call original / ours: {sc['ratio_wall']:.2f}x wall, {sc['ratio_cpu']:.2f}x CPU "
                 f"(max abs diff {sc['max_abs_diff']:.2e})")

    def _measured(self, run: Callable[[], tuple[Any, dict[str, Any]]]) -> tuple[Any, dict[str, Any], dict]:
        """Run one call under the stage meter: its result, its summary (timings, wall, CPU, stages, peak)
        and the per-stage peaks."""
        self.meter.reset()
        wall, cpu = time.perf_counter(), time.process_time()
        with stage_meter(self.meter, stage_modules(self.components)) as record:
            result, timings = run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        summary = _summary(timings)
        summary.update(wall=wall, cpu=cpu, stages=record.to_dict())
        summary["peak_memory"] = max([self.meter.read(), *record.peaks.values()])
        return result, summary, record.peaks


def _save_images(images: Sequence[Image.Image], folder: Path) -> list[str]:
    from ootd.images import check_output_dir, save_png_atomic

    check_output_dir(folder)
    paths = [folder / f"sample_{i}.png" for i in range(len(images))]
    for image, path in zip(images, paths, strict=True):
        save_png_atomic(image, path, {}, overwrite=True)
    return [str(p) for p in paths]


def _timed_result(run: Callable[..., Any]) -> tuple[Any, dict[str, Any]]:
    result = run()
    return result, result.timings


def _ratios(ours: dict[str, Any], orig: dict[str, Any]) -> dict[str, float]:
    return {
        "step": orig["s_per_it"] / ours["s_per_it"], "call": orig["wall"] / ours["wall"],
        "step_cpu": _median_step(orig, "cpu") / _median_step(ours, "cpu"), "call_cpu": orig["cpu"] / ours["cpu"],
        "garment_unet": orig["garment_unet"] / ours["garment_unet"],
        "encode": orig["encode"] / ours["encode"], "decode": orig["decode"] / ours["decode"],
    }


def _flops(unet_config: dict, num_samples: int, resolution: tuple[int, int], guidance: bool,
           say: Log) -> dict[str, Any]:
    t = time.perf_counter()
    flops = count_step_flops(unet_config, num_samples=num_samples, resolution=resolution, guidance=guidance)
    flops["ratio_step"] = flops["original_step"] / flops["ours_step"]
    flops.update({"num_samples": num_samples, "resolution": list(resolution), "guidance": guidance,
                  "seconds": time.perf_counter() - t})
    say(f"FLOPs per step at {resolution[0]}x{resolution[1]}, {num_samples} samples: ours "
        f"{flops['ours_step'] / 1e12:.2f} T, original {flops['original_step'] / 1e12:.2f} T "
        f"({flops['ratio_step']:.2f}x)")
    return flops


def _timing_line(label: str, s: dict[str, Any]) -> str:
    parts = [f"{k} {s[k]:.2f}s" for k in ("conditioning", "encode", "garment_unet", "denoise", "decode", "total")
             if k in s]
    steps = " ".join(f"{x:.2f}" for x in s.get("steps", []))
    peak = s["peak_memory"] / 2**30
    return f"{label}: {', '.join(parts)}; steps [{steps}] s, {s['s_per_it']:.3f} s/it; peak {peak:.2f} GiB"


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

