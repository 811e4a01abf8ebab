"""Runtime resolution: from the user's device/precision/attention words to what a pipeline runs with.

Order matters: the environment (allocator, kernels) is applied before torch initialises the device, then the
device is detected, its profile read, and precision, attention backend and speed options chosen from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ootd.attention import AttentionFn, build_attention
from ootd.config import AttentionName, PrecisionName, QuantizeName
from ootd.device import DeviceInfo, detect_device, peek_device
from ootd.device_policy import (
    Precision,
    SpeedOptions,
    apply_environment,
    choose_precision,
    choose_quantization,
    choose_speed,
    runtime_environment,
)
from ootd.dtypes import dtype_name
from ootd.profiles import DeviceProfile, load_profile


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
                    channels_last: bool | None = None, compile: bool | None = None,
                    quantize: str | QuantizeName = QuantizeName.NONE) -> Runtime:
    """`device` None picks the best available; `dtype` None follows the device profile (fp32 on CPU);
    `attention` is a backend name or an attention function; `profile` a TOML file overriding the device
    profile; `channels_last` and `compile` None follow the profile; `quantize` must be a mode the device runs."""
    # runtime settings (allocator, kernels) must be in place before torch initialises the device
    apply_environment(runtime_environment(peek_device(device), torch.__version__))
    info = detect_device(device)
    device_profile = load_profile(info, Path(profile) if profile else None)
    if isinstance(dtype, torch.dtype):
        dtype = dtype_name(dtype)
    precision = choose_precision(info, dtype or PrecisionName.AUTO, device_profile)
    quantization = choose_quantization(info, quantize, precision.unet)
    if isinstance(attention, str):
        attention = build_attention(attention, info, precision.unet, profile=device_profile)
    speed = choose_speed(info, device_profile, channels_last=channels_last, compile=compile)
    return Runtime(info, device_profile, precision, attention, speed, quantization)
