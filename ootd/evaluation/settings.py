"""The settings of an evaluation, declared once and checked once (no heavy imports: the CLI reads them for
--help)."""

from __future__ import annotations

from ootd.errors import UsageError
from ootd.settings import Choice

DEFAULT_BATCH = 8  # images through the networks at once
MAX_BATCH = 256
NOT_COMPUTED = "not computed (below)"  # what the report says of a metric whose network is not installed


class MetricWeights(Choice):
    """`--weights`: the published networks (the numbers papers report), or randomly initialised stand-ins, whose
    numbers compare to nothing and every output says so."""

    STANDARD = "standard"
    RANDOM = "random"

    @classmethod
    def parse(cls, value: str | MetricWeights, what: str | None = "metric weights") -> MetricWeights:
        return super().parse(value, what)


def check_batch(value: int) -> int:
    if not 1 <= value <= MAX_BATCH:
        raise UsageError(f"--batch-size must be 1 to {MAX_BATCH}, got {value}")
    return value


def check_review_above(percent: float | None) -> float | None:
    """`--review-above PERCENT` as a share (0 to 1): pairs whose preservation score is above it are marked for
    review; None: none are."""
    if percent is None:
        return None
    if not 0 <= percent < 100:
        raise UsageError(f"--review-above is a percentage of a region's pixels, 0 to 100 (below 100), got {percent:g}")
    return percent / 100
