"""No output may replace an input: the inputs are held by the hash of their identity (a few bytes an input at
10^6 distinct inputs), so a hash that two inputs share must still find the right one."""

from __future__ import annotations

from pathlib import Path

import pytest

import ootd.app.tryon.safety as safety
from ootd.errors import UsageError


@pytest.mark.parametrize("collide", [False, True])
def test_an_output_that_is_an_input_is_refused_whatever_the_hashes(tmp_path: Path, collide: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if collide:  # every identity hashes alike: the check must compare identities, not hashes
        monkeypatch.setattr(safety, "hash", lambda _: 7, raising=False)
    person, garment, missing = tmp_path / "person.png", tmp_path / "garment.png", tmp_path / "gone.png"
    for path in (person, garment):
        path.write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    inputs = [person, garment, missing]
    safety.check_outputs([tmp_path / "out.png"], inputs)  # nothing in common
    for taken in (garment, tmp_path / "sub" / ".." / "person.png", missing):
        with pytest.raises(UsageError, match="would replace the input"):
            safety.check_outputs([tmp_path / "a.png", taken], inputs)
