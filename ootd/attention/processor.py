"""A generic diffusers attention processor that runs its attention through one of our AttentionFns.

Same semantics as diffusers' AttnProcessor2_0 for self- and cross-attention: 4-D (B, C, H, W) inputs,
spatial_norm, group_norm, norm_cross, qk norms, residual_connection and rescale_output_factor. One
difference: it passes `attn.scale` explicitly (AttnProcessor2_0 lets SDPA use 1/sqrt(head_dim), which is the
same number unless a model disables scale_qk).

Masks: our backends take none, so a call with an attention mask runs PyTorch's own SDPA with the mask
(torch picks the kernel). Neither the try-on UNet nor the VAE passes a mask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ootd.attention.base import AttentionFn, original_sdpa, sdpa_attention

if TYPE_CHECKING:
    from diffusers.models.attention_processor import Attention


class AttentionProcessor:
    """Processor for diffusers `Attention` modules; `attention` can be swapped at any time."""

    def __init__(self, attention: AttentionFn = sdpa_attention) -> None:
        self.attention = attention

    def __call__(
        self,
        attn: Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        temb: torch.Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)

        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch, channels, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch, channels, height * width).transpose(1, 2)

        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        batch, source_len, _ = context.shape

        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, source_len, batch)
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])

        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            context = hidden_states
        elif attn.norm_cross:
            context = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key = attn.to_k(context)
        value = attn.to_v(context)

        head_dim = key.shape[-1] // attn.heads
        query = query.view(batch, -1, attn.heads, head_dim).transpose(1, 2)
        key = key.view(batch, -1, attn.heads, head_dim).transpose(1, 2)
        value = value.view(batch, -1, attn.heads, head_dim).transpose(1, 2)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        if attention_mask is None:
            out = self.attention(query, key, value, attn.scale)
        else:
            out = original_sdpa()(query, key, value, attn_mask=attention_mask, scale=attn.scale)

        out = out.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim).to(query.dtype)
        out = attn.to_out[0](out)
        out = attn.to_out[1](out)
        if input_ndim == 4:
            out = out.transpose(-1, -2).reshape(batch, channels, height, width)
        if attn.residual_connection:
            out = out + residual
        return out / attn.rescale_output_factor
