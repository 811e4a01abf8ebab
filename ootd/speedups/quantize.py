"""Opt-in weight quantization of the two UNets with torchao (the `quant` extra): smaller weights, approximate output.

Only the Linear layers are quantized (attention projections, feed-forwards, time embedding: 31% of a UNet's
parameters); convolutions, norms and every bias stay in the pipeline's float dtype. For convolutions torchao 0.18
has float8 for 3-D ones only (GPU kernels from another package), an int8 weight-only conv2d layout that
dequantizes in every call (no speed), and a helper that turns 1x1 convolutions into Linear layers between two
permutes; none is both simple and faster here, so convolutions stay float. Quantization runs after strict
checkpoint loading, so the loading checks see the released weights, and before the residency places anything.

What each mode does (ootd.settings.QuantizeName; ootd/hardware/policy.py decides where each runs):

- int8-dynamic: int8 weights (one scale per output row) and int8 activations quantized on every call.
  It is NOT faster than fp32 on this project's CPU (2 shared AMD EPYC cores with AVX-512 VNNI and BF16, torch
  2.13, torchao 0.18): one full-size try-on UNet call at 384x512 with batch 4 took 77-89 s in fp32 and 81-88 s
  with int8-dynamic (two runs at load average 5-6; the gap is within the shared machine's noise), and with
  bf16 activations 30 s in one run and 80 s in the other against 41-45 s for plain bf16: no consistent gain
  (scripts/measure_quant.py). Quantizing every activation in eager mode probably eats what the int8 matmul
  saves. It is kept for the memory it saves: a UNet's weights go from 3.20 to 2.45 GiB in fp32.
- int8-weight: int8 weights, dequantized into the float dtype per call; meant for GPUs. It runs on the CPU too,
  no faster than fp32 (86-91 s for the call above), with the same memory saving.
- fp8: float8 weights and activations on GPUs with float8 matrix units, for bf16 UNets only (torchao's per-row
  float8 scaling); torchao itself refuses other devices.

The output is not bit-identical to `none` (the exact path): quantization changes every Linear layer's result
by ~1% relative, which the denoising loop carries through (tests/library/speedups/test_quantize.py states the bounds).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from ootd.errors import UnsupportedError
from ootd.hardware.device import DeviceInfo
from ootd.hardware.policy import choose_quantization
from ootd.settings import QuantizeName

EXTRA_HINT = "pip install 'ootd[quant]'"


def require_torchao() -> Any:
    """torchao's quantization API, or a one-line error saying how to install the extra (checked before loading)."""
    try:
        return importlib.import_module("torchao.quantization")
    except ImportError:
        raise UnsupportedError(f"quantization needs torchao, which is not installed: {EXTRA_HINT}") from None


def quantize_config(mode: QuantizeName, ao: Any, device: DeviceInfo) -> Any:
    """torchao's config object for a mode (per-row scales throughout); MI300 has the fnuz float8 format."""
    if mode is QuantizeName.INT8_DYNAMIC:
        return ao.Int8DynamicActivationInt8WeightConfig()
    if mode is QuantizeName.INT8_WEIGHT:
        return ao.Int8WeightOnlyConfig()
    if mode is QuantizeName.FP8:
        fp8 = torch.float8_e4m3fnuz if device.vendor == "amd" else torch.float8_e4m3fn
        return ao.Float8DynamicActivationFloat8WeightConfig(activation_dtype=fp8, weight_dtype=fp8,
                                                            granularity=ao.PerRow())
    raise ValueError(f"no quantization config for {mode.value}")


def is_quantized(tensor: torch.Tensor) -> bool:
    """A weight held by a tensor subclass (torchao's quantized tensors), not a plain float tensor."""
    return type(tensor) not in (torch.Tensor, torch.nn.Parameter)


def _plain_linear(module: torch.nn.Module, _name: str = "") -> bool:
    """Linear layers with a plain float weight: the ones to quantize (not already quantized or wrapped)."""
    return isinstance(module, torch.nn.Linear) and not is_quantized(module.weight)


def quantize_unets(components: Any, mode: str | QuantizeName, device: DeviceInfo) -> QuantizeName:
    """Quantize the Linear layers of `components.unet_garm` and `.unet_vton` in place; returns the mode.

    `none` changes nothing. A mode the device does not run and a missing torchao are UnsupportedErrors (exit 3),
    both before any weight changes. On a GPU each UNet is moved there first (torchao quantizes and picks its
    kernels on the device); the residency places the models afterwards as usual.
    """
    mode = choose_quantization(device, mode, _unet_dtype(components))
    if mode is QuantizeName.NONE:
        return mode
    ao = require_torchao()
    target = device.torch_device if device.is_gpu else None
    for unet in (components.unet_garm, components.unet_vton):
        ao.quantize_(unet, quantize_config(mode, ao, device), filter_fn=_plain_linear, device=target)
    return mode


def _unet_dtype(components: Any) -> torch.dtype | None:
    param = next(components.unet_vton.parameters(), None)
    return param.dtype if param is not None else None


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor holds; for a tensor subclass, the sum of its inner tensors (data, scales, zero points)."""
    if is_quantized(tensor) and hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


def module_weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of every parameter and buffer of a module, quantized ones at their stored size."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(tensor_bytes(t) for t in tensors)
