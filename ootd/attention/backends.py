"""The math, sdpa and flash backends (chunked lives in chunked.py): one signature, declared capabilities.

`supports(q, k, v)` answers for one call; `available(device_type, dtype)` answers up front whether the
backend can ever run on a device/dtype, so selection can drop it (auto) or refuse it (explicit choice)
before any call.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Callable
from typing import Any

import torch

from ootd.attention.base import BackendUnavailable, default_scale, original_sdpa, shape_problem
from ootd.settings import AttentionName

HALF = (torch.float16, torch.bfloat16)


def score_elements(q: torch.Tensor, k: torch.Tensor) -> int:
    """Number of entries of the full (B, H, Nq, Nk) score matrix for this call."""
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    return math.prod(lead) * q.shape[-2] * k.shape[-2]


class MathBackend:
    """Reference: softmax(q k^T * scale) v, materialising the score matrix (fp32 for half inputs).

    Quadratic memory, so only used when named, or (with `max_score_bytes`) as a last resort for small calls.
    """

    name = AttentionName.MATH.value
    supports_mask = False

    def __init__(self, max_score_bytes: int | None = None) -> None:
        self.max_score_bytes = max_score_bytes

    def available(self, device_type: str, dtype: torch.dtype) -> str | None:
        return None if dtype.is_floating_point else f"dtype {dtype} is not floating point"

    def supports(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
        problem = shape_problem(q, k, v)
        if problem is not None:
            return problem
        if self.max_score_bytes is not None:
            nbytes = score_elements(q, k) * _compute_dtype(q.dtype).itemsize
            if nbytes > self.max_score_bytes:
                return f"score matrix over the {self.max_score_bytes >> 20} MiB limit for math"
        return None

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
    ) -> torch.Tensor:
        ct = _compute_dtype(q.dtype)
        scores = torch.matmul(q.to(ct), k.to(ct).transpose(-1, -2)) * default_scale(q, scale)
        probs = torch.softmax(scores, dim=-1)
        del scores
        return torch.matmul(probs, v.to(ct)).to(q.dtype)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in HALF else dtype


def _fused_sdpa_kernels() -> list[Any]:
    """The fused SDPA kernels this torch knows (never MATH): restricting to them turns a quadratic fallback
    into an error we can route around."""
    from torch.nn.attention import SDPBackend

    names = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
    return [getattr(SDPBackend, n) for n in names if hasattr(SDPBackend, n)]


class SdpaBackend:
    """PyTorch SDPA restricted to its fused kernels (flash / memory-efficient / cuDNN; CPU has a fused flash).

    A call no fused kernel accepts raises BackendUnavailable instead of silently running the math kernel
    (quadratic memory, and fp32 upcast since torch 2.5). MPS is declared unsupported: its SDPA builds the
    full score matrix in the torch versions we target. `max_head_dim` comes from the device profile
    (e.g. 256 on gfx11xx, where larger head dims have given wrong results).
    """

    name = AttentionName.SDPA.value
    supports_mask = False
    device_types = ("cpu", "cuda")

    def __init__(self, max_head_dim: int | None = None) -> None:
        self.max_head_dim = max_head_dim

    def available(self, device_type: str, dtype: torch.dtype) -> str | None:
        try:
            from torch.nn.attention import sdpa_kernel  # noqa: F401
        except ImportError:
            return "this torch has no torch.nn.attention.sdpa_kernel"
        if device_type not in self.device_types:
            return f"fused SDPA kernels are not used on {device_type}"
        allowed = (torch.float32, *HALF) + ((torch.float64,) if device_type == "cpu" else ())
        if dtype not in allowed:
            return f"dtype {dtype} not supported by fused SDPA on {device_type}"
        return None

    def supports(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
        problem = shape_problem(q, k, v) or self.available(q.device.type, q.dtype)
        if problem is not None:
            return problem
        head_dim = max(q.shape[-1], v.shape[-1])
        if self.max_head_dim is not None and head_dim > self.max_head_dim:
            return f"head dim over {self.max_head_dim}"
        return None

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
    ) -> torch.Tensor:
        from torch.nn.attention import sdpa_kernel

        try:
            with sdpa_kernel(_fused_sdpa_kernels()):
                return original_sdpa()(q, k, v, scale=scale)
        except RuntimeError as exc:
            if isinstance(exc, torch.OutOfMemoryError) or "No available kernel" not in str(exc):
                raise
            raise BackendUnavailable("no fused SDPA kernel accepts this input") from exc


def flash_installed() -> bool:
    """Whether the flash_attn package is importable in principle (not imported here: it is heavy)."""
    return importlib.util.find_spec("flash_attn") is not None


class FlashBackend:
    """flash-attn's flash_attn_func (CUDA, or ROCm via CK/Triton), fp16/bf16, head dim <= 256, no mask.

    Imported on first use, so installing ootd never requires it.
    """

    name = AttentionName.FLASH.value
    supports_mask = False

    def __init__(self, max_head_dim: int = 256) -> None:
        self.max_head_dim = max_head_dim
        self._fn: Callable[..., torch.Tensor] | None = None
        self._import_error: str | None = None

    def _load(self) -> Callable[..., torch.Tensor] | None:
        if self._fn is None and self._import_error is None:
            try:
                self._fn = importlib.import_module("flash_attn").flash_attn_func
            except Exception as exc:  # ImportError, or an ABI mismatch surfacing as OSError/RuntimeError
                self._import_error = f"flash_attn not importable ({type(exc).__name__})"
        return self._fn

    def available(self, device_type: str, dtype: torch.dtype) -> str | None:
        if not flash_installed():
            return "flash_attn is not installed"
        if device_type != "cuda":
            return "flash_attn needs a CUDA or ROCm GPU"
        if dtype not in HALF:
            return "flash_attn needs fp16 or bf16"
        return None

    def supports(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
        problem = shape_problem(q, k, v)
        if problem is not None:
            return problem
        if q.device.type != "cuda":
            return "flash_attn needs a CUDA or ROCm GPU"
        if q.dtype not in HALF:
            return "flash_attn needs fp16 or bf16"
        if q.shape[-1] > self.max_head_dim:
            return f"head dim over {self.max_head_dim}"
        if v.shape[-1] != q.shape[-1]:
            return "flash_attn needs equal q and v head dims"
        same_batch = q.shape[0] == k.shape[0] == v.shape[0]
        if not same_batch or k.shape[1] != v.shape[1] or q.shape[1] % k.shape[1]:
            return "flash_attn needs equal batch and a head count divisible by the kv heads"
        if self._load() is None:
            return self._import_error
        return None

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
    ) -> torch.Tensor:
        fn = self._load()
        if fn is None:
            raise BackendUnavailable(self._import_error or "flash_attn not importable")
        try:
            out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                     dropout_p=0.0, softmax_scale=scale, causal=False)
        except RuntimeError as exc:
            if isinstance(exc, torch.OutOfMemoryError):
                raise
            raise BackendUnavailable(f"flash_attn failed: {str(exc).splitlines()[0][:120]}") from exc
        return out.transpose(1, 2)
