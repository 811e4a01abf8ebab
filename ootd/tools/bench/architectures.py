"""The component architectures, declared once: the released sizes ("full") and a few-channel version of them
("tiny"), plus the hand-made CLIP tokenizer vocabulary and the scheduler file of the released folder.

`scripts/make_tiny_checkpoints.py` writes the tiny tree from these, the benchmark builds random-weight models
from them (ootd/tools/bench/random_weights.py) and tests build stand-alone modules from them. The released UNet
and VAE configs belong to the memory planner (its constants were measured on them) and are re-exported here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ootd.settings import Category
from ootd.weights.released import RELEASED_UNET_CONFIG, RELEASED_VAE_CONFIG

# The Stable Diffusion 1.5 scheduler file the released folder carries (read by PNDMScheduler, docs/upstream.md §4).
SD15_SCHEDULER_CONFIG: dict[str, Any] = {
    "_class_name": "PNDMScheduler",
    "_diffusers_version": "0.6.0",
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "num_train_timesteps": 1000,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "trained_betas": None,
    "clip_sample": False,
}


@dataclass(frozen=True)
class Architecture:
    """Configs of the four networks. The UNet config has no `in_channels` (4 garment, 8 try-on); the text
    config has no token ids (they come from the tokenizer, see `text_config`)."""

    unet: dict[str, Any]
    vae: dict[str, Any]
    text: dict[str, Any]
    vision: dict[str, Any]


TINY_HIDDEN = 32  # text hidden size = CLIP projection size = UNet cross-attention size

TINY = Architecture(
    unet={
        "sample_size": 64, "out_channels": 4, "layers_per_block": 1, "block_out_channels": (32, 64),
        # attention at the second level only (as SDXL does), which keeps CPU tests fast
        "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D"),
        "up_block_types": ("CrossAttnUpBlock2D", "UpBlock2D"),
        "cross_attention_dim": TINY_HIDDEN, "attention_head_dim": 2, "norm_num_groups": 32,
    },
    vae={
        "in_channels": 3, "out_channels": 3, "latent_channels": 4, "down_block_types": ("DownEncoderBlock2D",) * 4,
        "up_block_types": ("UpDecoderBlock2D",) * 4, "block_out_channels": (8, 8, 16, 16), "layers_per_block": 1,
        "norm_num_groups": 4, "sample_size": 64,
    },
    text={"hidden_size": TINY_HIDDEN, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4,
          "max_position_embeddings": 77, "projection_dim": TINY_HIDDEN},
    vision={"hidden_size": TINY_HIDDEN, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4,
            "image_size": 224, "patch_size": 32, "projection_dim": TINY_HIDDEN},
)

# SD1.5 UNets, the SD VAE, the SD1.5 CLIP text encoder, CLIP ViT-L/14 vision (docs/upstream.md §1).
FULL = Architecture(
    unet=RELEASED_UNET_CONFIG,
    vae=RELEASED_VAE_CONFIG,
    text={"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
          "max_position_embeddings": 77, "projection_dim": 768, "hidden_act": "quick_gelu", "vocab_size": 49408},
    vision={"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
            "image_size": 224, "patch_size": 14, "projection_dim": 768, "hidden_act": "quick_gelu"},
)

ARCHITECTURES = {"tiny": TINY, "full": FULL}

# The text tower of the tiny tree's CLIP folder: CLIPModel needs one, the pipeline reads only the vision tower.
CLIP_TEXT_TOWER_TINY: dict[str, Any] = {
    "vocab_size": 600, "hidden_size": TINY_HIDDEN, "intermediate_size": 37, "num_hidden_layers": 1,
    "num_attention_heads": 4, "max_position_embeddings": 77, "bos_token_id": 598, "eos_token_id": 599,
    "pad_token_id": 599, "projection_dim": TINY_HIDDEN,
}


def text_config(arch: Architecture, tokenizer_size: int) -> dict[str, Any]:
    """The text encoder's config for a tokenizer of `tokenizer_size` tokens (the vocabulary ends with the start
    and end tokens, the end token doubling as padding); the full size keeps CLIP's own vocabulary size."""
    ids = {"bos_token_id": tokenizer_size - 2, "eos_token_id": tokenizer_size - 1, "pad_token_id": tokenizer_size - 1}
    return {"vocab_size": tokenizer_size, **arch.text, **ids}


# ---------------------------------------------------------------------------------------------- tokenizer


def write_json(path: Path, data: dict) -> None:
    """A JSON file as the checkpoints tree stores them (indented, trailing newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _byte_alphabet() -> list[str]:
    """CLIP's byte-level BPE alphabet: a printable stand-in for each of the 256 bytes."""
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def _vocabulary() -> tuple[list[str], list[str]]:
    """Every byte symbol (alone and word-final), plus merges that make each category prompt word one token."""
    alphabet = _byte_alphabet()
    vocab = alphabet + [c + "</w>" for c in alphabet]
    merges: list[str] = []
    for word in (category.prompt_word for category in Category):
        symbols = [*word[:-1], word[-1] + "</w>"]
        current = symbols[0]
        for nxt in symbols[1:]:
            merges.append(f"{current} {nxt}")
            current += nxt
            if current not in vocab:
                vocab.append(current)
    return [*vocab, "<|startoftext|>", "<|endoftext|>"], merges


def write_tokenizer(folder: Path) -> int:
    """Write the small hand-made CLIP tokenizer into `folder`; return its vocabulary size."""
    vocab, merges = _vocabulary()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({tok: i for i, tok in enumerate(vocab)}, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
               "unk_token": "<|endoftext|>"}
    write_json(folder / "special_tokens_map.json", special)
    write_json(folder / "tokenizer_config.json", {**special, "add_prefix_space": False, "do_lower_case": True,
                                                  "errors": "replace", "model_max_length": 77,
                                                  "tokenizer_class": "CLIPTokenizer"})
    return len(vocab)
