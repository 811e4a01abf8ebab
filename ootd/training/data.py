"""Which cached pairs each optimizer step trains on, and the micro-batches a worker loads.

The order is a function of (seed, step) alone: epoch e is a permutation drawn from (seed, e), and the global batch
of step s is the next `global batch` positions of that sequence. A resumed run, or a run spread over workers,
therefore trains on exactly the pairs an uninterrupted single-worker run would, with the same draws
(ootd/training/objective.py `draw`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ootd.training.cache import read_entry


@dataclass(frozen=True)
class Layout:
    """How a step's global batch is cut: per forward pass, per step, over the workers."""

    batch_size: int  # per worker and forward pass
    accumulation: int
    workers: int = 1

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.accumulation * self.workers


def _epoch_order(seed: int, epoch: int, count: int) -> list[int]:
    generator = torch.Generator().manual_seed((seed * 7_919 + epoch * 104_729 + 17) % (2**63 - 1))
    return torch.randperm(count, generator=generator).tolist()


def step_batches(step: int, count: int, layout: Layout, rank: int, seed: int) -> list[list[tuple[int, int]]]:
    """For optimizer step `step` (from 0): per micro-batch of worker `rank`, the (entry number, index in the
    global batch) of each sample."""
    start = step * layout.global_batch
    orders: dict[int, list[int]] = {}
    batches = []
    for micro in range(layout.accumulation):
        batch = []
        for i in range(layout.batch_size):
            j = (micro * layout.workers + rank) * layout.batch_size + i
            position = start + j
            epoch = position // count
            if epoch not in orders:
                orders[epoch] = _epoch_order(seed, epoch, count)
            batch.append((orders[epoch][position % count], j))
        batches.append(batch)
    return batches


def load_batch(cache: Path, keys: Sequence[str], device: torch.device) -> dict[str, torch.Tensor]:
    """The tensors of some entries, stacked on `device` (prompt embeddings, latents; the masks stay behind)."""
    entries = [read_entry(cache, key) for key in keys]
    return {name: torch.stack([e[name] for e in entries]).to(device) for name in ("target", "masked", "garment",
                                                                                  "prompt")}
