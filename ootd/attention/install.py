"""Putting an AttentionFn into diffusers models: every Attention module's processor gets it."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from ootd.attention.base import AttentionFn
from ootd.attention.processor import AttentionProcessor

logger = logging.getLogger(__name__)


def install_attention(models: Iterable[torch.nn.Module], attention: AttentionFn) -> None:
    """Route every diffusers `Attention` module in `models` through `attention`.

    A processor that already has an `attention` attribute (the fusion and garment-capture processors) keeps
    its own logic and just gets the new function; any other processor is replaced by AttentionProcessor.
    Modules with added key/value projections (AttnAddedKVProcessor blocks, unused by SD 1.5 UNets and the
    VAE) are left alone, since AttentionProcessor does not implement them.
    """
    from diffusers.models.attention_processor import Attention

    updated = replaced = skipped = 0
    for model in models:
        for module in model.modules():
            if not isinstance(module, Attention):
                continue
            processor = module.get_processor()
            if hasattr(processor, "attention"):
                processor.attention = attention
                updated += 1
            elif getattr(module, "added_kv_proj_dim", None) is not None:
                skipped += 1
            else:
                module.set_processor(AttentionProcessor(attention))
                replaced += 1
    logger.debug("attention installed: %d processors updated, %d replaced, %d with added kv left alone",
                 updated, replaced, skipped)
    if skipped:
        logger.warning("%d attention modules with added key/value projections keep their stock processor",
                       skipped)
