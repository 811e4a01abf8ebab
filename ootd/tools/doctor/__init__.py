"""`ootd doctor`: everything that decides whether (and how fast) a try-on can run here, with the fix for each.

Each item is detected by a small function that takes its inputs (versions, a /dev folder, group names, an
import function, probe results) so tests can feed fakes; `collect_report` gathers the real inputs. The items
live by subject: report.py (Item, Report), system.py (Python, torch, GPUs, environment, /dev),
kernels.py (attention kernels, ONNX Runtime), checkpoints.py.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path

from ootd.hardware.torch_builds import detect_gpus as detect_machine_gpus
from ootd.hardware.torch_builds import torchvision_mismatch
from ootd.tools.doctor.checkpoints import architecture_items, checkpoint_items, cpu_memory_items
from ootd.tools.doctor.kernels import (
    flash_attn_items,
    flash_attn_probe,
    onnxruntime_items,
    sdpa_flags,
    sdpa_items,
    sdpa_probe,
)
from ootd.tools.doctor.report import FAIL, OK, WARN, Item, Report, Status
from ootd.tools.doctor.system import (
    GROUP_FIX,
    GpuInfo,
    TorchBuild,
    configured_groups,
    detect_gpus,
    detect_torch,
    device_access_items,
    env_items,
    gpu_items,
    python_item,
    session_groups,
    torch_fit_items,
    torch_items,
    torchvision_items,
)
from ootd.weights.verify import verify_checkpoints

__all__ = [
    "FAIL", "GROUP_FIX", "OK", "WARN", "GpuInfo", "Item", "Report", "Status", "TorchBuild", "architecture_items",
    "checkpoint_items", "cpu_memory_items",
    "collect_report", "device_access_items", "env_items", "flash_attn_items", "gpu_items", "onnxruntime_items",
    "python_item", "sdpa_items", "torch_fit_items", "torch_items", "torchvision_items",
]


def collect_report(
    checkpoints: Path,
    *,
    models: Sequence[str] = ("hd", "dc"),
    load_checkpoints: bool = True,
    run_kernels: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Report:
    """Gather every item on this machine. `run_kernels=False` skips the tiny GPU kernel runs."""
    environ = os.environ if environ is None else environ
    report = Report()
    add = report.items.extend
    add([python_item()])

    build = detect_torch()
    add(torch_items(build))
    add(torch_fit_items(build, detect_machine_gpus(), importlib.util.find_spec("torchvision") is not None,
                        (session_groups(), configured_groups())))
    if build.version:
        add(torchvision_items(torchvision_mismatch()))
    gpus, gpu_errors = detect_gpus(build) if build.version else ([], [])
    add(gpu_items(gpus, gpu_errors))
    add(env_items(environ, gpus))

    if platform.system() == "Linux":
        add(
            device_access_items(
                Path("/dev"), session_groups(), configured_groups(), hip_build=bool(build.hip)
            )
        )

    on_gpu = bool(gpus) and run_kernels
    if build.version:
        add(flash_attn_items(kernel_probe=flash_attn_probe if on_gpu else None, gpu=bool(gpus)))
        probe = None
        if on_gpu:
            try:
                probe = sdpa_probe()
            except Exception as exc:
                probe = {"probe": f"{type(exc).__name__}: {exc}"}
        add(sdpa_items(sdpa_flags(), probe, bool(build.hip), environ))
    add(onnxruntime_items())

    checks = verify_checkpoints(Path(checkpoints), models, load=load_checkpoints)
    items, report.models_available = checkpoint_items(checks, Path(checkpoints), list(models))
    add(items)
    if report.models_available:
        add(architecture_items(Path(checkpoints), report.models_available, count_params=load_checkpoints))
    if not gpus:
        add(cpu_memory_items())
    return report
