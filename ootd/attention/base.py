"""What every attention backend shares: the call signature, the capability check, the unpatched SDPA.

Layout everywhere is PyTorch SDPA's: q (B, H, Nq, D), k (B, H, Nk, D), v (B, H, Nk, Dv) -> (B, H, Nq, Dv).
No backend takes a mask, dropout or causal flag: the try-on UNet and the CLIP vision tower need none, and
callers with a mask use PyTorch SDPA directly (see processor.py and sdpa_patch.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float | None], torch.Tensor]

# Attribute a patched F.scaled_dot_product_attention carries, pointing at the real one (sdpa_patch.py).
ORIGINAL_ATTR = "__ootd_original_sdpa__"


class BackendUnavailable(RuntimeError):
    """A backend cannot serve this call after all (e.g. no fused kernel accepted it); try the next one."""


@runtime_checkable
class Backend(Protocol):
    """An attention implementation that says up front which calls it can serve.

    Ours also have `available(device_type, dtype) -> str | None` (can it ever run there?), which selection
    uses when present; a test double may leave it out.
    """

    name: str
    supports_mask: bool  # always False for ours; declared so a caller never assumes otherwise

    def supports(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
        """None if this call can be served, else a short reason (used as a log key, keep it stable)."""
        ...

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
    ) -> torch.Tensor:
        ...


def original_sdpa() -> Callable[..., torch.Tensor]:
    """torch's own scaled_dot_product_attention, even while patch_sdpa has replaced it (no recursion)."""
    fn = F.scaled_dot_product_attention
    return getattr(fn, ORIGINAL_ATTR, fn)


def default_scale(q: torch.Tensor, scale: float | None) -> float:
    """SDPA's default: 1/sqrt(head_dim)."""
    return float(scale) if scale is not None else q.shape[-1] ** -0.5


def shape_problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Checks every backend needs: matching dtypes/devices, 4-D, key/value agreement."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "inputs are not 4-D (B, H, N, D)"
    if not (q.dtype == k.dtype == v.dtype):
        return "q, k, v dtypes differ"
    if not (q.device == k.device == v.device):
        return "q, k, v on different devices"
    if not q.dtype.is_floating_point:
        return f"dtype {q.dtype} is not floating point"
    if q.shape[-1] != k.shape[-1]:
        return "q and k head dims differ"
    if k.shape[-2] != v.shape[-2]:
        return "k and v lengths differ"
    if k.shape[-2] == 0:
        return "no keys"
    return None


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """PyTorch's scaled_dot_product_attention, no mask, no dropout (kernel chosen by PyTorch)."""
    return original_sdpa()(q, k, v, scale=scale)
