"""The one `auto` classification every front end calls: a garment that fails is classified once, and its error,
raised again for each of its rows, holds no more than one raise's frames (a batch of 10^5 rows of one bad
garment must not keep 10^5 tracebacks alive)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from ootd.app.tryon.inputs import GarmentInput, JobInputs
from ootd.errors import UsageError
from ootd.settings import AUTO_CATEGORY
from tests.helpers import traceback_length


def test_a_known_failure_is_raised_again_with_a_fresh_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import ootd.app.tryon.autocategory as autocategory

    calls = []

    def refuse(garment, label, classifier, margin):  # noqa: ANN001, ANN202
        calls.append(label)
        raise UsageError(f"garment {label}: not sure what it is")

    monkeypatch.setattr(autocategory, "classify_image", refuse)
    known: autocategory.Classified = {}
    owner = SimpleNamespace(classifier=lambda: None)  # the classifier itself is `refuse`
    inputs = JobInputs.of(Path("person.png"), [GarmentInput(Path("coat.png"), AUTO_CATEGORY, None)])
    lengths = []
    for _ in range(200):
        with pytest.raises(UsageError, match="not sure") as caught:
            autocategory.resolve_inputs(inputs, owner, 0.1, known)
        lengths.append(traceback_length(caught.value))
    assert len(calls) == 1  # classified once
    assert max(lengths) == lengths[1] < 10, lengths[:5]
