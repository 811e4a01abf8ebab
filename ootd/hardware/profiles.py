"""Device profiles: per-arch defaults read from configs/profiles/<name>.toml, validated against our vocabulary.

A profile is data, not code: which precision `auto` means, the attention backends `--attention auto` tries,
the chunked-attention budget, the VAE encode batching, environment settings and speed options.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.errors import DeviceError
from ootd.settings import AttentionName, PrecisionName

if TYPE_CHECKING:  # no torch at import: `ootd doctor` reads the arch lists even where torch is broken
    from ootd.hardware.device import DeviceInfo


def _profiles_dir() -> Path:
    """configs/profiles of the source tree; an installed wheel carries the same files as ootd/profiles."""
    packaged = Path(__file__).resolve().parent / "profile_files"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "configs" / "profiles"


PROFILES_DIR = _profiles_dir()
# AMD archs natively supported by ROCm: each either has a profile or runs on the generic one, and
# HSA_OVERRIDE_GFX_VERSION only breaks them.
NATIVE_ROCM_ARCHS = ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1151", "gfx1200", "gfx1201")
_PROFILED_AMD_ARCHS = ("gfx1100", "gfx1101", "gfx1151", "gfx942")  # with their own configs/profiles file


@dataclass(frozen=True)
class DeviceProfile:
    """Per-arch defaults, read from configs/profiles/<name>.toml ([section] key -> field section_key).

    The defaults here are the conservative ones a profile file may leave out.
    """

    name: str = "generic"
    # [precision]
    precision_auto: str = "fp16"  # dtype of UNets/encoders for --precision auto
    precision_auto_bf16_matmul: str | None = None  # auto instead, on CPUs with bf16 matrix units (None: same)
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
    vae_encode_batched: bool = True  # encode [masked person, person] as one batch when memory allows
    vae_channels_last_bf16: bool = False  # the VAE in channels_last (NHWC) whenever it runs in bf16
    # [environment]
    environment_aotriton_experimental: bool = False  # TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1
    environment_miopen_find_mode: str = "FAST"  # MIOPEN_FIND_MODE on RDNA ("" to leave unset)
    environment_expandable_segments_min_torch: str | None = None  # None: never set the allocator conf
    environment_expandable_segments_min_rocm: str | None = None  # ROCm builds older than this: not set
    environment_malloc_heap_mib: int = 0  # CPU: glibc malloc keeps freed blocks up to this size (0: its default)
    # [speed]
    speed_channels_last: bool = False  # UNets and VAE in channels_last (NHWC) memory format
    speed_compile: bool = False  # torch.compile the try-on UNet (pays a compile on the first call)


_SECTIONS = ("precision", "attention", "vae", "environment", "speed")


def profile_name(info: DeviceInfo) -> str:
    """Which profile file describes this device: exact arch, NVIDIA by generation, else generic."""
    if info.type == "cpu":
        return "cpu"
    if info.type == "mps":
        return "mps"
    if info.arch in _PROFILED_AMD_ARCHS:
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
            elif type(default) is int and (type(value) is not int or value < 0):
                raise DeviceError(f"{source}: [{section}] {key} must be a whole number, 0 or more")
            elif isinstance(default, float) and isinstance(value, int | float):
                value = float(value)
            kwargs[field] = value
    profile = DeviceProfile(**kwargs)
    dtypes = [w for w in PrecisionName.words() if w != PrecisionName.AUTO]
    if profile.precision_auto not in dtypes:
        raise DeviceError(f"{source}: [precision] auto must be one of {', '.join(dtypes)}")
    if profile.precision_auto_bf16_matmul not in (None, *dtypes):
        raise DeviceError(f"{source}: [precision] auto_bf16_matmul must be one of {', '.join(dtypes)}")
    unknown = set(profile.attention_order) - (set(AttentionName.words()) - {AttentionName.AUTO})
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
