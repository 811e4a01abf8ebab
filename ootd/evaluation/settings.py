"""The settings of an evaluation, declared once and checked once (no heavy imports: the CLI reads them for
--help)."""

from __future__ import annotations

from enum import nonmember

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

    label = nonmember("metric weights")


def check_batch(value: int) -> int:
    if not 1 <= value <= MAX_BATCH:
        raise UsageError.about("batch_size", "{@batch_size} must be 1 to {most}, got {value}", value=value,
                               most=MAX_BATCH)
    return value


def check_review_above(percent: float | None) -> float | None:
    """`--review-above PERCENT` as a share (0 to 1): pairs whose preservation score is above it are marked for
    review; None: none are."""
    if percent is None:
        return None
    if not 0 <= percent < 100:
        raise UsageError.about("review_above", "{@review_above} is a percentage of a region's pixels, 0 to 100 "
                               "(below 100), got {value:g}", value=percent)
    return percent / 100
