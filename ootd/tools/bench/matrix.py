"""`run_matrix`: every (precision, attention backend) pair on the same random weights, each a `run_bench` run,
plus the original formulation once per precision and optional speed-option runs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from ootd.app.tryon.config import RunConfig
from ootd.attention import build_attention
from ootd.errors import UsageError
from ootd.hardware.device import DeviceInfo
from ootd.hardware.policy import Precision, choose_precision
from ootd.models import Models
from ootd.settings import AttentionName, PrecisionName
from ootd.tools.bench.drivers import BenchOptions, Log, run_bench
from ootd.tools.bench.flops import count_step_flops
from ootd.tools.bench.profiling import machine, versions
from ootd.tools.bench.random_weights import build_random_components
from ootd.weights.loading import Components

logger = logging.getLogger(__name__)


SPEED_VARIANTS = ("channels_last", "compile")


def run_matrix(
    config: RunConfig,
    *,
    random_weights: str = "full",
    dtypes: Sequence[str] = ("bf16", "fp16"),
    attentions: Sequence[str] = ("flash", "sdpa", "chunked"),
    original: bool = True,
    count_flops: bool = True,
    time_limit: float | None = None,
    warmup: bool = True,
    speed_variants: Sequence[str] = (),
    log: Log | None = None,
    on_update: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every (dtype, attention backend) pair on the same random weights, plus the original formulation per
    dtype: s/it, whole call and peak memory next to the estimate, each with `config`'s device and sampling.
    Backends that cannot run here are recorded as skipped; runs that would start after `time_limit` seconds are
    skipped too. `speed_variants` ("channels_last", "compile") add, per dtype, a run of the first backend that ran
    with that option on (the compile run comes last: its compiled UNet stays with the components). `on_update`
    gets the report so far after every run (to save partial results if the whole is cut short)."""
    unknown = set(speed_variants) - set(SPEED_VARIANTS)
    if unknown:
        raise UsageError(f"unknown speed variants {sorted(unknown)}: use {', '.join(SPEED_VARIANTS)}")
    sampling = config.sampling
    res, num_samples, steps = sampling.resolution.size, sampling.num_samples, sampling.steps
    info = Models(None, config.runtime_request).runtime().device  # as run_bench's owner resolves it
    matrix = _Matrix(info, config, warmup, time_limit, log, on_update)
    matrix.out["config"] = {"random_weights": random_weights, "resolution": list(res), "num_samples": num_samples,
                            "steps": steps, "warmup": warmup}
    if count_flops:
        flops = count_step_flops(num_samples=num_samples, resolution=res)
        flops["ratio_step"] = flops["original_step"] / flops["ours_step"]
        matrix.out["flops"] = flops
    for dtype in dtypes:
        try:
            precision = choose_precision(info, dtype)
        except Exception as exc:  # noqa: BLE001 - any refusal is recorded, not fatal
            matrix.out["skipped"].append({"dtype": dtype, "reason": str(exc)})
            continue
        components = build_random_components(random_weights, precision, info.torch_device)
        matrix.one_dtype(components, dtype, precision, attentions, [v for v in SPEED_VARIANTS if v in speed_variants],
                         original)
        del components
        if info.type == "cuda":
            torch.cuda.empty_cache()
    matrix.update()
    return matrix.out


class _Matrix:
    """The matrix report being filled, and the settings every run of it shares."""

    def __init__(self, info: DeviceInfo, config: RunConfig, warmup: bool, time_limit: float | None,
                 log: Log | None, on_update: Callable[[dict[str, Any]], None] | None) -> None:
        self.start = time.perf_counter()
        self.info, self.config, self.warmup = info, config, warmup
        self.time_limit, self.on_update = time_limit, on_update
        self.say = log or (lambda line: logger.info("%s", line))
        self.out: dict[str, Any] = {"machine": machine(info), "versions": versions(), "runs": [], "skipped": []}

    def update(self) -> None:
        self.out["seconds"] = time.perf_counter() - self.start
        if self.on_update is not None:
            self.on_update(self.out)

    def one_dtype(self, components: Components, dtype: str, precision: Precision, attentions: Sequence[str],
                  speed_variants: Sequence[str], original: bool) -> None:
        """Each backend in turn (the original formulation with the first that runs), then each speed option on
        the first backend that ran."""
        ran: list[str] = []
        first = True
        variants: list[tuple[str | None, dict[str, bool]]] = [(a, {}) for a in attentions]
        variants += [(None, {v: True}) for v in speed_variants]
        for attention, options in variants:
            if attention is None:  # a speed option, on the first backend that ran
                if not ran:
                    continue
                attention = ran[0]
            if self._run(components, dtype, precision, attention, options, original and first):
                first = False
                if not options:
                    ran.append(attention)
                self.update()

    def _run(self, components: Components, dtype: str, precision: Precision, attention: str,
             options: dict[str, bool], original: bool) -> bool:
        """One run into the report, or one skipped entry; True if it ran."""
        skip = {"dtype": dtype, "attention": attention}
        if self.time_limit is not None and time.perf_counter() - self.start > self.time_limit:
            self.out["skipped"].append({**skip, **options, "reason": "time limit"})
            return False
        try:
            build_attention(attention, self.info, precision.unet, 1 << 30)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run here is recorded, not fatal
            self.out["skipped"].append({**skip, "reason": str(exc)})
            self.say(f"{dtype} {attention}: skipped ({exc})")
            return False
        self.say(f"{dtype} {attention}{''.join(f' {k}' for k in options)} ...")
        try:
            speed = replace(self.config.speed, channels_last=options.get("channels_last", False),
                            compile=options.get("compile", False))
            config = replace(self.config, precision=PrecisionName.parse(dtype),
                             attention=AttentionName.parse(attention), speed=speed)
            report = run_bench(config, components=components, log=self.say,
                               options=BenchOptions(compare_original=original, warmup=self.warmup))
        except torch.OutOfMemoryError as exc:
            self.out["skipped"].append({**skip, **options, "reason": f"out of memory: {exc}"})
            return False
        kept = ("ours", "original", "ratio", "memory", "plan", "images_max_abs_diff", "attention_used")
        self.out["runs"].append({**skip, "channels_last": bool(options.get("channels_last")),
                                 "compile": bool(options.get("compile")),
                                 **{k: report[k] for k in report if k in kept}})
        return True
