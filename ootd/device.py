"""Device and precision policy: which device, which dtype per component, which attention, which env vars.

Everything except detection is a pure function of a DeviceInfo (plus a profile read from
configs/profiles/*.toml), so every decision can be tested with fake devices. `peek_device` looks at the
hardware without initialising the GPU runtime, so `runtime_environment` can be applied before torch reads
its allocator and AOTriton settings; `detect_device` then gives the full picture.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import tomllib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from ootd.device_spec import check_device_spec
from ootd.errors import DeviceError

logger = logging.getLogger(__name__)


def _profiles_dir() -> Path:
    """configs/profiles of the source tree; an installed wheel carries the same files as ootd/profiles."""
    packaged = Path(__file__).resolve().parent / "profiles"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "configs" / "profiles"


PROFILES_DIR = _profiles_dir()
KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
MIB = 1 << 20


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

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.type, self.index) if self.index is not None else torch.device(self.type)

    @property
    def is_gpu(self) -> bool:
        """Any accelerator (CUDA, ROCm, MPS): where fused kernels can be wrong and a self-check pays off."""
        return self.type != "cpu"


@dataclass(frozen=True)
class Precision:
    """dtype per component; the VAE may differ because fp16 VAE decode can overflow."""

    unet: torch.dtype
    vae: torch.dtype
    text_encoder: torch.dtype
    image_encoder: torch.dtype


# ---------------------------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class DeviceProfile:
    """Per-arch defaults, read from configs/profiles/<name>.toml ([section] key -> field section_key).

    The defaults here are the conservative ones a profile file may leave out.
    """

    name: str = "generic"
    # [precision]
    precision_auto: str = "fp16"  # dtype of UNets/encoders for --precision auto
    precision_bf16: bool = False  # bf16 allowed when the user picks it
    precision_fp16: bool = True  # fp16 allowed
    precision_vae_fp16_overflows: bool = False  # VAE in fp32 whenever the rest runs in fp16
    # [attention]
    attention_order: tuple[str, ...] = ("sdpa", "chunked")  # for --attention auto; missing ones are skipped
    attention_sdpa_max_head_dim: int | None = None  # larger head dims skip sdpa
    attention_self_check: bool = True  # on GPUs: check the first backend against math once
    attention_budget_fraction: float = 0.25  # of free memory, for one chunked-attention step
    attention_budget_max_mib: int = 1024
    # [vae]
    vae_tile_above_megapixels: float = 1.0  # decode in tiles above this output size
    vae_decode_bytes_per_pixel: int = 3072  # fp16 decode activations per output pixel (estimate)
    vae_encode_batched: bool = True  # encode [masked person, person] as one batch when memory allows
    # [environment]
    environment_aotriton_experimental: bool = False  # TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1
    environment_miopen_find_mode: str = "FAST"  # MIOPEN_FIND_MODE on RDNA ("" to leave unset)
    environment_expandable_segments_min_torch: str | None = None  # None: never set the allocator conf
    environment_expandable_segments_min_rocm: str | None = None  # ROCm builds older than this: not set
    # [speed]
    speed_channels_last: bool = False  # UNets and VAE in channels_last (NHWC) memory format
    speed_compile: bool = False  # torch.compile the try-on UNet (pays a compile on the first call)


_SECTIONS = ("precision", "attention", "vae", "environment", "speed")
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_NATIVE_AMD_ARCHS = ("gfx1100", "gfx1101", "gfx1151", "gfx942")  # archs with a profile: never HSA_OVERRIDE


def profile_name(info: DeviceInfo) -> str:
    """Which profile file describes this device: exact arch, NVIDIA by generation, else generic."""
    if info.type == "cpu":
        return "cpu"
    if info.type == "mps":
        return "mps"
    if info.arch in _NATIVE_AMD_ARCHS:
        return info.arch
    match = re.fullmatch(r"sm_(\d+)", info.arch)
    if match:
        cc = int(match.group(1))
        if cc >= 90:
            return "sm_90"
        if cc >= 80:
            return "sm_80"
    return "generic"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise DeviceError(f"device profile {path} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise DeviceError(f"device profile {path} is not valid TOML: {exc}") from None


def _merge(base: dict[str, Any], override: Mapping[str, Any], source: Path) -> dict[str, Any]:
    merged = {section: dict(values) for section, values in base.items()}
    for section, values in override.items():
        if section not in _SECTIONS or not isinstance(values, Mapping):
            raise DeviceError(f"{source}: unknown section [{section}] (use {', '.join(_SECTIONS)})")
        merged.setdefault(section, {}).update(values)
    return merged


def _to_profile(name: str, data: Mapping[str, Any], source: Path) -> DeviceProfile:
    known = {f.name: f for f in fields(DeviceProfile)}
    kwargs: dict[str, Any] = {"name": name}
    for section, values in data.items():
        if section not in _SECTIONS or not isinstance(values, Mapping):
            raise DeviceError(f"{source}: unknown section [{section}] (use {', '.join(_SECTIONS)})")
        for key, value in values.items():
            field = f"{section}_{key}"
            if field not in known:
                raise DeviceError(f"{source}: unknown key {key!r} in [{section}]")
            default = getattr(DeviceProfile, field)
            if isinstance(default, tuple):
                if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                    raise DeviceError(f"{source}: [{section}] {key} must be a list of names")
                value = tuple(value)
            elif isinstance(default, bool) and not isinstance(value, bool):
                raise DeviceError(f"{source}: [{section}] {key} must be true or false")
            elif isinstance(default, float) and isinstance(value, int | float):
                value = float(value)
            kwargs[field] = value
    profile = DeviceProfile(**kwargs)
    if profile.precision_auto not in _DTYPES:
        raise DeviceError(f"{source}: [precision] auto must be one of {', '.join(_DTYPES)}")
    unknown = set(profile.attention_order) - {"flash", "sdpa", "chunked", "math"}
    if unknown:
        raise DeviceError(f"{source}: [attention] order has unknown backends {sorted(unknown)}")
    return profile


def load_profile(info: DeviceInfo, user_file: Path | None = None, *, profiles_dir: Path | None = None
                 ) -> DeviceProfile:
    """The profile for this device; keys in `user_file` (same TOML layout) override the shipped ones."""
    directory = profiles_dir or PROFILES_DIR
    name = profile_name(info)
    path = directory / f"{name}.toml"
    data = _read_toml(path)
    if user_file is not None:
        data = _merge(data, _read_toml(Path(user_file)), Path(user_file))
        path = Path(user_file)
    return _to_profile(name, data, path)


# ---------------------------------------------------------------------------------------------- policy


def choose_precision(info: DeviceInfo, precision: str = "auto", profile: DeviceProfile | None = None
                     ) -> Precision:
    """fp32 on CPU; the profile's half dtype on GPUs; bf16 only where the profile allows it; VAE in fp32
    where the profile says fp16 VAE overflows."""
    profile = profile or load_profile(info)
    if precision == "auto":
        dtype = _DTYPES[profile.precision_auto]
    elif precision in _DTYPES:
        dtype = _DTYPES[precision]
    else:
        raise DeviceError(f"unknown precision {precision!r}: use auto, fp32, fp16 or bf16")
    if dtype is torch.bfloat16 and not profile.precision_bf16:
        raise DeviceError(f"bf16 is not supported on {info.arch} ({profile.name} profile): use fp16 or fp32")
    if dtype is torch.float16 and not profile.precision_fp16:
        raise DeviceError(f"fp16 is not supported on {info.arch} ({profile.name} profile): use fp32 or bf16")
    vae = torch.float32 if dtype is torch.float16 and profile.precision_vae_fp16_overflows else dtype
    return Precision(unet=dtype, vae=vae, text_encoder=dtype, image_encoder=dtype)


@dataclass(frozen=True)
class SpeedOptions:
    """Choices that change how fast the networks run, never what they compute (beyond float rounding)."""

    channels_last: bool = False
    compile: bool = False


def choose_speed(info: DeviceInfo, profile: DeviceProfile | None = None, *, channels_last: bool | None = None,
                 compile: bool | None = None) -> SpeedOptions:
    """The profile's defaults, overridden by what the user asked for. No shipped profile turns either on:
    on the CPU channels_last makes a step 4-5% faster but PyTorch's CPU GroupNorm kernel for NHWC input
    accumulates in one float32 pass (errors up to ~1e-3 at VAE sizes instead of ~1e-6), and compile takes
    minutes for ~2% per step (docs/benchmarks.md)."""
    profile = profile or load_profile(info)
    return SpeedOptions(
        channels_last=profile.speed_channels_last if channels_last is None else channels_last,
        compile=profile.speed_compile if compile is None else compile,
    )


def attention_order(info: DeviceInfo, profile: DeviceProfile | None = None) -> tuple[str, ...]:
    """Backends for --attention auto, best first (what is not installed is dropped at selection)."""
    return (profile or load_profile(info)).attention_order


def attention_budget(info: DeviceInfo, profile: DeviceProfile | None = None) -> int:
    """Bytes one chunked-attention step may use: a fraction of free memory, capped; the cap if unknown."""
    profile = profile or load_profile(info)
    cap = profile.attention_budget_max_mib * MIB
    memory = info.free_memory if info.free_memory is not None else info.total_memory
    if memory is None:
        return cap
    return int(max(64 * MIB, min(cap, memory * profile.attention_budget_fraction)))


def vae_tiling_threshold(info: DeviceInfo, precision: Precision, profile: DeviceProfile | None = None) -> int:
    """Output pixels above which the VAE should decode in tiles: the profile's ceiling, lowered when half
    of the device's free memory would not hold the estimated decode activations."""
    profile = profile or load_profile(info)
    threshold = int(profile.vae_tile_above_megapixels * 1_000_000)
    memory = info.free_memory if info.free_memory is not None else info.total_memory
    if memory is not None:
        per_pixel = profile.vae_decode_bytes_per_pixel * max(1, precision.vae.itemsize // 2)
        threshold = min(threshold, int(memory * 0.5 // per_pixel))
    return max(threshold, 256 * 256)


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


def environment_warnings(info: DeviceInfo, environ: Mapping[str, str] | None = None) -> list[str]:
    """User settings known to hurt on this device (reported, never changed)."""
    environ = os.environ if environ is None else environ
    notes = []
    if info.arch in _NATIVE_AMD_ARCHS and environ.get("HSA_OVERRIDE_GFX_VERSION"):
        notes.append(f"HSA_OVERRIDE_GFX_VERSION is set but {info.arch} is natively supported; unset it")
    return notes


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
    return DeviceInfo(type="cpu", total_memory=total, free_memory=free)


def _mps_info() -> DeviceInfo:
    if not torch.backends.mps.is_available():
        raise DeviceError("device mps requested but MPS is not available in this PyTorch")
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


def peek_device(spec: str | None = None) -> DeviceInfo:
    """What `detect_device` would say, as far as it can be known without initialising the GPU runtime
    (arch from the AMD kernel driver or nvidia-smi, no memory figures). Use it to compute
    `runtime_environment` before anything allocates on the GPU."""
    dev = _parse_spec(spec)
    if dev.type == "cpu":
        return _cpu_info()
    if dev.type == "mps":
        return _mps_info()
    if dev.type == "cuda":
        index = dev.index or 0
        if torch.version.hip is not None:
            archs = _visible(kfd_gpu_archs(), os.environ)
            arch = archs[index] if index < len(archs) else "unknown"
            return DeviceInfo(type="cuda", index=index, vendor="amd", arch=arch, name=arch)
        arch = _nvidia_arch(index)
        return DeviceInfo(type="cuda", index=index, vendor="nvidia", arch=arch, name=f"NVIDIA {arch}")
    raise DeviceError(f"unsupported device {spec!r}: use cpu, cuda, cuda:N or mps")


def detect_device(spec: str | None = None) -> DeviceInfo:
    """Resolve a user device string (None/auto: the best available) to a DeviceInfo. Initialises the GPU."""
    dev = _parse_spec(spec)
    if dev.type == "cpu":
        return _cpu_info()
    if dev.type == "mps":
        return _mps_info()
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {spec} requested but this PyTorch sees no CUDA/ROCm GPU")
        index = dev.index or 0
        if index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise DeviceError(f"device {spec} requested but only {count} GPU(s) are visible")
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
    raise DeviceError(f"unsupported device {spec!r}: use cpu, cuda, cuda:N or mps")
