"""A stop asked of Ray Train workers by their driver (`ootd train run --engine ray` got Ctrl-C or SIGTERM).

A signal reaches the driver only, and killing the workers would lose the steps since the last checkpoint. So the
driver leaves a flag file in the run folder (on storage every worker sees, as the run folder already must be);
rank 0 looks for it once per step and all-reduces what it saw, so every worker stops at the same step (a worker
that went on alone would wait forever in DDP's all-reduce). The loop then takes its interrupt path: rank 0 writes
a checkpoint of the last finished step, as the local engine does on a signal.
"""

from __future__ import annotations

from pathlib import Path

import torch

STOP_FILE = ".stop-requested"


class StopRequested(KeyboardInterrupt):
    """Raised on every worker at the same step: a KeyboardInterrupt, so the loop's interrupt path checkpoints."""


def stop_file(run: Path) -> Path:
    return Path(run) / STOP_FILE


def request_stop(run: Path) -> None:
    """The driver's side: ask the workers of the run in `run` to stop after their current step."""
    stop_file(run).touch()


def clear_stop(run: Path) -> None:
    """Remove the flag: before a run starts (a stale one from a killed driver) and when it ends."""
    stop_file(run).unlink(missing_ok=True)


class StopCheck:
    """The workers' side, called once per step before it starts (ootd/app/train/loop.py run_loop)."""

    def __init__(self, run: Path, rank: int, device: torch.device) -> None:
        self.path, self.rank, self.device = stop_file(run), rank, device

    def __call__(self) -> None:
        asked = self.rank == 0 and self.path.exists()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([int(asked)], device=self.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            asked = bool(flag.item())
        if asked:
            raise StopRequested()
