"""`ootd doctor`: everything that decides whether (and how fast) a try-on can run here, with the fix for each.

Each item is detected by a small function that takes its inputs (versions, a /dev folder, group names, an
import function, probe results) so tests can feed fakes; `collect_report` gathers the real inputs.
"""

from __future__ import annotations

import importlib
import logging
import os
import platform
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ootd.config import ModelType
from ootd.verify import FileCheck, verify_checkpoints

logger = logging.getLogger(__name__)

Status = Literal["ok", "warn", "fail"]
OK: Status = "ok"
WARN: Status = "warn"
FAIL: Status = "fail"

GROUP_FIX = "sudo usermod -aG render,video $USER"
GPU_GROUPS = ("render", "video")
MIN_PYTHON = (3, 11)
# Archs with native ROCm support, where HSA_OVERRIDE_GFX_VERSION only breaks things (ECOSYSTEM).
NATIVE_ROCM_ARCHS = ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1151", "gfx1200", "gfx1201")


@dataclass(frozen=True)
class Item:
    """One line of the report. `blocking` fails make `Report.can_run` false."""

    section: str
    item: str
    status: Status
    detail: str
    fix: str | None = None
    blocking: bool = False


@dataclass
class Report:
    items: list[Item] = field(default_factory=list)
    models_available: list[str] = field(default_factory=list)

    @property
    def can_run(self) -> bool:
        """False when no try-on can run at all (e.g. missing checkpoints, no ONNX Runtime)."""
        return not any(item.status == FAIL and item.blocking for item in self.items)

    @property
    def worst(self) -> Status:
        statuses = {item.status for item in self.items}
        return FAIL if FAIL in statuses else WARN if WARN in statuses else OK

    def section(self, name: str) -> list[Item]:
        return [item for item in self.items if item.section == name]


# ----------------------------------------------------------------------------------------------- python/torch


def python_item(version_info: Sequence[int] = tuple(sys.version_info[:3])) -> Item:
    version = ".".join(str(v) for v in version_info[:3])
    if tuple(version_info[:2]) < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        return Item("python", "version", FAIL, f"Python {version}", f"use Python >= {need}", blocking=True)
    return Item("python", "version", OK, f"Python {version} ({platform.python_implementation()})")


@dataclass(frozen=True)
class TorchBuild:
    version: str | None  # None: torch not importable
    cuda: str | None = None
    hip: str | None = None
    gpu_count: int = 0
    error: str | None = None  # why torch could not be imported or queried


def detect_torch() -> TorchBuild:
    try:
        import torch
    except Exception as exc:  # broken installs raise OSError (missing .so), not only ImportError
        return TorchBuild(None, error=f"{type(exc).__name__}: {exc}")
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:
        return TorchBuild(
            torch.__version__, torch.version.cuda, torch.version.hip, 0, f"{type(exc).__name__}: {exc}"
        )
    return TorchBuild(torch.__version__, torch.version.cuda, getattr(torch.version, "hip", None), count)


def torch_items(build: TorchBuild) -> list[Item]:
    if build.version is None:
        return [
            Item(
                "torch",
                "version",
                FAIL,
                f"PyTorch not importable ({build.error})",
                "install PyTorch (ROCm: the wheel from https://download.pytorch.org/whl/rocmX.Y)",
                True,
            )
        ]
    items = [Item("torch", "version", OK, f"PyTorch {build.version}")]
    if build.hip:
        items.append(Item("torch", "build", OK, f"ROCm/HIP build (HIP {build.hip})"))
    elif build.cuda:
        items.append(Item("torch", "build", OK, f"CUDA build (CUDA {build.cuda})"))
    else:
        items.append(
            Item(
                "torch",
                "build",
                WARN,
                "CPU-only build: try-ons run on the CPU (minutes per image)",
                "for an AMD GPU install the ROCm wheel (https://download.pytorch.org/whl/rocmX.Y); "
                "for NVIDIA the CUDA wheel",
            )
        )
    if (build.hip or build.cuda) and build.gpu_count == 0:
        why = f" ({build.error})" if build.error else ""
        fix = (
            "check the amdgpu driver and access to /dev/kfd and /dev/dri (see the devices section)"
            if build.hip
            else "check the NVIDIA driver (`nvidia-smi`) and CUDA_VISIBLE_DEVICES"
        )
        items.append(Item("torch", "gpus", WARN, f"GPU build but no GPU visible{why}", fix))
    return items


# ----------------------------------------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    arch: str  # gcnArchName on ROCm (e.g. gfx1100), sm_XY on CUDA
    total_memory: int | None  # bytes
    free_memory: int | None = None


def detect_gpus(build: TorchBuild) -> tuple[list[GpuInfo], list[str]]:
    """Every visible GPU, plus errors for any that could not be queried."""
    if build.gpu_count == 0:
        return [], []
    from ootd.device import detect_device

    gpus, errors = [], []
    for index in range(build.gpu_count):
        try:
            info = detect_device(f"cuda:{index}")
        except Exception as exc:
            errors.append(f"cuda:{index}: {type(exc).__name__}: {exc}")
            continue
        gpus.append(GpuInfo(index, info.name, info.arch, info.total_memory, info.free_memory))
    return gpus, errors


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**30:.1f} GiB"


def gpu_items(gpus: Sequence[GpuInfo], errors: Sequence[str] = ()) -> list[Item]:
    if not gpus and not errors:
        return [
            Item(
                "gpu",
                "devices",
                WARN,
                "no GPU: try-ons run on the CPU (minutes per image)",
                "see the torch and devices sections if this machine has a GPU",
            )
        ]
    items = []
    for gpu in gpus:
        memory = f"{_gib(gpu.total_memory)} total"
        if gpu.free_memory is not None:
            memory += f", {_gib(gpu.free_memory)} free"
        items.append(Item("gpu", f"cuda:{gpu.index}", OK, f"{gpu.name}, {gpu.arch}, {memory}"))
    for error in errors:
        items.append(Item("gpu", "query", FAIL, error, "check the GPU driver"))
    return items


def env_items(environ: Mapping[str, str], gpus: Sequence[GpuInfo]) -> list[Item]:
    """Environment settings known to hurt on some setups."""
    items = []
    override = environ.get("HSA_OVERRIDE_GFX_VERSION")
    native = [g.arch for g in gpus if g.arch in NATIVE_ROCM_ARCHS]
    if override and native:
        items.append(
            Item(
                "environment",
                "HSA_OVERRIDE_GFX_VERSION",
                WARN,
                f"set to {override} on a natively supported GPU ({native[0]}): it can break kernels",
                "unset HSA_OVERRIDE_GFX_VERSION",
            )
        )
    return items


# ----------------------------------------------------------------------------------------------- /dev access


def session_groups() -> set[str]:
    """Names of the groups this process runs with (what device permissions see now)."""
    try:
        import grp
    except ImportError:  # not a Unix system
        return set()
    names = set()
    for gid in {os.getgid(), *os.getgroups()}:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            pass
    return names


def configured_groups(user: str | None = None) -> set[str]:
    """Groups /etc/group lists the user in (may include ones added after this login began)."""
    try:
        import grp
        import pwd

        user = user or pwd.getpwuid(os.getuid()).pw_name
        names = {g.gr_name for g in grp.getgrall() if user in g.gr_mem}
        names.add(grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name)
    except (ImportError, KeyError, OSError):
        return set()
    return names


def _group_fix(groups: set[str], configured: set[str]) -> str:
    missing = [g for g in GPU_GROUPS if g not in groups]
    if missing and all(g in configured for g in missing):
        return (
            f"you are in {', '.join(missing)} in /etc/group but not in this login session: "
            "log out and back in (or run `newgrp render`)"
        )
    if missing:
        return f"{GROUP_FIX}, then log out and back in"
    return "you are in render and video; check the device file's group and mode (`ls -l`) and the udev rules"


def device_access_items(
    dev_root: Path,
    groups: Iterable[str],
    configured: Iterable[str] = (),
    hip_build: bool = False,
    access: Callable[[Path, int], bool] = lambda path, mode: os.access(path, mode),
) -> list[Item]:
    """ROCm needs read/write on /dev/kfd and /dev/dri/renderD*; the usual fix is the render/video groups."""
    groups, configured = set(groups), set(configured)
    kfd = dev_root / "kfd"
    renders = sorted((dev_root / "dri").glob("renderD*")) if (dev_root / "dri").is_dir() else []
    if not kfd.exists():
        if not hip_build:
            return []  # not an AMD GPU machine: nothing to check
        return [
            Item(
                "devices",
                str(kfd),
                FAIL,
                "missing: the amdgpu kernel driver is not loaded, or the container lacks the device",
                "load the driver (`sudo modprobe amdgpu`, install amdgpu-dkms); in Docker pass "
                "--device=/dev/kfd --device=/dev/dri",
            )
        ]
    items = []
    for node in [kfd, *renders]:
        if access(node, os.R_OK | os.W_OK):
            items.append(Item("devices", str(node), OK, "readable and writable"))
        else:
            items.append(
                Item(
                    "devices",
                    str(node),
                    FAIL,
                    "not readable/writable by this user",
                    _group_fix(groups, configured),
                )
            )
    if not renders:
        items.append(
            Item(
                "devices",
                str(dev_root / "dri" / "renderD*"),
                FAIL,
                "no render nodes",
                "check the amdgpu driver (`dmesg | grep amdgpu`); in Docker pass --device=/dev/dri",
            )
        )
    missing = [g for g in GPU_GROUPS if g not in groups]
    if missing:
        all_ok = all(item.status == OK for item in items)
        status = OK if all_ok else FAIL
        detail = f"not in group(s) {', '.join(missing)}" + (" (devices accessible anyway)" if all_ok else "")
        items.append(
            Item("devices", "groups", status, detail, None if all_ok else _group_fix(groups, configured))
        )
    else:
        items.append(Item("devices", "groups", OK, "in groups render and video"))
    return items


# ----------------------------------------------------------------------------------------------- attention


def flash_attn_items(
    import_module: Callable[[str], Any] = importlib.import_module,
    kernel_probe: Callable[[Any], str | None] | None = None,
    gpu: bool = False,
) -> list[Item]:
    """flash-attn is optional; when present on a GPU, a tiny kernel run proves it works with this torch."""
    try:
        module = import_module("flash_attn")
    except ImportError:
        if gpu:
            return [
                Item(
                    "attention",
                    "flash-attn",
                    WARN,
                    "not installed (optional: SDPA or chunked attention is used)",
                    "pip install flash-attn --no-build-isolation (ROCm: see the README)",
                )
            ]
        return [Item("attention", "flash-attn", OK, "not installed (only used on GPUs)")]
    except Exception as exc:
        return [
            Item(
                "attention",
                "flash-attn",
                WARN,
                f"installed but fails to import ({type(exc).__name__}: {exc})",
                "rebuild flash-attn against this PyTorch, or uninstall it",
            )
        ]
    version = getattr(module, "__version__", "?")
    if not gpu or kernel_probe is None:
        return [
            Item("attention", "flash-attn", OK, f"flash-attn {version} importable (kernel not run: no GPU)")
        ]
    problem = kernel_probe(module)
    if problem:
        return [
            Item(
                "attention",
                "flash-attn",
                WARN,
                f"flash-attn {version}: kernel test failed ({problem})",
                "rebuild flash-attn for this GPU "
                "(ROCm Triton backend: FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE)",
            )
        ]
    return [Item("attention", "flash-attn", OK, f"flash-attn {version}: kernel test passed")]


def flash_attn_probe(module: Any) -> str | None:
    """Run flash_attn_func once on tiny fp16 tensors and compare with the math attention."""
    import torch

    try:
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, 32, 2, 64, device="cuda", dtype=torch.float16) for _ in range(3))
        out = module.flash_attn_func(q, k, v, dropout_p=0.0, causal=False)
        ref = torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2).float() for t in (q, k, v))
        ).transpose(1, 2)
        err = (out.float() - ref).abs().max().item()
    except Exception as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return None if err < 1e-2 else f"max error {err:.3g} against the math attention"


def sdpa_flags() -> dict[str, bool]:
    import torch

    b = torch.backends.cuda
    flags = {
        "flash": b.flash_sdp_enabled(),
        "mem_efficient": b.mem_efficient_sdp_enabled(),
        "math": b.math_sdp_enabled(),
    }
    if hasattr(b, "cudnn_sdp_enabled"):
        flags["cudnn"] = b.cudnn_sdp_enabled()
    return flags


def sdpa_probe() -> dict[str, str | None]:
    """Run the flash and memory-efficient SDPA kernels once each on the GPU: None = works, else why not."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    results: dict[str, str | None] = {}
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    for name, backend in (
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("mem_efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):
        try:
            with sdpa_kernel([backend]):
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            err = (out.float() - ref).abs().max().item()
            results[name] = None if err < 1e-2 else f"max error {err:.3g}"
        except Exception as exc:
            results[name] = " ".join(str(exc).split())[:160] or type(exc).__name__
    return results


def sdpa_items(
    flags: Mapping[str, bool], probe: Mapping[str, str | None] | None, hip: bool, environ: Mapping[str, str]
) -> list[Item]:
    """SDPA switches, and on a GPU whether a memory-efficient kernel runs (else memory is quadratic)."""
    detail = ", ".join(f"{name}={'on' if on else 'off'}" for name, on in flags.items())
    items = [Item("attention", "sdpa backends", OK, detail)]
    if probe is None:
        return items
    working = [name for name, problem in probe.items() if problem is None]
    if working:
        items.append(Item("attention", "sdpa kernels", OK, f"working on the GPU: {', '.join(working)}"))
        return items
    why = "; ".join(f"{name}: {problem}" for name, problem in probe.items())
    fix = "--attention auto falls back to chunked attention (slower); flash-attn, if it builds here, is faster"
    if hip and environ.get("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL") != "1":
        fix = (
            "export TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1 before starting (experimental arch); else "
            + fix
        )
    items.append(
        Item("attention", "sdpa kernels", WARN, f"no memory-efficient SDPA kernel runs ({why})", fix)
    )
    return items


# ----------------------------------------------------------------------------------------------- ONNX Runtime


def onnxruntime_items(import_module: Callable[[str], Any] = importlib.import_module) -> list[Item]:
    try:
        ort = import_module("onnxruntime")
    except Exception as exc:
        return [
            Item(
                "onnxruntime",
                "version",
                FAIL,
                f"not importable ({type(exc).__name__}: {exc})",
                "pip install onnxruntime (exactly one of onnxruntime/-gpu/-rocm/-migraphx)",
                blocking=True,
            )
        ]
    providers = list(ort.get_available_providers())
    items = [Item("onnxruntime", "version", OK, f"ONNX Runtime {getattr(ort, '__version__', '?')}")]
    if "CPUExecutionProvider" not in providers:
        items.append(
            Item(
                "onnxruntime",
                "providers",
                FAIL,
                f"no CPU provider in {providers}",
                "reinstall onnxruntime",
                blocking=True,
            )
        )
    else:
        items.append(Item("onnxruntime", "providers", OK, ", ".join(providers)))
    return items


# ----------------------------------------------------------------------------------------------- checkpoints


def _model_of(check: FileCheck) -> str | None:
    for model in ModelType:
        if f"ootd_{model.value}" in check.path.parts:
            return model.value
    return None


def checkpoint_items(
    checks: Sequence[FileCheck], root: Path, models: Sequence[str] = ("hd", "dc")
) -> tuple[list[Item], list[str]]:
    """One item per bad file, a summary, and the model types that can run (one bad beside one ok: warn)."""
    if not root.is_dir() or not any(c.present for c in checks):
        what = "does not exist" if not root.exists() else "holds none of the checkpoint files"
        fix = f"run `ootd download --dest {root}` (or point --checkpoints / OOTD_CHECKPOINTS to them)"
        return [Item("checkpoints", "folder", FAIL, f"{root} {what}", fix, True)], []
    common_bad = [c for c in checks if not c.ok and _model_of(c) is None]
    bad_by_model = {m: [c for c in checks if not c.ok and _model_of(c) == m] for m in models}
    available = [] if common_bad else [m for m in models if not bad_by_model[m]]
    blocking = not available
    items = []
    for check in common_bad:
        items.append(
            Item("checkpoints", check.component, FAIL, f"{check.path}: {check.problem}", check.fix, True)
        )
    for model, bad in bad_by_model.items():
        for check in bad:
            status = FAIL if blocking else WARN
            detail = f"{check.path}: {check.problem}" + (
                "" if blocking else f" (the {model} model cannot run)"
            )
            items.append(Item("checkpoints", check.component, status, detail, check.fix, blocking))
    good = sum(c.ok for c in checks)
    summary = f"{root}: {good}/{len(checks)} files ok; models available: {', '.join(available) or 'none'}"
    items.insert(
        0,
        Item(
            "checkpoints",
            "summary",
            FAIL if blocking else (OK if good == len(checks) else WARN),
            summary,
            None if not blocking else f"run `ootd download --dest {root}`",
            blocking,
        ),
    )
    return items, available


# ----------------------------------------------------------------------------------------------- all together


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
    return report
