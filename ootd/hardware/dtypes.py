"""The one map between precision words (fp32, fp16, bf16) and torch dtypes."""

from __future__ import annotations

import torch

from ootd.settings import PrecisionName

DTYPES: dict[str, torch.dtype] = {
    PrecisionName.FP32: torch.float32, PrecisionName.FP16: torch.float16, PrecisionName.BF16: torch.bfloat16,
}
_NAMES = {dtype: str(name) for name, dtype in DTYPES.items()}


def dtype_name(dtype: torch.dtype | str) -> str:
    """fp32/fp16/bf16 for a torch dtype or its printed name (`float32`, `torch.bfloat16`); other dtypes as torch
    prints them, other words as given."""
    if isinstance(dtype, torch.dtype):
        return _NAMES.get(dtype, str(dtype))
    found = getattr(torch, str(dtype).removeprefix("torch."), None)
    return _NAMES.get(found, str(dtype)) if isinstance(found, torch.dtype) else str(dtype)


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A floating-point torch dtype from itself or its name (fp32, float16, torch.bfloat16, fp64, ...)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    found = DTYPES.get(key) or getattr(torch, "float" + key[2:] if key.startswith("fp") else key, None)
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise ValueError(f"unknown dtype {dtype!r}")
    return found


def itemsize(dtype: torch.dtype | str) -> int:
    """Bytes per element of a dtype or of its name."""
    return as_dtype(dtype).itemsize
