"""Where a VAE encode or decode spends its time: process CPU seconds per kind of module and resolution
(3x3 and 1x1 convolutions, GroupNorm, SiLU, the mid block's attention, upsampling, the residual adds), and
optionally what oneDNN ran inside the convolutions (its kernels and layout reorders, from its verbose log).

CPU time, not wall time: it is what other processes on a shared machine inflate least. The split comes from
forward hooks with exclusive times (a module's own time less that of the hooked modules inside it), so the
parts add up to the whole call.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


def _kind(module: torch.nn.Module) -> str | None:
    """The category of a module whose time is recorded (None: its time goes to the module around it)."""
    name = type(module).__name__
    if isinstance(module, torch.nn.Conv2d):
        return f"conv{module.kernel_size[0]}x{module.kernel_size[1]}"
    if isinstance(module, torch.nn.GroupNorm):
        return "groupnorm"
    if isinstance(module, torch.nn.SiLU):
        return "silu"
    return {"Attention": "attention", "Upsample2D": "upsample", "Downsample2D": "downsample pad",
            "ResnetBlock2D": "residual add", "Encoder": "rest", "Decoder": "rest"}.get(name)


@dataclass
class ModuleTimes:
    """CPU seconds and calls per (kind, resolution) of one run, and the run's totals."""

    cpu: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    total_cpu: float = 0.0
    wall: float = 0.0

    def add(self, key: str, seconds: float) -> None:
        self.cpu[key] = self.cpu.get(key, 0.0) + seconds
        self.calls[key] = self.calls.get(key, 0) + 1

    def by_kind(self) -> dict[str, float]:
        """CPU seconds per kind of module, every resolution together."""
        kinds: dict[str, float] = {}
        for key, seconds in self.cpu.items():
            kind = key.rsplit(" @", 1)[0]
            kinds[kind] = kinds.get(kind, 0.0) + seconds
        return kinds

    def to_dict(self) -> dict[str, Any]:
        return {"cpu": dict(sorted(self.cpu.items(), key=lambda kv: -kv[1])), "calls": dict(self.calls),
                "by_kind": dict(sorted(self.by_kind().items(), key=lambda kv: -kv[1])),
                "total_cpu": self.total_cpu, "wall": self.wall}


@contextlib.contextmanager
def module_times(root: torch.nn.Module) -> Iterator[ModuleTimes]:
    """Record exclusive process CPU time per (kind, input resolution) of every categorised module in `root`
    (the attention module as a whole: nothing inside it is split further)."""
    times = ModuleTimes()
    stack: list[list[float]] = []  # [start, time of hooked children]
    handles = []

    def hooked(module: torch.nn.Module, inside_attention: bool) -> Iterator[tuple[torch.nn.Module, str]]:
        kind = None if inside_attention else _kind(module)
        if kind is not None:
            yield module, kind
        for child in module.children():
            yield from hooked(child, inside_attention or kind == "attention")

    for module, kind in hooked(root, False):
        def pre(_module, args, _kind=kind) -> None:  # noqa: ANN001
            stack.append([time.process_time(), 0.0])

        def post(_module, args, _out, _kind=kind) -> None:  # noqa: ANN001
            start, children = stack.pop()
            spent = time.process_time() - start
            if stack:
                stack[-1][1] += spent
            x = args[0] if args and isinstance(args[0], torch.Tensor) else None
            where = f" @{x.shape[-1]}x{x.shape[-2]}" if x is not None and x.dim() == 4 else ""
            times.add(f"{_kind}{where}", spent - children)

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        yield times
    finally:
        for handle in handles:
            handle.remove()


def profile_call(root: torch.nn.Module, run: Callable[[], Any]) -> tuple[ModuleTimes, Any]:
    """`run()` once with `module_times(root)` on: the CPU time split, the total CPU time and the wall time, and
    what `run()` returned (the hooks only read the clock)."""
    with module_times(root) as times:
        wall, cpu = time.perf_counter(), time.process_time()
        result = run()
        times.wall, times.total_cpu = time.perf_counter() - wall, time.process_time() - cpu
    # the part of the call outside every hooked module (posterior, scaling, the top-level convolutions' callers)
    times.add("outside the hooked modules", max(0.0, times.total_cpu - sum(times.cpu.values())))
    return times, result


_VERBOSE_EXEC = re.compile(r"^onednn_verbose,(?:v1,)?(?:primitive,)?exec,cpu,([^,]+),([^,]+),.*,([0-9.]+)\s*$")


@contextlib.contextmanager
def onednn_log() -> Iterator[dict[str, dict[str, float]]]:
    """While active, oneDNN's verbose log goes to a file (not stdout); afterwards the dict holds, per
    `primitive implementation` (e.g. `convolution brg_conv_fwd:avx512_core_amx`, `reorder jit:uni`), its
    calls and milliseconds. oneDNN's times are wall clock: read them as shares of one run."""
    summary: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryFile(mode="w+") as log:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                yield summary
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        for line in log:
            match = _VERBOSE_EXEC.match(line.strip())
            if match:
                primitive, impl, ms = match.groups()
                entry = summary.setdefault(f"{primitive} {impl}", {"calls": 0, "ms": 0.0})
                entry["calls"] += 1
                entry["ms"] += float(ms)


@dataclass(frozen=True)
class Variant:
    """A way to run the VAE: dtype and memory layout, e.g. `bf16-nhwc`."""

    dtype: str  # fp32 | bf16
    layout: str  # nchw | nhwc

    @classmethod
    def parse(cls, word: str) -> Variant:
        dtype, _, layout = word.partition("-")
        if dtype not in ("fp32", "bf16") or layout not in ("nchw", "nhwc"):
            raise ValueError(f"bad variant {word!r}: use <fp32|bf16>-<nchw|nhwc>, e.g. bf16-nhwc")
        return cls(dtype, layout)

    @property
    def name(self) -> str:
        return f"{self.dtype}-{self.layout}"

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.dtype == "bf16" else torch.float32


def _faults() -> tuple[int, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt, usage.ru_stime


def profile_vae(vae: torch.nn.Module, image: torch.Tensor, variants: list[Variant], *, stages: tuple[str, ...] =
                ("encode", "decode"), onednn: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Encode `image` (1, 3, H, W in [-1, 1]) and decode its latents with `vae` in each variant: per variant and
    stage the CPU split (`ModuleTimes`), minor page faults and system time of the call, optionally oneDNN's
    summary, and how far its output is from the first variant's and from the one before it (max / mean abs, and
    in 8-bit pixels for the decode). Each stage runs once untimed first (oneDNN builds its primitives then)."""
    from ootd.speedups.execution import as_memory_format, set_memory_format

    report: dict[str, Any] = {"variants": {}, "threads": torch.get_num_threads()}
    outputs: dict[str, dict[str, torch.Tensor]] = {}
    with torch.inference_mode():
        latents = vae.float().encode(image.float()).latent_dist.mode()  # the decode's input, the same for all
        for variant in variants:
            vae.to(variant.torch_dtype)
            set_memory_format([vae], variant.layout == "nhwc")
            x = {"encode": as_memory_format(image.to(variant.torch_dtype), variant.layout == "nhwc"),
                 "decode": as_memory_format(latents.to(variant.torch_dtype), variant.layout == "nhwc")}
            runs = {"encode": (vae.encoder, lambda x=x: vae.encode(x["encode"]).latent_dist.mode()),
                    "decode": (vae.decoder, lambda x=x: vae.decode(x["decode"]).sample)}
            entry: dict[str, Any] = {}
            for stage in stages:
                root, run = runs[stage]
                run()
                faults, system = _faults()
                times, out = profile_call(root, run)
                after = _faults()
                entry[stage] = {**times.to_dict(), "page_faults": after[0] - faults, "system_cpu": after[1] - system}
                if onednn:
                    with onednn_log() as summary:
                        run()
                    entry[stage]["onednn"] = summary
                outputs.setdefault(variant.name, {})[stage] = out.float()
                log(f"{variant.name} {stage}: {times.total_cpu:.2f} s CPU ({entry[stage]['system_cpu']:.2f} s system, "
                    f"{entry[stage]['page_faults']} page faults), {times.wall:.2f} s wall")
            report["variants"][variant.name] = entry
    names = [v.name for v in variants]
    for i, name in enumerate(names):
        for stage, out in outputs[name].items():
            report["variants"][name][stage]["vs_first"] = _difference(out, outputs[names[0]][stage], stage)
            previous = outputs[names[max(0, i - 1)]][stage]
            report["variants"][name][stage]["vs_previous"] = _difference(out, previous, stage)
    return report


def _difference(out: torch.Tensor, ref: torch.Tensor, stage: str) -> dict[str, float]:
    diff = (out - ref).abs()
    result = {"max_abs": float(diff.max()), "mean_abs": float(diff.mean())}
    if stage == "decode":  # as the pipeline's post-processing turns it into 8-bit pixels
        def pixels(t: torch.Tensor) -> torch.Tensor:
            return ((t / 2 + 0.5).clamp(0, 1) * 255).round()
        levels = (pixels(out) - pixels(ref)).abs()
        result.update(max_pixel=float(levels.max()), mean_pixel=float(levels.mean()))
    return result


def _diff_cell(d: dict[str, float]) -> str:
    levels = f" ({d['max_pixel']:.0f} / {d['mean_pixel']:.3f} levels)" if "max_pixel" in d else ""
    return f"{d['max_abs']:.3g} / {d['mean_abs']:.3g}{levels}"


def profile_table(report: dict[str, Any], top: int = 8) -> list[str]:
    """The report as Markdown: per stage, CPU seconds by kind of module for every variant side by side, then the
    largest (kind, resolution) entries, page faults, oneDNN's kernels and the difference from the first variant."""
    names = list(report["variants"])
    lines: list[str] = []
    stages = [s for s in ("encode", "decode") if s in report["variants"][names[0]]]
    for stage in stages:
        runs = [report["variants"][n][stage] for n in names]
        kinds = sorted({k for r in runs for k in r["by_kind"]}, key=lambda k: -runs[0]["by_kind"].get(k, 0.0))
        lines += [f"\n{stage}, CPU seconds ({report['threads']} thread(s))\n",
                  "| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for kind in kinds:
            cells = [f"{r['by_kind'].get(kind, 0.0):.2f} ({100 * r['by_kind'].get(kind, 0.0) / r['total_cpu']:.0f}%)"
                     for r in runs]
            lines.append(f"| {kind} | " + " | ".join(cells) + " |")
        lines.append("| **total** | " + " | ".join(f"**{r['total_cpu']:.2f}**" for r in runs) + " |")
        lines.append("| of which system (page faults) | " + " | ".join(
            f"{r['system_cpu']:.2f} ({r['page_faults']})" for r in runs) + " |")
        lines.append("| wall | " + " | ".join(f"{r['wall']:.2f}" for r in runs) + " |")
        for key, label in (("vs_first", f"vs {names[0]}"), ("vs_previous", "vs the column before")):
            lines.append(f"| {label}: max / mean abs | " + " | ".join(_diff_cell(r[key]) for r in runs) + " |")
        for name, run in zip(names, runs, strict=True):
            biggest = ", ".join(f"{k} {v:.2f}" for k, v in list(run["cpu"].items())[:top])
            lines.append(f"\n- {name}, largest: {biggest}")
            for impl, entry in sorted(run.get("onednn", {}).items(), key=lambda kv: -kv[1]["ms"]):
                lines.append(f"  - oneDNN {impl}: {entry['calls']} calls, {entry['ms'] / 1000:.2f} s")
    return lines
