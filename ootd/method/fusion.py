"""Outfitting fusion on stock diffusers UNets (docs/upstream.md §5), through attention processors and hooks.

Garment side: forward pre-hooks on every transformer block of the garment UNet record the block's
input hidden states during its single run. Try-on side: each block's self-attention processor uses
person queries against keys/values of [person; norm1(garment)]. That gives the same numbers as the
original's full attention over the concatenated tokens (whose garment half of the output is thrown
away) with half the attention work, and the garment keys/values are projected once per call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from diffusers.models.attention import BasicTransformerBlock

from ootd.attention import AttentionFn, sdpa_attention


def transformer_blocks(unet: torch.nn.Module) -> dict[str, BasicTransformerBlock]:
    """Every transformer block by module name; the two UNets share the architecture, hence the names."""
    return {name: m for name, m in unet.named_modules() if isinstance(m, BasicTransformerBlock)}


class _AllCaptured(Exception):
    """Raised from the last block's hook to stop a UNet run whose remaining output nobody reads."""


@contextlib.contextmanager
def capture_block_inputs(unet: torch.nn.Module, *, stop_early: bool = False) -> Iterator[dict[str, torch.Tensor]]:
    """While active, record each transformer block's input hidden states (before its norm1).

    With `stop_early` the UNet call inside the block ends as soon as every input is recorded: the garment
    UNet's last transformer, output norm and output convolution (~8% of its work) are never used.
    """
    blocks = transformer_blocks(unet)
    features: dict[str, torch.Tensor] = {}
    handles = []
    for name, block in blocks.items():
        def hook(_module, args, kwargs, _name=name):  # noqa: ANN001, ANN202
            features[_name] = args[0] if args else kwargs["hidden_states"]
            if stop_early and len(features) == len(blocks):
                raise _AllCaptured
        handles.append(block.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield features
    except _AllCaptured:
        pass
    finally:
        for handle in handles:
            handle.remove()


def _float_dtype(*modules: torch.nn.Module, fallback: torch.dtype) -> torch.dtype:
    """The dtype of the first plain floating-point parameter of `modules` (quantized weights are skipped)."""
    for module in modules:
        for param in module.parameters():
            if type(param) in (torch.Tensor, torch.nn.Parameter) and param.is_floating_point():
                return param.dtype
    return fallback


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    batch, tokens, inner = x.shape
    return x.view(batch, tokens, heads, inner // heads).transpose(1, 2)


class FusionSelfAttnProcessor:
    """Self-attention of a try-on block: person queries, keys/values from person and garment tokens."""

    def __init__(self, norm: torch.nn.Module, attention: AttentionFn = sdpa_attention) -> None:
        self.norm = norm  # the try-on block's norm1, applied to the garment tokens too
        self.attention = attention
        self.garment_kv: tuple[torch.Tensor, torch.Tensor] | None = None  # (G, H, Ng, D) each
        self.sample_index: torch.Tensor | None = None  # try-on batch item -> garment batch item
        # token merging (ootd/speedups/token_merge.py): person tokens -> (fewer tokens, the function that restores them)
        self.merge: Callable[[torch.Tensor], tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]] | None = None

    def set_garment(self, attn, garment_hidden: torch.Tensor, sample_index: torch.Tensor) -> None:  # noqa: ANN001
        """Project the garment tokens once per call, in the block's float dtype (read from its norm: a quantized
        projection's weight is a tensor subclass whose dtype is torchao's to report)."""
        normed = self.norm(garment_hidden.to(_float_dtype(self.norm, attn, fallback=garment_hidden.dtype)))
        self.garment_kv = (_heads(attn.to_k(normed), attn.heads), _heads(attn.to_v(normed), attn.heads))
        self.sample_index = sample_index

    def clear(self) -> None:
        self.garment_kv = None
        self.sample_index = None

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states=None,  # noqa: ANN001
                 attention_mask=None, temb=None, *args, **kwargs) -> torch.Tensor:  # noqa: ANN001, ANN002, ANN003
        if self.garment_kv is None or self.sample_index is None:
            raise RuntimeError("try-on UNet called without garment features (use TryOnFusion.garment)")
        if attention_mask is not None or encoder_hidden_states is not None:
            raise RuntimeError("fusion self-attention takes neither a mask nor encoder states")
        unmerge = None
        if self.merge is not None:  # before the (linear) projections: the same as merging what they project
            hidden_states, unmerge = self.merge(hidden_states)
        query = _heads(attn.to_q(hidden_states), attn.heads)
        key = _heads(attn.to_k(hidden_states), attn.heads)
        value = _heads(attn.to_v(hidden_states), attn.heads)
        garment_k, garment_v = self.garment_kv
        if garment_k.shape[0] == 1 and self.sample_index.numel() == query.shape[0]:
            garment_k = garment_k.expand(query.shape[0], -1, -1, -1)
            garment_v = garment_v.expand(query.shape[0], -1, -1, -1)
        else:
            garment_k = garment_k.index_select(0, self.sample_index)
            garment_v = garment_v.index_select(0, self.sample_index)
        key = torch.cat([key, garment_k], dim=2)
        value = torch.cat([value, garment_v], dim=2)
        out = self.attention(query, key, value, attn.scale)
        batch, heads, tokens, dim = out.shape
        out = out.transpose(1, 2).reshape(batch, tokens, heads * dim).to(query.dtype)
        out = attn.to_out[1](attn.to_out[0](out))
        return out if unmerge is None else unmerge(out)


class TryOnFusion:
    """Owns the fusion processors of a try-on UNet and feeds them each call's garment features."""

    def __init__(self, unet_vton: torch.nn.Module, attention: AttentionFn = sdpa_attention) -> None:
        self.unet = unet_vton
        self.blocks = transformer_blocks(unet_vton)
        self.processors: dict[str, FusionSelfAttnProcessor] = {}
        for name, block in self.blocks.items():
            processor = FusionSelfAttnProcessor(block.norm1, attention)
            block.attn1.set_processor(processor)
            self.processors[name] = processor

    @contextlib.contextmanager
    def rows(self, sample_index: torch.Tensor) -> Iterator[None]:
        """Temporarily map a partial try-on batch (e.g. one guidance half) to its garment batch items."""
        saved = {name: p.sample_index for name, p in self.processors.items()}
        for processor in self.processors.values():
            processor.sample_index = sample_index
        try:
            yield
        finally:
            for name, processor in self.processors.items():
                processor.sample_index = saved[name]

    @contextlib.contextmanager
    def garment(self, features: dict[str, torch.Tensor], sample_index: torch.Tensor, *,
                grad: bool = False) -> Iterator[None]:
        """Garment keys/values for every block while active; `sample_index[i]` is the garment batch
        item that try-on batch item i attends to. `grad`: the projections stay in the autograd graph (training,
        ootd/training/objective.py: the loss reaches the garment UNet through them)."""
        missing = set(self.processors) - set(features)
        if missing:
            raise RuntimeError(f"garment features missing for blocks: {sorted(missing)[:3]}")
        try:
            with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
                for name, processor in self.processors.items():
                    processor.set_garment(self.blocks[name].attn1, features[name], sample_index)
            yield
        finally:
            for processor in self.processors.values():
                processor.clear()
