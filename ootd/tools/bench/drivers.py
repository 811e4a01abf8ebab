"""`run_bench`: one configuration of the benchmark (per-stage times, peak memory next to the planner's estimate,
optionally the original formulation, alternating step comparisons and FLOPs), as a plain dict that `ootd bench`
and `scripts/bench_pipeline.py` print. `run_matrix` (ootd/tools/bench/matrix.py) calls it once per configuration.

A configuration is the RunConfig every front end builds (sampling, speed modes, device, precision, attention,
memory budget), resolved with the runtime a try-on uses (ootd/runtime.py); `BenchOptions` says what is measured
besides our call.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from ootd.app.tryon.config import RunConfig
from ootd.errors import UsageError
from ootd.hardware.dtypes import dtype_name
from ootd.hardware.policy import Precision, SpeedOptions, choose_precision
from ootd.memory.estimate import STAGES
from ootd.memory.planner import apply_plan_to_vae
from ootd.settings import RESOLUTIONS, ModelType, PrecisionName, Resolution, SamplingSettings
from ootd.tools.bench.flops import count_step_flops
from ootd.tools.bench.profiling import (
    PeakMemory,
    StepClock,
    machine,
    profile_step,
    stage_cpu,
    stage_meter,
    stage_modules,
    versions,
)
from ootd.tools.bench.random_weights import build_random_components, synthetic_inputs
from ootd.tools.bench.reference import run_original
from ootd.tools.bench.side_by_side import compare_steps
from ootd.weights.loading import Components

if TYPE_CHECKING:
    from ootd.models import Models
    from ootd.pipeline import TryOnPipeline
    from ootd.runtime import Runtime

logger = logging.getLogger(__name__)

Log = Callable[[str], None]


@dataclass(frozen=True)
class BenchOptions:
    """What a benchmark measures besides our call (each off by default)."""

    compare_original: bool = False  # the original formulation on the same weights, same call
    count_flops: bool = False
    flops_samples: int = 4
    flops_resolution: Resolution = RESOLUTIONS["768x1024"]
    run_ours: bool = True
    warmup: bool = False  # each formulation once with one step first, untimed (kernels, primitives)
    step_repeats: int = 0  # > 0: alternating UNet calls, ours vs original (`compare_steps`)
    threads: int | None = None  # torch's CPU threads (1: CPU-time figures immune to other processes' load)
    profile: bool = False  # a torch profiler table of one step
    save_images: Path | None = None  # our call's images there as sample_<i>.png (to `ootd compare` a mode)
    # the original formulation in this precision (None: ours'), e.g. fp32 against ours in bf16: its own models
    # are loaded after ours ran and were let go
    original_precision: PrecisionName | None = None


def run_bench(config: RunConfig, *, model_type: ModelType = ModelType.HD, random_weights: str | None = None,
              components: Components | None = None, options: BenchOptions = BenchOptions(),
              log: Log | None = None) -> dict[str, Any]:
    """Run one try-on call with `config` (and optionally the original's) and return a report dict: machine,
    versions, config, load time, the memory plan, per-stage times and s/it, peak memory measured vs estimated,
    and (optionally) ours/original ratios and FLOPs per step.

    Models, from the model owner (ootd/models/): `random_weights` ("full" or "tiny"), `components` already built
    (the matrix run reuses them), each handed to it as a source, or else the checkpoints tree of `config`. The
    speed modes' channels_last and compile apply to ours only; the original formulation runs in the default
    layout, eagerly. `log` gets one line per finished part.
    """
    say = log or (lambda line: logger.info("%s", line))
    if random_weights is not None and components is not None:
        raise UsageError("give random weights or components, not both")
    if options.threads is not None:  # the runtime applies the config's count
        config = replace(config, threads=options.threads)
    models = bench_models(config, random_weights, components)
    runtime = models.runtime()  # before the weights are loaded: the plan's budget is what is free now
    other = _original_precision(options, runtime)
    if other is not None and (components is not None or options.step_repeats > 0):
        raise UsageError("the original formulation in another precision needs models of its own: give random "
                         "weights or checkpoints (not built components), and no step repeats")
    report: dict[str, Any] = {"machine": machine(runtime.device), "versions": versions(),
                              "config": _config_report(config, runtime, model_type, random_weights, components,
                                                       other)}
    meter = PeakMemory(runtime.device.torch_device)
    report["memory_before_load"] = meter.current()
    t = time.perf_counter()
    pipe = models.pipeline(model_type)
    report["load_seconds"] = time.perf_counter() - t
    say(f"models ready in {report['load_seconds']:.1f} s")
    bench = _Bench(pipe, meter, config.sampling, say)
    bench.plan(report, config)
    _measure(bench, report, config, options, models, other, runtime)
    if options.count_flops:
        report["flops"] = _flops(dict(bench.components.unet_vton.config), options.flops_samples,
                                 options.flops_resolution.size, config.sampling.guidance, say)
    return report


def bench_models(config: RunConfig, random_weights: str | None, components: Components | None) -> Models:
    """The benchmark's model owner: the config's runtime, its networks from the checkpoints or, handed in as a
    source, random weights built for each precision asked (seeded by the config's seed) or given components."""
    from ootd.app.tryon.loader import models_for
    from ootd.models import ModelSource

    seed = config.sampling.seed or 0
    if random_weights is not None:
        return models_for(config, source=ModelSource(components=lambda model_type, precision, device:
                                                     build_random_components(random_weights, precision, device,
                                                                             seed)))
    if components is not None:
        return models_for(config, source=ModelSource(components=lambda model_type, precision, device: components))
    return models_for(config)


def _measure(bench: _Bench, report: dict[str, Any], config: RunConfig, options: BenchOptions, models: Models,
             other: Precision | None, runtime: Runtime) -> None:
    """Ours, the original formulation (in its own precision: on its own models, ours let go first) and the
    alternating step comparison, as the options ask."""
    if options.run_ours:
        bench.ours(report, warmup=options.warmup, profile=options.profile)
        if options.save_images is not None:
            report["images_saved"] = _save_images(bench.images, Path(options.save_images))
    if options.compare_original:
        if other is not None:  # ours' models go before the original's are loaded
            model_type = bench.pipe.model_type
            bench.release()
            models.release()
            t = time.perf_counter()
            bench.use(models.components(model_type, other), other)
            bench.say(f"the original's {dtype_name(other.unet)} models ready in {time.perf_counter() - t:.1f} s")
        bench.original(report, config, warmup=options.warmup, profile=options.profile)
    if options.step_repeats > 0:
        bench.compare_steps(report, config, options.step_repeats, runtime.speed)


def _config_report(config: RunConfig, runtime: Runtime, model_type: ModelType, random_weights: str | None,
                   components: Components | None, other: Precision | None) -> dict[str, Any]:
    sampling, precision = config.sampling, runtime.precision
    return {"checkpoints": None if random_weights or components else str(config.checkpoints),
            "random_weights": random_weights, "model_type": model_type.value, "dtype": str(precision.unet),
            "vae_dtype": str(precision.vae), "attention": config.attention.value,
            "resolution": list(sampling.resolution.size), "num_samples": sampling.num_samples,
            "steps": sampling.steps, "guidance_scale": sampling.guidance_scale, "seed": sampling.seed,
            "scheduler": sampling.scheduler.value, "cache_interval": config.speed.feature_cache.interval,
            "token_merge": config.speed.token_merge.ratio, "quantize": config.speed.quantize.value,
            "max_memory": config.max_memory, "channels_last": runtime.speed.channels_last,
            "vae_channels_last": runtime.speed.vae_channels_last, "compile": runtime.speed.compile,
            "original_dtype": str((other or precision).unet)}


def _original_precision(options: BenchOptions, runtime: Runtime) -> Precision | None:
    """The original formulation's precision where it is not ours (None: the same)."""
    if not options.compare_original or options.original_precision is None:
        return None
    chosen = choose_precision(runtime.device, options.original_precision.value, runtime.profile)
    return None if chosen.dtypes() == runtime.precision.dtypes() else chosen


class _Bench:
    """One benchmark's pipeline (from the owner), its networks, device and synthetic inputs; fills the report
    part by part."""

    def __init__(self, pipe: TryOnPipeline, meter: PeakMemory, sampling: SamplingSettings, say: Log) -> None:
        self.pipe: TryOnPipeline | None = pipe
        self.components: Components = pipe.components
        self.model_type, self.info, self.precision = pipe.model_type, pipe.device, pipe.precision
        self.attention_fn = pipe.attention
        self.meter, self.sampling, self.say = meter, sampling, say
        self.resolution = sampling.resolution.size
        self.person, self.garment, self.mask = synthetic_inputs(seed=sampling.seed or 0)
        self.images: list[Image.Image] = []  # ours, to compare the original's with
        self.estimate: dict[str, int] = {}

    def release(self) -> None:
        """Let go of the models (ours' pipeline too), before other ones are loaded."""
        self.components = self.pipe = None  # type: ignore[assignment]

    def use(self, components: Components, precision: Precision) -> None:
        """Other models, for the original formulation in another precision."""
        self.components, self.precision = components, precision

    def plan(self, report: dict[str, Any], config: RunConfig) -> None:
        """The memory plan of the call (into the report), made by the pipeline's own residency."""
        assert self.pipe is not None
        sampling = config.sampling
        plan = self.pipe.residency.make_plan(self.resolution, sampling.num_samples, sampling.guidance)
        report["plan"] = plan.to_dict()
        report["plan_text"] = plan.explain()
        self.say(plan.explain())
        self.estimate = plan.estimate
        apply_plan_to_vae(self.components.vae, plan)
        report["memory_after_load"] = self.meter.current()

    def ours(self, report: dict[str, Any], *, warmup: bool, profile: bool) -> None:
        s, pipe = self.sampling, self.pipe
        assert pipe is not None

        def run(steps: int = s.steps, clock: StepClock | None = None) -> Any:
            return pipe(self.person, self.garment, "upper", mask=self.mask, num_samples=s.num_samples,
                        steps=steps, guidance_scale=s.guidance_scale, seed=s.seed, resolution=s.resolution,
                        scheduler=s.scheduler, callback=clock)

        if warmup:
            run(steps=1)
        with StepClock(self.components.unet_vton) as clock:
            result, report["ours"], peaks = self._measured(lambda: _timed_result(partial(run, clock=clock)))
        report["ours"].update(steps_cpu=clock.cpu, s_per_it_cpu=_median(clock.cpu))
        self.images = result.images
        self.say(_timing_line("ours", report["ours"]))
        report["memory"] = {
            "kind": self.meter.kind, "estimated_peak": self.estimate["peak"],
            "measured_peak": report["ours"]["peak_memory"],
            "stages": {s: {"estimated": self.estimate[s], "measured": peaks.get(s)} for s in STAGES},
        }
        describe = getattr(self.attention_fn, "describe", None)
        report["attention_used"] = describe() if callable(describe) else str(self.attention_fn)
        if profile:
            report["ours"]["profile"] = profile_step(lambda: run(steps=1))

    def original(self, report: dict[str, Any], config: RunConfig, *, warmup: bool, profile: bool) -> None:
        s = config.sampling
        run = partial(run_original, self.components, self.model_type, self.info, self.precision, self.person,
                      self.garment, self.mask, "upper", num_samples=s.num_samples,
                      guidance_scale=s.guidance_scale, seed=s.seed, scheduler=s.scheduler.value,
                      resolution=s.resolution.size)
        if warmup:
            run(steps=1)
        images, report["original"], _ = self._measured(lambda: run(steps=s.steps))
        self.say(_timing_line("original", report["original"]))
        if "ours" in report:
            report["ratio"] = _ratios(report["ours"], report["original"])
            report["images_max_abs_diff"] = _max_abs_diff(self.images, images)
            self.say("original / ours: " + ", ".join(f"{k} {v:.2f}x" for k, v in report["ratio"].items()))
        if profile:
            report["original"]["profile"] = profile_step(lambda: run(steps=1))

    def compare_steps(self, report: dict[str, Any], config: RunConfig, repeats: int, speed: SpeedOptions) -> None:
        self.say(f"alternating try-on UNet calls, ours vs original, {repeats} each")
        sc = report["steps_compare"] = compare_steps(
            self.components, self.info, self.precision, resolution=self.resolution,
            num_samples=config.sampling.num_samples, guidance=config.sampling.guidance, repeats=repeats,
            attention=self.attention_fn, speed=speed, log=self.say)
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
        summary.update(wall=wall, cpu=cpu, stages=record.to_dict(), stage_cpu=stage_cpu(record))
        summary["peak_memory"] = max([self.meter.read(), *record.peaks.values()])
        return result, summary, record.peaks


def _save_images(images: Sequence[Image.Image], folder: Path) -> list[str]:
    from ootd.imaging.atomic import check_output_dir, save_png_atomic

    check_output_dir(folder)
    paths = [folder / f"sample_{i}.png" for i in range(len(images))]
    for image, path in zip(images, paths, strict=True):
        save_png_atomic(image, path, {}, overwrite=True)
    return [str(p) for p in paths]


def _timed_result(run: Callable[..., Any]) -> tuple[Any, dict[str, Any]]:
    result = run()
    return result, result.timings.to_json(total=result.timings.total)


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
    line = f"{label}: {', '.join(parts)}; steps [{steps}] s, {s['s_per_it']:.3f} s/it; peak {peak:.2f} GiB"
    cpu = ", ".join(f"{k} {v:.2f}s" for k, v in s.get("stage_cpu", {}).items())
    steps_cpu = " ".join(f"{x:.2f}" for x in s.get("steps_cpu", []))
    return f"{line}; CPU: {cpu}, call {s['cpu']:.2f}s" + (f"; steps [{steps_cpu}] s" if steps_cpu else "")


def _summary(timings: dict[str, Any]) -> dict[str, Any]:
    steps = [float(s) for s in timings.get("steps", [])]
    out = {k: float(v) for k, v in timings.items() if k != "steps"}
    if "encode" not in out:  # the pipeline times the person and garment encodes separately
        out["encode"] = sum(v for k, v in out.items() if k.startswith("encode"))
    out["steps"] = steps
    out["s_per_it"] = _median(steps)
    return out


def _median(steps: Sequence[float]) -> float:
    """The median step, leaving out the first of more than two (it pays for kernel selection / warm-up)."""
    timed = steps[1:] if len(steps) > 2 else steps
    return statistics.median(timed) if timed else float("nan")


def _median_step(run: dict[str, Any], kind: str) -> float:
    """Median seconds of one try-on UNet call (the bulk of a step), wall or CPU, from the stage record."""
    return _median(run["stages"][kind].get("denoise", []))


def _max_abs_diff(a: Sequence[Image.Image], b: Sequence[Image.Image]) -> float:
    return max(float(np.abs(np.asarray(x, dtype=np.float32) - np.asarray(y, dtype=np.float32)).max()) / 255.0
               for x, y in zip(a, b, strict=True))

