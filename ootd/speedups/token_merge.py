"""Token merging in the try-on UNet's fusion self-attention (ToMe for Stable Diffusion): an opt-in speed mode
that changes the output.

At the UNet's finest attention level (the latent's own h x w tokens on the released UNets, ToMe-SD's
max_downsample=1) the fusion self-attention runs on fewer person tokens: the tokens are split into destinations
(the top-left token of every 2x2 cell of the level's grid) and sources (the rest); the `ratio` x N sources most
similar to a destination (cosine similarity of the hidden states) are averaged into their best destination, the
attention runs with N - r queries against [N - r person; Ng garment] keys/values (the garment tokens stay whole),
and each destination's output is copied back to the tokens merged into it. Merging happens before the q/k/v
projections (they are affine, so averaging first is the same as averaging their outputs). Each batch item is
matched on its own, so splitting the guidance batch (`TryOnFusion.rows`) gives the same result.
Matching comes from the `tomesd` package (MIT, the paper authors' code, torch only; its diffusers patching is not
used) with its fixed destination choice (`no_rand`), so a seed always gives the same image. Ratio 0 installs
nothing: the exact path.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import torch
from tomesd.merge import bipartite_soft_matching_random2d

from ootd.method.fusion import TryOnFusion
from ootd.speedups.modes import TokenMerge

STRIDE = (2, 2)  # (sx, sy): one destination token per 2x2 cell of the level's grid

Unmerge = Callable[[torch.Tensor], torch.Tensor]


def merge_tokens(x: torch.Tensor, grid_hw: tuple[int, int], ratio: float) -> tuple[torch.Tensor, Unmerge]:
    """Merge int(ratio * N) of the N = h * w tokens of `x` (B, N, C) into their most similar destination, each
    batch item on its own; returns the B x (N - r) merged tokens and the function that spreads (B, N - r, C')
    outputs back to N tokens. The similarity is that of `x` itself."""
    height, width = grid_hw
    if x.shape[1] != height * width:
        raise RuntimeError(f"token merging: {x.shape[1]} tokens do not form the {height}x{width} grid")
    removed = int(x.shape[1] * ratio)
    merge, unmerge = bipartite_soft_matching_random2d(x, width, height, *STRIDE, removed, no_rand=True)
    return merge(x, mode="mean"), unmerge


def level_grid(latent_hw: tuple[int, int], downsample: int) -> tuple[int, int]:
    """The token grid of the UNet level `downsample` times smaller than the latent (each stride-2 convolution
    with padding 1 rounds up)."""
    height, width = int(latent_hw[0]), int(latent_hw[1])
    while downsample > 1:
        height, width, downsample = -(-height // 2), -(-width // 2), downsample // 2
    return height, width


def block_downsamples(fusion: TryOnFusion) -> dict[str, int]:
    """How much smaller than the latent each fusion block's level is, from its place in the UNet."""
    levels = {"down_blocks": lambda i: i, "up_blocks": lambda i: len(fusion.unet.up_blocks) - 1 - i,
              "mid_block": lambda _: len(fusion.unet.down_blocks) - 1}
    found = {}
    for name in fusion.processors:
        match = re.match(r"(down_blocks|up_blocks|mid_block)\.?(\d*)\.", name)
        if match is None:
            raise RuntimeError(f"token merging: no UNet level for transformer block {name}")
        found[name] = 2 ** levels[match[1]](int(match[2] or 0))
    return found


class _Merger:
    """One processor's merge: the level's grid and the ratio; matched anew on each call's hidden states."""

    def __init__(self, grid_hw: tuple[int, int], ratio: float) -> None:
        self.grid_hw = grid_hw
        self.ratio = ratio

    def __call__(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, Unmerge]:
        return merge_tokens(hidden_states, self.grid_hw, self.ratio)


@contextlib.contextmanager
def token_merging(fusion: TryOnFusion, merge: TokenMerge, latent_hw: tuple[int, int],
                  max_downsample: int | None = None) -> Iterator[list[str]]:
    """Merge `merge.ratio` of the person tokens in the fusion self-attention of the blocks at levels at most
    `max_downsample` times smaller than the latent (None: the finest level that has attention) for one call;
    yields the names of the blocks it merges in. Ratio 0 installs nothing."""
    if not merge.on:
        yield []
        return
    ratio = merge.ratio
    downsamples = block_downsamples(fusion)
    limit = min(downsamples.values(), default=0) if max_downsample is None else max_downsample
    chosen = {name: d for name, d in downsamples.items() if d <= limit}
    try:
        for name, downsample in chosen.items():
            fusion.processors[name].merge = _Merger(level_grid(latent_hw, downsample), ratio)
        yield list(chosen)
    finally:
        for name in chosen:
            fusion.processors[name].merge = None
