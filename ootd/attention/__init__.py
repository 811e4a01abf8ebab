"""Attention backends behind one signature: attention(q, k, v, scale) with SDPA layout (B, H, N, D).

Typical use (see select.py for the policy):

    attention = build_attention("auto", info, precision.unet)
    install_attention([unet_garm, unet_vton, vae], attention)
    with patch_sdpa(attention):
        ...  # transformers CLIP encoders run through `attention` too
    log(attention.describe())  # which backend served how many calls
"""

from __future__ import annotations

from ootd.attention.backends import FlashBackend, MathBackend, SdpaBackend, flash_installed
from ootd.attention.base import AttentionFn, Backend, BackendUnavailable, original_sdpa, sdpa_attention
from ootd.attention.chunked import ChunkedBackend, plan_chunks
from ootd.attention.dispatch import Dispatcher
from ootd.attention.install import install_attention
from ootd.attention.processor import AttentionProcessor
from ootd.attention.sdpa_patch import patch_sdpa
from ootd.attention.select import (
    SMALL_MATH_BYTES,
    build_attention,
    check_backend,
    make_backend,
)

__all__ = [
    "SMALL_MATH_BYTES", "AttentionFn", "AttentionProcessor", "Backend",
    "BackendUnavailable",
    "ChunkedBackend", "Dispatcher", "FlashBackend", "MathBackend", "SdpaBackend", "build_attention",
    "check_backend", "flash_installed", "install_attention", "make_backend", "original_sdpa", "patch_sdpa",
    "plan_chunks", "sdpa_attention",
]
