"""Measuring helpers of the benchmark: peak memory (GPU allocations or the CPU resident set), per-stage wall
and CPU time through forward hooks, a torch.profiler table, and a description of the machine."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ootd.hardware.device import DeviceInfo
from ootd.weights.loading import Components


class PeakMemory:
    """Peak memory of this process: GPU allocations (max_memory_allocated) or CPU resident set (VmHWM,
    reset through /proc/self/clear_refs; ru_maxrss where that is not possible, which cannot be reset)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            self.kind = "cuda_max_memory_allocated"
        elif _status_bytes("VmHWM") is not None and _reset_hwm():
            self.kind = "rss_vmhwm"
        else:
            self.kind = "ru_maxrss_not_resettable"

    def reset(self) -> None:
        if self.kind.startswith("cuda"):
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.kind == "rss_vmhwm":
            _reset_hwm()

    def read(self) -> int:
        if self.kind.startswith("cuda"):
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        if self.kind == "rss_vmhwm":
            return int(_status_bytes("VmHWM") or 0)
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def current(self) -> int:
        if self.kind.startswith("cuda"):
            return int(torch.cuda.memory_allocated(self.device))
        return _status_bytes("VmRSS") or 0


def _status_bytes(key: str) -> int | None:
    """A kB figure of /proc/self/status in bytes (None where there is no such file)."""
    try:
        match = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def _reset_hwm() -> bool:
    """Reset the resident-set high-water mark; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class StageRecord:
    """Per stage (a module's forward calls): peak memory, and wall and process-CPU seconds of every call."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def to_dict(self) -> dict[str, Any]:
        return {"peak_memory": dict(self.peaks), "wall": dict(self.wall), "cpu": dict(self.cpu)}


@contextlib.contextmanager
def stage_meter(meter: PeakMemory, modules: dict[str, torch.nn.Module]) -> Iterator[StageRecord]:
    """Measure each named module's forward calls: peak memory (reset before, read after), wall time and the
    process's CPU time (which, unlike wall time, hardly changes when other processes share the CPU)."""
    record = StageRecord()
    handles = []
    started: dict[str, tuple[float, float]] = {}
    for label, module in modules.items():
        def pre(_module, _args, _label=label) -> None:  # noqa: ANN001
            meter.reset()
            started[_label] = (time.perf_counter(), time.process_time())

        def post(_module, _args, _out, _label=label) -> None:  # noqa: ANN001
            if meter.device.type == "cuda":
                torch.cuda.synchronize(meter.device)
            wall0, cpu0 = started.pop(_label)
            record.wall.setdefault(_label, []).append(time.perf_counter() - wall0)
            record.cpu.setdefault(_label, []).append(time.process_time() - cpu0)
            record.peaks[_label] = max(record.peaks.get(_label, 0), meter.read())

        # always_call: the garment UNet stops early by raising from a hook once its features are captured
        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post, always_call=True)]
    try:
        yield record
    finally:
        for handle in handles:
            handle.remove()


def stage_modules(c: Components) -> dict[str, torch.nn.Module]:
    """The module whose forward calls make up each stage of a try-on call (the text encoder's own label: its
    time belongs to conditioning, see `stage_cpu`)."""
    modules = {"conditioning": c.image_encoder, "encode": c.vae.encoder, "garment_unet": c.unet_garm,
               "denoise": c.unet_vton, "decode": c.vae.decoder}
    if c.text_encoder is not None:
        modules["conditioning_text"] = c.text_encoder
    return modules


def stage_cpu(record: StageRecord) -> dict[str, float]:
    """Process-CPU seconds per stage of one call (the text encoder's counted in conditioning)."""
    out = {stage: sum(calls) for stage, calls in record.cpu.items() if stage != "conditioning_text"}
    if "conditioning_text" in record.cpu:
        out["conditioning"] = out.get("conditioning", 0.0) + sum(record.cpu["conditioning_text"])
    return out


class StepClock:
    """A step callback: wall and process-CPU seconds of every denoising step, each from the end of the one
    before (the first from the try-on UNet's first call): the UNet, the scheduler and the inpainting blend.
    With one torch thread the CPU seconds are the work done, whatever else shares the machine."""

    def __init__(self, unet: torch.nn.Module) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self._start: tuple[float, float] | None = None
        self._unet = unet
        self._handle: Any = None

    def __enter__(self) -> StepClock:
        def first_call(_module, _args) -> None:  # noqa: ANN001
            if self._start is None:
                self._start = (time.perf_counter(), time.process_time())
        self._handle = self._unet.register_forward_pre_hook(first_call)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()

    def __call__(self, step: int, t: torch.Tensor, latents: torch.Tensor) -> None:
        if latents.device.type == "cuda":
            torch.cuda.synchronize(latents.device)
        now = (time.perf_counter(), time.process_time())
        if self._start is not None:
            self.wall.append(now[0] - self._start[0])
            self.cpu.append(now[1] - self._start[1])
        self._start = now


def profile_step(run: Callable[[], Any], row_limit: int = 15) -> str:
    """The top operators (self CPU/GPU time) of `run()` under torch.profiler, as a table."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=False) as prof:
        run()
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=row_limit)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, for log lines ("?" where the system has none)."""
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def versions() -> dict[str, str]:
    import diffusers
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "diffusers": diffusers.__version__,
            "transformers": transformers.__version__, "cuda": str(torch.version.cuda), "hip": str(torch.version.hip)}


def machine(device: DeviceInfo) -> dict[str, Any]:
    """The device, the CPU and its load, for the report's header."""
    info: dict[str, Any] = {
        "device_type": device.type, "device_name": device.name, "arch": device.arch, "vendor": device.vendor,
        "total_memory": device.total_memory, "free_memory": device.free_memory, "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    with contextlib.suppress(OSError):
        info["load_average"] = list(os.getloadavg())
    with contextlib.suppress(OSError, StopIteration):
        text = Path("/proc/cpuinfo").read_text()
        info["cpu_model"] = next(line.split(":", 1)[1].strip() for line in text.splitlines()
                                 if line.startswith("model name"))
    return info
