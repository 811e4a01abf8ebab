"""A generic diffusers attention processor that runs its attention through one of our AttentionFns.

Same semantics as diffusers' AttnProcessor2_0 for self- and cross-attention: 4-D (B, C, H, W) inputs,
spatial_norm, group_norm, norm_cross, qk norms, residual_connection and rescale_output_factor. One
difference: it passes `attn.scale` explicitly (AttnProcessor2_0 lets SDPA use 1/sqrt(head_dim), which is the
same number unless a model disables scale_qk).

Masks: our backends take none, so a call with an attention mask runs PyTorch's own SDPA with the mask
(torch picks the kernel). Neither the try-on UNet nor the VAE passes a mask.

Cross-attention on a short context (the UNets' prompt has 2 or 4 tokens) is folded: with T keys per head,
q.k = x.(W_q,h^T k) and to_out(sum_j p_j v_j) = sum_j p_j (W_o,h v_j) + b, so the query and output
projections (C x C per token each) become H*T dot products per token each. The same numbers up to float
rounding, for ~1/10 of the work of those two projections (1.8-3% of a try-on step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ootd.attention.backends import HALF
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
        if folds(attn, hidden_states, encoder_hidden_states, attention_mask):
            return folded_cross_attention(attn, hidden_states, encoder_hidden_states)
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

        if encoder_hidden_states is None:
            context = hidden_states
        elif attn.norm_cross:
            context = attn.norm_encoder_hidden_states(encoder_hidden_states)
        query, key, value = project_heads(attn, hidden_states, context, batch)
        head_dim = key.shape[-1]

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


def project_heads(attn: Attention, hidden_states: torch.Tensor, context: torch.Tensor,
                  batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries of `hidden_states`, keys and values of `context`, per head: (B, H, tokens, d) each, normalised
    where the module says so."""
    query = attn.to_q(hidden_states)
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
    return query, key, value


def folds(attn: Attention, hidden_states: torch.Tensor, context: torch.Tensor | None,
          attention_mask: torch.Tensor | None) -> bool:
    """Whether this call is a plain cross-attention whose context is short enough for the fold to pay off:
    H*T at most a quarter of the inner width, so the fold does at most ~1/4 of the projections' work."""
    if context is None or attention_mask is not None or hidden_states.ndim != 3 or context.ndim != 3:
        return False
    if (attn.spatial_norm is not None or attn.group_norm is not None or attn.norm_cross
            or attn.norm_q is not None or attn.norm_k is not None or attn.residual_connection
            or attn.rescale_output_factor != 1.0):
        return False
    # plain Linear layers with plain weights only: a wrapped one (e.g. with LoRA weights) computes more than its
    # .weight says, and a quantized weight (a tensor subclass, ootd/speedups/quantize.py) is not what its matmul uses
    if any(type(layer) is not torch.nn.Linear or type(layer.weight) not in (torch.Tensor, torch.nn.Parameter)
           for layer in (attn.to_q, attn.to_out[0])):
        return False
    inner = attn.to_q.out_features
    return inner % attn.heads == 0 and attn.heads * context.shape[1] * 4 <= inner


def folded_cross_attention(attn: Attention, hidden_states: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """softmax((x W_q^T + b_q) k^T * scale) v W_o^T + b_o, per head, without projecting x to queries or the
    attention output back through W_o: the context side is projected instead (see the module docstring)."""
    heads, batch, tokens = attn.heads, context.shape[0], context.shape[1]
    if batch != hidden_states.shape[0]:
        raise RuntimeError(f"context batch {batch} does not match hidden states batch {hidden_states.shape[0]}")
    ct = torch.float32 if hidden_states.dtype in HALF else hidden_states.dtype
    key = attn.to_k(context).to(ct).view(batch, tokens, heads, -1)  # (B, T, H, d)
    value = attn.to_v(context).to(ct).view(batch, tokens, heads, -1)
    head_dim = key.shape[-1]
    w_q = attn.to_q.weight.to(ct).view(heads, head_dim, -1)  # (H, d, C)
    w_o = attn.to_out[0].weight.to(ct).view(-1, heads, head_dim)  # (C_out, H, d)
    # column h*T + j of `fold_q` scores query x against key j of head h; row h*T + j of `fold_o` is that
    # key's value through head h's slice of the output projection
    fold_q = torch.einsum("bthd,hdc->bcht", key, w_q).reshape(batch, -1, heads * tokens) * attn.scale
    fold_o = torch.einsum("bthd,ohd->bhto", value, w_o).reshape(batch, heads * tokens, -1)
    logits = torch.bmm(hidden_states, fold_q.to(hidden_states.dtype)).to(ct)  # (B, N, H*T)
    if attn.to_q.bias is not None:
        bias_q = attn.to_q.bias.to(ct).view(heads, head_dim)
        logits = logits + torch.einsum("hd,bthd->bht", bias_q, key).reshape(batch, 1, -1) * attn.scale
    probs = logits.view(*logits.shape[:2], heads, tokens).softmax(dim=-1).view_as(logits)
    out = torch.bmm(probs.to(hidden_states.dtype), fold_o.to(hidden_states.dtype))
    if attn.to_out[0].bias is not None:
        out = out + attn.to_out[0].bias
    return attn.to_out[1](out)
