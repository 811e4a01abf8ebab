"""The batch engines, by name: what `ootd batch --engine NAME` runs. Front ends build engines only through here.

`local` runs every pair in this process (ootd/app/batch/runner.py). `ray` spreads the same pairs over the actors
of a Ray cluster (ootd/app/batch/ray_engine.py); it is imported only when chosen, so Ray stays an optional extra.
Both take the same pairs and give the same `BatchSummary`, the same report lines and the same output files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ootd.app.batch.cluster import ClusterOptions
from ootd.app.batch.pairs import Pair
from ootd.app.batch.report import BatchSummary, PairReport
from ootd.app.signals import ray_for_a_driver
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.preservation import PreservationChoice
from ootd.errors import Namer, UsageError, library_name
from ootd.pipeline_types import Progress
from ootd.settings import EngineName

if TYPE_CHECKING:
    from ootd.models import Models

RAY_INSTALL = "pip install 'ootd[ray]'  (or: pip install 'ray>=2.9')"


class BatchEngine(Protocol):
    def run(self, pairs: Sequence[Pair]) -> BatchSummary: ...


def _local(config: RunConfig, cluster: ClusterOptions, **kwargs: Any) -> BatchEngine:
    from ootd.app.batch.runner import BatchRunner

    return BatchRunner(config, **kwargs)


def _ray(config: RunConfig, cluster: ClusterOptions, **kwargs: Any) -> BatchEngine:
    from ootd.app.batch.ray_engine import RayBatchRunner

    return RayBatchRunner(config, cluster, **kwargs)


ENGINES: dict[EngineName, Callable[..., BatchEngine]] = {EngineName.LOCAL: _local, EngineName.RAY: _ray}


def require_engine(name: str | EngineName) -> EngineName:
    """The engine's name, parsed, once what it needs is known to be installed (front ends check this before
    any work, so a missing extra is one line and exit 2)."""
    engine = EngineName.parse(name, "engine")
    if engine is EngineName.RAY:
        try:
            ray_for_a_driver()  # the first import of Ray in this process (ootd/app/signals.py says why)
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
    preservation: PreservationChoice | None = None,
    words: Namer = library_name,
    models: Models | None = None,
) -> BatchEngine:
    """The engine called `name`, ready to `run(pairs)`. `status`: occasional one-line progress (rate, ETA) from
    engines that run elsewhere; the local engine reports through `progress` only. `preservation`: whether each
    pair made is measured (default: yes), and the review threshold. `words`: the front end's word for each setting
    a pair's error names (what its report lines say). `models`: the front end's model owner (the local engine runs
    its pairs on it; the Ray engine's actors each make their own)."""
    engine = require_engine(name)
    cluster = cluster or ClusterOptions()
    cluster.validate()
    kwargs: dict[str, Any] = {"report_path": report_path, "progress": progress, "on_report": on_report,
                              "index_path": index_path, "preservation": preservation, "name": words,
                              "models": models}
    if engine is not EngineName.LOCAL:
        kwargs["status"] = status
    return ENGINES[engine](config, cluster, **kwargs)
