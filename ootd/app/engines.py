"""The batch engines, by name: what `ootd batch --engine NAME` runs. Front ends build engines only through here.

`local` runs every pair in this process (ootd/app/batch.py). `ray` spreads the same pairs over the actors of a Ray
cluster (ootd/app/ray_engine.py); it is imported only when chosen, so Ray stays an optional extra.
Both take the same pairs and give the same `BatchSummary`, the same report lines and the same output files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ootd.app.batch import BatchSummary, PairReport
from ootd.app.config import RunConfig
from ootd.app.pairs import Pair
from ootd.app.tryon import Progress
from ootd.config import EngineName
from ootd.errors import UsageError

RAY_INSTALL = "pip install 'ootd[ray]'  (or: pip install 'ray[data]>=2.9')"


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


class BatchEngine(Protocol):
    def run(self, pairs: Sequence[Pair]) -> BatchSummary: ...


def _local(config: RunConfig, cluster: ClusterOptions, **kwargs: Any) -> BatchEngine:
    from ootd.app.batch import BatchRunner

    return BatchRunner(config, **kwargs)


def _ray(config: RunConfig, cluster: ClusterOptions, **kwargs: Any) -> BatchEngine:
    from ootd.app.ray_engine import RayBatchRunner

    return RayBatchRunner(config, cluster, **kwargs)


ENGINES: dict[EngineName, Callable[..., BatchEngine]] = {EngineName.LOCAL: _local, EngineName.RAY: _ray}


def require_engine(name: str | EngineName) -> EngineName:
    """The engine's name, parsed, once what it needs is known to be installed (front ends check this before
    any work, so a missing extra is one line and exit 2)."""
    engine = EngineName.parse(name, "engine")
    if engine is EngineName.RAY:
        try:
            import ray.data  # noqa: F401 - only to learn whether the extra is installed
        except ImportError:
            raise UsageError(f"the ray engine needs Ray, which is not installed: {RAY_INSTALL}") from None
    return engine


def make_engine(
    name: str | EngineName,
    config: RunConfig,
    *,
    cluster: ClusterOptions | None = None,
    report_path: Path | None = None,
    progress: Progress | None = None,
    on_report: Callable[[PairReport], None] | None = None,
    index_path: Path | None = None,
    status: Callable[[str], None] | None = None,
) -> BatchEngine:
    """The engine called `name`, ready to `run(pairs)`. `status`: occasional one-line progress (rate, ETA) from
    engines that run elsewhere; the local engine reports through `progress` only."""
    engine = require_engine(name)
    cluster = cluster or ClusterOptions()
    cluster.validate()
    kwargs: dict[str, Any] = {"report_path": report_path, "progress": progress, "on_report": on_report,
                              "index_path": index_path}
    if engine is not EngineName.LOCAL:
        kwargs["status"] = status
    return ENGINES[engine](config, cluster, **kwargs)
