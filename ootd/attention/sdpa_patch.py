"""A scoped, reversible replacement of torch.nn.functional.scaled_dot_product_attention.

Used to route code we do not own (the transformers CLIP encoders) through our attention. Only plain calls
(4-D, no mask, no dropout, not causal, same heads for q/k/v) are routed; everything else goes to the real
function. Nothing is patched at import time; the original is restored on exit, also on exceptions.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from ootd.attention.base import ORIGINAL_ATTR, AttentionFn


def _routable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any, dropout_p: float,
              is_causal: bool) -> bool:
    if attn_mask is not None or dropout_p != 0.0 or is_causal:
        return False
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return False
    return q.shape[:2] == k.shape[:2] == v.shape[:2]


def _make_wrapper(
    attention: AttentionFn, original: Callable[..., torch.Tensor]
) -> Callable[..., torch.Tensor]:
    # A backend that itself calls F.scaled_dot_product_attention must reach the original, not recurse.
    busy = threading.local()

    @functools.wraps(original)
    def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                     attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                     is_causal: bool = False, scale: float | None = None,
                                     enable_gqa: bool = False) -> torch.Tensor:
        nested = getattr(busy, "active", False)
        if nested or not _routable(query, key, value, attn_mask, dropout_p, is_causal):
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)
        busy.active = True
        try:
            return attention(query, key, value, scale)
        finally:
            busy.active = False

    setattr(scaled_dot_product_attention, ORIGINAL_ATTR, original)
    return scaled_dot_product_attention


@contextlib.contextmanager
def patch_sdpa(attention: AttentionFn) -> Iterator[None]:
    """Within the block, plain F.scaled_dot_product_attention calls run `attention`."""
    current = F.scaled_dot_product_attention
    original = getattr(current, ORIGINAL_ATTR, current)
    F.scaled_dot_product_attention = _make_wrapper(attention, original)
    try:
        yield
    finally:
        F.scaled_dot_product_attention = current
