"""Runtime resolution: from the user's device/precision/attention words to what a pipeline runs with.

Order matters: the environment (allocator, kernels) is applied before torch initialises the device, then the
device is detected, its profile read, and precision, attention backend and speed options chosen from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ootd.attention import AttentionFn, build_attention
from ootd.hardware.device import DeviceInfo, detect_device, peek_device
from ootd.hardware.dtypes import dtype_name
from ootd.hardware.policy import (
    Precision,
    SpeedOptions,
    apply_environment,
    choose_precision,
    choose_quantization,
    choose_speed,
    keep_freed_memory,
    malloc_heap_bytes,
    runtime_environment,
)
from ootd.hardware.profiles import DeviceProfile, load_profile
from ootd.settings import AttentionName, PrecisionName, QuantizeName
from ootd.speedups.modes import SpeedModes


@dataclass(frozen=True)
class Runtime:
    """Everything a pipeline needs to know about where and how it runs."""

    device: DeviceInfo
    profile: DeviceProfile
    precision: Precision
    attention: AttentionFn
    speed: SpeedOptions
    quantize: QuantizeName = QuantizeName.NONE


def resolve_runtime(device: str | None = None, dtype: str | torch.dtype | None = None,
                    attention: str | AttentionFn = AttentionName.AUTO, profile: str | Path | None = None, *,
                    speed: SpeedModes | None = None) -> Runtime:
    """`device` None picks the best available; `dtype` None follows the device profile (fp32 on CPU);
    `attention` is a backend name or an attention function; `profile` a TOML file overriding the device
    profile; `speed` the speed modes asked for (channels_last and compile None follow the profile; quantize
    must be a mode the device runs)."""
    speed = speed or SpeedModes()
    # runtime settings (allocator, kernels) must be in place before torch initialises the device
    apply_environment(runtime_environment(peek_device(device), torch.__version__))
    info = detect_device(device)
    device_profile = load_profile(info, Path(profile) if profile else None)
    if isinstance(dtype, torch.dtype):
        dtype = dtype_name(dtype)
    precision = choose_precision(info, dtype or PrecisionName.AUTO, device_profile)
    quantization = choose_quantization(info, speed.quantize, precision.unet)
    if isinstance(attention, str):
        attention = build_attention(attention, info, precision.unet, profile=device_profile)
    options = choose_speed(info, device_profile, channels_last=speed.channels_last, compile=speed.compile,
                           vae_dtype=precision.vae)
    keep_freed_memory(malloc_heap_bytes(info, device_profile))  # CPU: no page faults per new tensor
    return Runtime(info, device_profile, precision, attention, options, quantization)
