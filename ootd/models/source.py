"""Models handed in instead of loaded from the checkpoints: the one seam for stand-ins (tests, the benchmark's
random weights, an embedding application's own models).

A `ModelSource` given to one `Models` replaces its loading for the kinds it has; `use_models` makes every `Models`
created inside the block (with no source of its own) take it: a command run in-process by a test loads nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ootd.settings import ModelType

if TYPE_CHECKING:
    import torch

    from ootd.evaluation.networks import Networks
    from ootd.evaluation.settings import MetricWeights
    from ootd.hardware.policy import Precision
    from ootd.weights.loading import Components


@dataclass(frozen=True)
class ModelSource:
    """What to use instead of loading, per kind (None: that kind loads from the checkpoints as usual).

    `pipeline(model_type)`: a try-on pipeline (or a stand-in with its methods); `preprocessor()`: pose + parsing;
    `components(model_type, precision, device)`: one model type's networks, from which the owner builds pipelines
    and a fine-tune's models as from loaded ones; `metrics(weights, device)`: the evaluation's networks."""

    pipeline: Callable[[ModelType], Any] | None = None
    preprocessor: Callable[[], Any] | None = None
    components: Callable[[ModelType, Precision, torch.device], Components] | None = None
    metrics: Callable[[MetricWeights, Any], Networks] | None = None


_SOURCE: ContextVar[ModelSource | None] = ContextVar("ootd_model_source", default=None)


def current_source() -> ModelSource | None:
    """The source of the enclosing `use_models` block, if any."""
    return _SOURCE.get()


@contextmanager
def use_models(pipeline: Callable[[ModelType], Any] | None = None, preprocessor: Callable[[], Any] | None = None,
               **more: Any) -> Iterator[ModelSource]:
    """Within this block every `Models` made without a source of its own takes its models from these callables
    (`more`: ModelSource's other fields) instead of the checkpoints."""
    source = ModelSource(pipeline, preprocessor, **more)
    token = _SOURCE.set(source)
    try:
        yield source
    finally:
        _SOURCE.reset(token)
