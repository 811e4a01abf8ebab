"""Where and how wide a distributed batch engine runs (`--address`, `--workers`, `--gpus-per-worker`)."""

from __future__ import annotations

from dataclasses import dataclass

from ootd.errors import UsageError


@dataclass(frozen=True)
class ClusterOptions:
    """Where and how wide a distributed engine runs (the local engine ignores these)."""

    address: str | None = None  # None: start a private instance on this machine; "auto" or HOST:PORT: join one
    workers: int | None = None  # None: one per GPU the cluster has (one on a machine without GPUs)
    gpus_per_worker: float | None = None  # None: 1 when the cluster has GPUs, else 0 (CPU workers)
    retries: int = 2  # how many times a pair whose worker died is tried again before it is reported as an error

    def validate(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise UsageError(f"workers must be at least 1, got {self.workers}")
        if self.gpus_per_worker is not None and self.gpus_per_worker < 0:
            raise UsageError(f"gpus per worker must be 0 or more, got {self.gpus_per_worker}")
        if self.retries < 0:
            raise UsageError(f"retries must be 0 or more, got {self.retries}")
