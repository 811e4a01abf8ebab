"""The hardware: what device a run gets (DeviceInfo) and how it is detected.

`peek_device` looks at the hardware without initialising the GPU runtime, so the runtime environment
(ootd/hardware/policy.py) can be applied before torch reads its allocator and AOTriton settings;
`detect_device` then gives the full picture. Everything that decides something from a DeviceInfo is a pure
function elsewhere (ootd/hardware/profiles.py, ootd/hardware/policy.py, ootd/memory/planner.py), testable with
fake devices.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ootd.errors import DeviceError, UnsupportedError
from ootd.hardware.spec import check_device_spec

KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")

@dataclass(frozen=True)
class DeviceInfo:
    type: str  # torch device type: "cuda" (also ROCm), "cpu", "mps"
    index: int | None = None
    vendor: str = "cpu"  # "nvidia", "amd", "apple", "cpu"
    arch: str = "cpu"  # "gfx1100", "gfx1151", "gfx942", "sm_90", "cpu", "mps"; "unknown" if not known yet
    name: str = "cpu"
    total_memory: int | None = None  # bytes
    free_memory: int | None = None  # bytes
    unified_memory: bool = False
    bf16_matmul: bool = False  # CPU with bf16 matrix instructions (AVX512-BF16, AMX-BF16, Arm BF16)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.type, self.index) if self.index is not None else torch.device(self.type)

    @property
    def is_gpu(self) -> bool:
        """Any accelerator (CUDA, ROCm, MPS): where fused kernels can be wrong and a self-check pays off."""
        return self.type != "cpu"


# ---------------------------------------------------------------------------------------------- detection


def _parse_spec(spec: str | None) -> torch.device:
    check_device_spec(spec)  # an unknown word is a usage error naming OOTD_DEVICE when it came from there
    if spec is None or spec == "auto":
        if torch.cuda.device_count() > 0:
            return torch.device("cuda", 0)
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        return torch.device(spec)
    except RuntimeError:
        raise DeviceError(f"unknown device {spec!r}: use cpu, cuda, cuda:N or mps") from None


def _cpu_info() -> DeviceInfo:
    total = free = None
    try:
        meminfo = Path("/proc/meminfo").read_text()
        found = re.finditer(r"^(\w+):\s+(\d+) kB", meminfo, re.M)
        values = {m.group(1): int(m.group(2)) * 1024 for m in found}
        total, free = values.get("MemTotal"), values.get("MemAvailable")
    except OSError:
        pass
    return DeviceInfo(type="cpu", total_memory=total, free_memory=free, bf16_matmul=cpu_bf16_matmul())


# CPU flags (x86 /proc/cpuinfo "flags", Arm "Features") that mean bf16 matrix multiplies run natively; without
# them bf16 is emulated and slower than fp32
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
CPU_BF16_ENV = "OOTD_CPU_BF16"  # 1 / 0: override the detection (a VM may hide the flags; tests pin it)


def bf16_flags(cpuinfo: str) -> bool:
    """Whether /proc/cpuinfo text lists a bf16 matrix instruction set on its flags/Features lines."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features") and BF16_CPU_FLAGS & set(value.split()):
            return True
    return False


def cpu_bf16_matmul(environ: Mapping[str, str] | None = None, cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU multiplies bf16 matrices natively: $OOTD_CPU_BF16 (1/0) if set, else its flags (Linux;
    elsewhere False, so precision auto stays fp32)."""
    override = (os.environ if environ is None else environ).get(CPU_BF16_ENV, "").strip().lower()
    if override:
        if override not in ("0", "1", "true", "false", "yes", "no"):
            raise DeviceError(f"{CPU_BF16_ENV}={override!r}: use 1 (the CPU has bf16 matrix units) or 0")
        return override in ("1", "true", "yes")
    try:
        return bf16_flags(cpuinfo.read_text(errors="replace"))
    except OSError:
        return False


def _mps_info() -> DeviceInfo:
    if not torch.backends.mps.is_available():
        raise UnsupportedError("device mps requested but MPS is not available in this PyTorch")
    return DeviceInfo(type="mps", vendor="apple", arch="mps", name="Apple MPS", unified_memory=True)


def gfx_name(target_version: int) -> str:
    """KFD gfx_target_version (e.g. 110501, 90010) -> arch name (gfx1151, gfx90a)."""
    major, minor, step = target_version // 10000, (target_version // 100) % 100, target_version % 100
    return f"gfx{major}{minor:x}{step:x}"


def kfd_gpu_archs(nodes: Path = KFD_NODES) -> list[str]:
    """AMD GPU archs from the kernel driver's topology, in ROCm's device order; no GPU runtime needed."""
    archs = []
    try:
        node_dirs = sorted((p for p in nodes.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    except OSError:
        return []
    for node in node_dirs:
        try:
            text = (node / "properties").read_text()
        except OSError:
            continue
        match = re.search(r"^gfx_target_version\s+(\d+)", text, re.M)
        if match and int(match.group(1)) != 0:
            archs.append(gfx_name(int(match.group(1))))
    return archs


def _visible(archs: list[str], environ: Mapping[str, str]) -> list[str]:
    for var in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        value = environ.get(var)
        if value is None:
            continue
        try:
            archs = [archs[int(i)] for i in value.split(",") if i.strip()]
        except (ValueError, IndexError):
            return []  # UUIDs or something we cannot map: unknown
    return archs


def _nvidia_arch(index: int) -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout.split()
        return "sm_" + out[index].replace(".", "")
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def _resolve(spec: str | None, cuda_info: Callable[[int], DeviceInfo]) -> DeviceInfo:
    dev = _parse_spec(spec)
    if dev.type == "cpu":
        return _cpu_info()
    if dev.type == "mps":
        return _mps_info()
    if dev.type == "cuda":
        return cuda_info(dev.index or 0)
    raise DeviceError(f"unsupported device {spec!r}: use cpu, cuda, cuda:N or mps")


def _peek_cuda(index: int) -> DeviceInfo:
    if torch.version.hip is not None:
        archs = _visible(kfd_gpu_archs(), os.environ)
        arch = archs[index] if index < len(archs) else "unknown"
        return DeviceInfo(type="cuda", index=index, vendor="amd", arch=arch, name=arch)
    arch = _nvidia_arch(index)
    return DeviceInfo(type="cuda", index=index, vendor="nvidia", arch=arch, name=f"NVIDIA {arch}")


def require_gpu(spec: str | None, index: int) -> None:
    """The GPU a device word names is visible, counted without initialising the runtime (so the runtime
    environment can still be set first); an UnsupportedError saying what is there if not."""
    count = torch.cuda.device_count()
    if count == 0:
        raise UnsupportedError(f"device {spec} requested but this PyTorch sees no CUDA/ROCm GPU")
    if index >= count:
        raise UnsupportedError(f"device {spec} requested but only {count} GPU(s) are visible")


def _detect_cuda(spec: str | None, index: int) -> DeviceInfo:
    require_gpu(spec, index)
    if not torch.cuda.is_available():
        raise UnsupportedError(f"device {spec} requested but this PyTorch cannot use its GPU")
    props = torch.cuda.get_device_properties(index)
    is_hip = torch.version.hip is not None
    if is_hip:
        arch = (getattr(props, "gcnArchName", "") or "").split(":")[0]
    else:
        arch = f"sm_{props.major}{props.minor}"
    free, total = torch.cuda.mem_get_info(index)
    return DeviceInfo(
        type="cuda", index=index, vendor="amd" if is_hip else "nvidia", arch=arch, name=props.name,
        total_memory=total, free_memory=free, unified_memory=bool(getattr(props, "is_integrated", False)),
    )


def peek_device(spec: str | None = None) -> DeviceInfo:
    """What `detect_device` would say, as far as it can be known without initialising the GPU runtime
    (arch from the AMD kernel driver or nvidia-smi, no memory figures). Use it to compute
    `runtime_environment` before anything allocates on the GPU."""
    return _resolve(spec, _peek_cuda)


def detect_device(spec: str | None = None) -> DeviceInfo:
    """Resolve a user device string (None/auto: the best available) to a DeviceInfo. Initialises the GPU."""
    return _resolve(spec, lambda index: _detect_cuda(spec, index))
