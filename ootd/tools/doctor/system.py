"""Doctor items about this machine: Python, the PyTorch build, the GPUs, environment variables, /dev access."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ootd.hardware.profiles import NATIVE_ROCM_ARCHS
from ootd.hardware.torch_builds import KIND_NAMES, MachineGpus, choose_kind, public_version
from ootd.tools.doctor.report import FAIL, OK, WARN, Item

GROUP_FIX = "sudo usermod -aG render,video $USER"
GPU_GROUPS = ("render", "video")
MIN_PYTHON = (3, 11)


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
                "python -m ootd.tools.torch_install --torch VERSION (the build for this machine's GPU)",
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
                "with a GPU: python -m ootd.tools.torch_install --build rocm (AMD) or --build cuda (NVIDIA)",
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


def _machine_gpu_words(machine: MachineGpus, kind: str) -> str:
    if kind == "cuda":
        return f"an NVIDIA GPU ({machine.nvidia})"
    return "an AMD GPU (/dev/kfd)"


def torch_fit_items(build: TorchBuild, machine: MachineGpus, torchvision: bool = False,
                    groups: tuple[set[str], set[str]] = (set(), set()),
                    access: Callable[[Path, int], bool] = lambda path, mode: os.access(path, mode)) -> list[Item]:
    """Whether the installed torch can use the GPU this machine has (seen without torch: ootd/hardware/
    torch_builds.py), with the command that installs the build that can. `groups`: the session's and the
    configured groups, for the fix of a /dev/kfd this user cannot open."""
    if build.version is None:
        return []
    have = "rocm" if build.hip else "cuda" if build.cuda else "cpu"
    want, why = choose_kind(machine)
    if want in ("cuda", "rocm") and want != have:
        fix = (f"python -m ootd.tools.torch_install --build {want} --torch {public_version(build.version)}"
               + (" --torchvision" if torchvision else ""))
        return [Item("torch", "fits the GPU", FAIL,
                     f"this machine has {_machine_gpu_words(machine, want)}, but PyTorch {build.version} is the "
                     f"{KIND_NAMES[have]} build, which cannot use it: try-ons run on the CPU", fix)]
    if have == "rocm" and machine.kfd is None:
        return [Item("torch", "fits the GPU", FAIL,
                     f"PyTorch {build.version} is the ROCm build, but there is no /dev/kfd: no AMD GPU it can use "
                     "(try-ons run on the CPU)", "see the devices section")]
    if have == "rocm" and not access(machine.kfd, os.R_OK | os.W_OK):
        return [Item("torch", "fits the GPU", FAIL,
                     f"PyTorch {build.version} is the ROCm build, but this user cannot open {machine.kfd}: it "
                     "cannot use the AMD GPU (try-ons run on the CPU)", _group_fix(*groups))]
    if want == have:
        return [Item("torch", "fits the GPU", OK, f"the {KIND_NAMES[have]} build, the one for this machine: {why}")]
    return []


def torchvision_items(mismatch: tuple[str, str] | None) -> list[Item]:
    """A torchvision that does not fit torch breaks every model (transformers imports it): a blocking failure."""
    if mismatch is None:
        return []
    return [Item("torch", "torchvision", FAIL, mismatch[0], mismatch[1], blocking=True)]


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
    from ootd.hardware.device import detect_device

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
    from ootd.hardware.units import size_text

    return "?" if value is None else size_text(value)


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
