"""LoRA on the UNets' attention projections, as diffusers' own LoRA training scripts add it (peft's LoraConfig through
the UNet's `add_adapter`, Gaussian A and zero B, so a fresh adapter changes nothing), and its state in and out.

The targets are the query, key, value and output projections of every transformer block's self- and cross-attention.
The garment UNet's last transformer block is left out: the try-on UNet reads the inputs of the garment blocks
(docs/upstream.md §5), so nothing the last block computes reaches the try-on (its run is even cut short there).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from ootd.method.fusion import transformer_blocks

PROJECTIONS = ("to_q", "to_k", "to_v", "to_out.0")
ADAPTER = "default"  # the peft adapter name during training
_ORDER = {"down_blocks": 0, "mid_block": 1, "up_blocks": 2}  # UNet2DConditionModel runs its blocks in this order


def _run_order(name: str) -> tuple:
    parts = name.split(".")
    return (_ORDER.get(parts[0], 3), *[int(p) if p.isdigit() else p for p in parts[1:]])


def target_modules(unet: torch.nn.Module, *, skip_last_block: bool = False) -> list[str]:
    """The attention projections LoRA adapts in one UNet, by module name."""
    blocks = sorted(transformer_blocks(unet), key=_run_order)
    if skip_last_block:
        blocks = blocks[:-1]
    return [f"{block}.{attn}.{proj}" for block in blocks for attn in ("attn1", "attn2") for proj in PROJECTIONS]


def add_lora(unet: torch.nn.Module, targets: list[str], rank: int, alpha: float, seed: int) -> list[torch.nn.Parameter]:
    """Inject a fresh adapter (A drawn from `seed`, B zero) and return its parameters, in fp32 and trainable; the
    base weights stay frozen."""
    from diffusers.training_utils import cast_training_params
    from peft import LoraConfig

    unet.requires_grad_(False)
    config = LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights="gaussian", target_modules=targets)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        unet.add_adapter(config, adapter_name=ADAPTER)
    finally:
        torch.random.set_rng_state(state)
    cast_training_params(unet, dtype=torch.float32)  # the trainable ones only (peft made them trainable)
    return [p for p in unet.parameters() if p.requires_grad]


def lora_state(unet: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors of one UNet, peft state dict keys (`<module>.lora_A.weight`), detached copies."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(unet, adapter_name=ADAPTER).items()}


def load_lora_state(unet: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Put saved adapter tensors back (a resume): every key must land."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(unet, dict(state), adapter_name=ADAPTER)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise ValueError(f"adapter tensors without a place in the UNet: {unexpected[:3]}")
    missing = [k for k in getattr(result, "missing_keys", []) or [] if re.search(r"\.lora_[AB]\.", k)]
    if missing:
        raise ValueError(f"adapter tensors missing from the checkpoint: {missing[:3]}")


AdapterTensors = Mapping[str, Mapping[str, torch.Tensor]]  # UNet name -> peft state dict (ootd/weights/lora.py)


def stack(parts: list[tuple[AdapterTensors, int, float, float]]) -> tuple[dict[str, dict[str, torch.Tensor]], int]:
    """Several adapters (tensors, rank, alpha, scale) as one whose change is the sum of theirs: its rank is the sum
    of their ranks and its alpha that rank (a scaling of 1); A stacked, B side by side times each adapter's own
    alpha / rank x scale. A module an adapter leaves alone gets zero rows and columns there (no change)."""
    total = sum(rank for _, rank, _, _ in parts)
    out: dict[str, dict[str, torch.Tensor]] = {}
    for unet in dict.fromkeys(name for tensors, *_ in parts for name in tensors):
        states = [tensors.get(unet, {}) for tensors, *_ in parts]
        modules = sorted({key.rsplit(".lora_", 1)[0] for state in states for key in state})
        stacked: dict[str, torch.Tensor] = {}
        for module in modules:
            a_key, b_key = f"{module}.lora_A.weight", f"{module}.lora_B.weight"
            known = next(state for state in states if a_key in state)
            features_in, features_out = known[a_key].shape[1], known[b_key].shape[0]
            a_rows, b_columns = [], []
            for state, (_, rank, alpha, scale) in zip(states, parts, strict=True):
                if a_key in state:
                    a_rows.append(state[a_key].float())
                    b_columns.append(state[b_key].float() * (alpha / rank * scale))
                else:
                    a_rows.append(torch.zeros(rank, features_in))
                    b_columns.append(torch.zeros(features_out, rank))
            stacked[a_key], stacked[b_key] = torch.cat(a_rows), torch.cat(b_columns, dim=1)
        out[unet] = stacked
    return out, total
