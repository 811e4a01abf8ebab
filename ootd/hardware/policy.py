"""Device policy: pure functions of a DeviceInfo and its profile (precision, speed options, the chunked
attention budget, runtime environment variables), so every decision can be tested with fake devices."""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

import torch

from ootd.errors import DeviceError, UnsupportedError, UsageError
from ootd.hardware.device import DeviceInfo
from ootd.hardware.dtypes import DTYPES, dtype_name
from ootd.hardware.profiles import DeviceProfile, load_profile
from ootd.settings import PrecisionName, QuantizeName

logger = logging.getLogger(__name__)

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Precision:
    """dtype per component; the VAE may differ because fp16 VAE decode can overflow. `reason` says why `auto`
    chose what it did (empty for an explicit choice), for the summary line."""

    unet: torch.dtype
    vae: torch.dtype
    text_encoder: torch.dtype
    image_encoder: torch.dtype
    reason: str = field(default="", compare=False)

    def dtypes(self) -> dict[str, torch.dtype]:
        """Component -> dtype (what loading and reports need, without the reason)."""
        return {"unet": self.unet, "vae": self.vae, "text_encoder": self.text_encoder,
                "image_encoder": self.image_encoder}

    def word(self) -> str:
        """One line for people: `bf16 (auto: the CPU has bf16 matrix units; --precision fp32 for fp32)`."""
        text = dtype_name(self.unet) + (f", VAE {dtype_name(self.vae)}" if self.vae != self.unet else "")
        return f"{text} ({self.reason})" if self.reason else text


def choose_precision(info: DeviceInfo, precision: str = "auto", profile: DeviceProfile | None = None
                     ) -> Precision:
    """fp32 on CPU, bf16 on CPUs with bf16 matrix units (where the profile says so: 1.2-1.5x faster steps and
    1.6-1.9x faster VAE there, docs/benchmarks.md); the profile's half dtype on GPUs; bf16 only where the
    profile allows it; VAE in fp32 where the profile says fp16 VAE overflows."""
    profile = profile or load_profile(info)
    reason = ""
    if precision == PrecisionName.AUTO:
        if info.bf16_matmul and profile.precision_auto_bf16_matmul:
            dtype = DTYPES[profile.precision_auto_bf16_matmul]
            reason = "auto: the CPU has bf16 matrix units; --precision fp32 for fp32 numbers"
        else:
            dtype = DTYPES[profile.precision_auto]
    elif precision in DTYPES:
        dtype = DTYPES[precision]
    else:
        raise DeviceError(f"unknown precision {precision!r}: use {', '.join(PrecisionName.words())}")
    if dtype is torch.bfloat16 and not profile.precision_bf16:
        raise UnsupportedError(f"bf16 is not supported on {info.arch} ({profile.name} profile): use fp16 or fp32")
    if dtype is torch.float16 and not profile.precision_fp16:
        raise UnsupportedError(f"fp16 is not supported on {info.arch} ({profile.name} profile): use fp32 or bf16")
    vae = torch.float32 if dtype is torch.float16 and profile.precision_vae_fp16_overflows else dtype
    return Precision(unet=dtype, vae=vae, text_encoder=dtype, image_encoder=dtype, reason=reason)


# float8 matrix units: NVIDIA from compute capability 8.9 (Ada, Hopper, Blackwell), AMD MI300 (gfx942)
FP8_MIN_NVIDIA_CAPABILITY = 89
FP8_AMD_ARCHS = ("gfx942",)


def supported_quantization(info: DeviceInfo) -> tuple[QuantizeName, ...]:
    """The quantization modes that run on this device: int8 on the CPU and on CUDA/ROCm GPUs, float8 only where
    the GPU has float8 matrix units; MPS gets none (torchao's kernels do not cover it)."""
    if info.type == "mps":
        return (QuantizeName.NONE,)
    modes = (QuantizeName.NONE, QuantizeName.INT8_DYNAMIC, QuantizeName.INT8_WEIGHT)
    if info.type == "cuda" and _has_fp8(info):
        modes += (QuantizeName.FP8,)
    return modes


def _has_fp8(info: DeviceInfo) -> bool:
    if info.vendor == "amd":
        return info.arch in FP8_AMD_ARCHS
    match = re.fullmatch(r"sm_(\d+)", info.arch)
    return info.vendor == "nvidia" and match is not None and int(match.group(1)) >= FP8_MIN_NVIDIA_CAPABILITY


def choose_quantization(info: DeviceInfo, quantize: str | QuantizeName = QuantizeName.NONE,
                        unet_dtype: torch.dtype | None = None) -> QuantizeName:
    """The user's quantization word if this device runs it, else a one-line UnsupportedError naming the ones it does.
    fp8 takes bf16 UNets only (torchao's per-row float8 scaling is written for bf16 weights)."""
    mode = QuantizeName.parse(quantize)
    supported = supported_quantization(info)
    if mode not in supported:
        where = info.arch if info.type != "cpu" else "the CPU"
        raise UnsupportedError(f"quantization {mode.value} is not supported on {where}: use "
                          f"{', '.join(m.value for m in supported)}")
    if mode is QuantizeName.FP8 and unet_dtype is not None and unet_dtype is not torch.bfloat16:
        raise UsageError(f"quantization fp8 needs precision bf16, not {dtype_name(unet_dtype)}")
    return mode


@dataclass(frozen=True)
class SpeedOptions:
    """Choices that change how fast the networks run, never what they compute (beyond float rounding).

    `channels_last` lays out the UNets and the VAE as NHWC; `vae_channels_last` the VAE alone (always on with
    `channels_last`)."""

    channels_last: bool = False
    compile: bool = False
    vae_channels_last: bool = False

    def __post_init__(self) -> None:
        if self.channels_last and not self.vae_channels_last:
            object.__setattr__(self, "vae_channels_last", True)


def choose_speed(info: DeviceInfo, profile: DeviceProfile | None = None, *, channels_last: bool | None = None,
                 compile: bool | None = None, vae_dtype: torch.dtype | None = None) -> SpeedOptions:
    """The profile's defaults, overridden by what the user asked for (`channels_last` given either way decides
    for the VAE too).

    No shipped profile lays the UNets out as channels_last or compiles: on the CPU channels_last changes fp32
    numbers (other convolution kernels) for 4-5% per step, and compile takes minutes for ~2% per step. The CPU
    profile runs the VAE channels_last when it runs in bf16 (`[vae] channels_last_bf16`): oneDNN's bf16
    convolutions run its brgemm kernels (AMX where the CPU has it) on NHWC and reorder every NCHW activation and
    weight on each call (docs/benchmarks.md, "The VAE in bf16"), and bf16's own rounding is far above the
    difference in accumulation order. fp32 keeps NCHW, the exact method's numbers bit for bit."""
    profile = profile or load_profile(info)
    layout = profile.speed_channels_last if channels_last is None else channels_last
    vae_layout = layout if channels_last is not None else (
        layout or (vae_dtype is torch.bfloat16 and profile.vae_channels_last_bf16))
    return SpeedOptions(channels_last=layout, compile=profile.speed_compile if compile is None else compile,
                        vae_channels_last=vae_layout)


# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MALLOC_INT_MAX = 2**31 - 1


def malloc_heap_bytes(info: DeviceInfo, profile: DeviceProfile | None = None) -> int:
    """How large an allocation glibc's malloc should serve from its heap, keeping freed memory for the next
    tensor (0: leave malloc alone). Each new CPU tensor above malloc's default threshold is otherwise a fresh
    mmap whose pages fault in one by one: 10-18% of a bf16 VAE call at 384x512 and over a fifth of an fp32 one
    went to those page faults (docs/benchmarks.md)."""
    if info.type != "cpu":
        return 0
    profile = profile or load_profile(info)
    return min(int(profile.environment_malloc_heap_mib) * MIB, _MALLOC_INT_MAX)


def keep_freed_memory(heap_bytes: int) -> bool:
    """Have glibc's malloc serve allocations up to `heap_bytes` from its heap and keep what is freed there
    (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD): the same numbers, no page faults per tensor, and a resident size that
    stays at the call's high-water mark. Process-wide; False (nothing changed) without glibc or for 0."""
    if heap_bytes <= 0 or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover - glibc always has it
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, min(heap_bytes, _MALLOC_INT_MAX))
                and mallopt(_M_TRIM_THRESHOLD, _MALLOC_INT_MAX))


MIN_ATTENTION_BUDGET = 64 * MIB
# Fraction of the budget and cap for one chunked-attention step, when no device profile is given.
GPU_ATTENTION_FRACTION, GPU_ATTENTION_CAP = 0.25, 4 * GIB
CPU_ATTENTION_FRACTION, CPU_ATTENTION_CAP = 0.1, 1 * GIB


def attention_budget_for(budget: int | None, device: DeviceInfo, profile: DeviceProfile | None = None,
                         reserved: int = 0) -> int:
    """Bytes for one chunked-attention step: a fraction of what `budget` leaves after `reserved` (the
    weights), capped, never below 64 MiB; the cap when the budget is unknown (None).

    It grows with the budget, and never by more than a fraction of it, which keeps memory plans monotone.
    """
    if profile is not None:
        fraction, cap = profile.attention_budget_fraction, profile.attention_budget_max_mib * MIB
    elif device.type == "cpu":
        fraction, cap = CPU_ATTENTION_FRACTION, CPU_ATTENTION_CAP
    else:
        fraction, cap = GPU_ATTENTION_FRACTION, GPU_ATTENTION_CAP
    if budget is None:
        return cap
    return int(max(MIN_ATTENTION_BUDGET, min(cap, (budget - reserved) * min(fraction, 0.5))))


def free_memory(device: DeviceInfo) -> int | None:
    """Free memory if the device says, else its total; None when it says neither (e.g. MPS)."""
    return device.free_memory if device.free_memory is not None else device.total_memory


def _version(text: str) -> tuple[int, ...]:
    """'2.11.0+rocm7.0' -> (2, 11, 0); leading numeric fields only."""
    parts = []
    for piece in text.split("+")[0].split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
    return tuple(parts)


def _rocm_version(torch_version: str) -> tuple[int, ...] | None:
    match = re.search(r"\+rocm(\d+(?:\.\d+)*)", torch_version)
    return _version(match.group(1)) if match else None


def is_rdna(arch: str) -> bool:
    """gfx10xx, gfx11xx, gfx12xx: consumer/APU AMD GPUs (RDNA1-4)."""
    return re.fullmatch(r"gfx1[012][0-9a-f]{2}", arch) is not None


def runtime_environment(info: DeviceInfo, torch_version: str, profile: DeviceProfile | None = None
                        ) -> dict[str, str]:
    """Environment variables to set before torch initialises the device (they are read once).

    Never HSA_OVERRIDE_GFX_VERSION: it only helps unsupported archs and breaks natively supported ones.
    """
    profile = profile or load_profile(info)
    env: dict[str, str] = {}
    if info.vendor in ("amd", "nvidia") and profile.environment_expandable_segments_min_torch:
        ok = _version(torch_version) >= _version(profile.environment_expandable_segments_min_torch)
        if info.vendor == "amd":
            rocm = _rocm_version(torch_version)
            minimum = profile.environment_expandable_segments_min_rocm
            if rocm is not None and minimum is not None and rocm < _version(minimum):
                ok = False
        if ok:
            name = "PYTORCH_HIP_ALLOC_CONF" if info.vendor == "amd" else "PYTORCH_CUDA_ALLOC_CONF"
            env[name] = "expandable_segments:True"
    if info.vendor == "amd":
        if profile.environment_aotriton_experimental:
            env["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] = "1"
        if is_rdna(info.arch) and profile.environment_miopen_find_mode:
            env["MIOPEN_FIND_MODE"] = profile.environment_miopen_find_mode
    return env


def apply_environment(
    env: Mapping[str, str], environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Set the variables the user has not set (theirs win); returns what was set."""
    target = os.environ if environ is None else environ
    applied = {key: value for key, value in env.items() if key not in target}
    target.update(applied)
    if applied and environ is None and torch.cuda.is_initialized():
        logger.warning("GPU already initialised; %s may only apply in a new process", ", ".join(applied))
    return applied
