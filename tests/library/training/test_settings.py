"""The length of a run: `--steps`, or `--epochs` passes over the training pairs at the global batch (a partial last
batch is a step of its own, filled from the next epoch's order: ootd/training/data.py)."""

from __future__ import annotations

import pytest

from ootd.errors import UsageError
from ootd.training.settings import TrainSettings


@pytest.mark.parametrize(("epochs", "batch", "accumulation", "workers", "pairs", "steps"), [
    (1, 1, 1, 1, 3, 3),
    (2, 2, 1, 1, 3, 4),  # 3 pairs, 2 a step: 2 steps an epoch
    (2, 3, 1, 1, 3, 2),
    (3, 1, 2, 2, 10, 9),  # global batch 4: ceil(10 / 4) = 3 steps an epoch
    (1, 4, 1, 1, 2, 1),  # fewer pairs than a batch: still a step
])
def test_epochs_are_steps_over_the_global_batch(epochs: int, batch: int, accumulation: int, workers: int, pairs: int,
                                                steps: int) -> None:
    settings = TrainSettings.from_words(epochs=epochs, batch_size=batch, accumulation=accumulation, steps=7)
    assert settings.total_steps(pairs, workers) == steps


def test_steps_without_epochs_and_bounds() -> None:
    assert TrainSettings.from_words(steps=7, batch_size=4).total_steps(100, 8) == 7
    with pytest.raises(UsageError, match="^epochs must be 1 to 100000") as refused:  # the library names the field
        TrainSettings.from_words(epochs=0)
    assert refused.value.setting == "epochs"
