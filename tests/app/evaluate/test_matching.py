"""Which photo each result is measured against: by --pairs, by the batch report, by the PNG record, by name;
what has none is skipped with its reason, and no match at all is one clear error."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from ootd.app.evaluate.matching import MatchedBy, match_results, unpaired_sets
from ootd.errors import OotdError, UsageError
from tests.helpers.evaluation import noise_image, our_result, write_photos, write_report


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    write_photos(tmp_path / "photos", ["alice.jpg", "bob.png", "carol.png", "carol.jpg"])
    return tmp_path / "photos"


def reasons(matching) -> dict[str, str]:  # noqa: ANN001
    return {Path(s.what).name: s.reason for s in matching.skipped}


def test_by_name_exact_or_by_stem(tmp_path: Path, photos: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    for name in ("alice.png", "bob.png", "carol.png", "dave.png"):
        noise_image(1).save(results / name)
    matching = match_results(results, photos)
    assert {(m.result.name, m.truth.name, m.by) for m in matching.matches} == {
        ("alice.png", "alice.jpg", MatchedBy.NAME), ("bob.png", "bob.png", MatchedBy.NAME),
        ("carol.png", "carol.png", MatchedBy.NAME)}  # an exact name wins over the other carol
    assert "no photo named dave.png" in reasons(matching)["dave.png"]


def test_by_record_and_intermediates_skipped(tmp_path: Path, photos: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    our_result(results / "x_0.png", noise_image(1), "alice.jpg", sample=0)
    our_result(results / "x_1.png", noise_image(2), "alice.jpg", sample=1)
    our_result(results / "x_mask.png", noise_image(3), "alice.jpg", sample=None)
    noise_image(4).save(results / "bob.png")  # another program's image: by its name
    matching = match_results(results, photos)
    assert [(m.result.name, m.truth.name, m.by) for m in matching.matches] == [
        ("bob.png", "bob.png", MatchedBy.NAME), ("x_0.png", "alice.jpg", MatchedBy.RECORD),
        ("x_1.png", "alice.jpg", MatchedBy.RECORD)]
    assert "not a result" in reasons(matching)["x_mask.png"]
    assert matching.by() == {"name": 1, "PNG record": 2}


def test_by_report_with_failed_pairs_and_missing_photos(tmp_path: Path, photos: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    noise_image(1).save(out / "r0.png")
    noise_image(1).save(out / "stray.png")  # not in the report: not a result of this batch
    write_report(out, [{"person": "/somewhere/people/alice.jpg", "outputs": ["old/place/r0.png"]},
                       {"person": "people/erin.png", "outputs": ["r1.png"]},
                       {"person": "people/bob.png", "status": "error", "error": "pair 3: no person detected"}])
    matching = match_results(out, photos)
    assert [(m.result, m.truth.name, m.by) for m in matching.matches] == [
        (out / "r0.png", "alice.jpg", MatchedBy.REPORT)]  # found in the folder wherever the report says it was
    assert "no photo named erin.png" in reasons(matching)["r1.png"]
    failed = next(s for s in matching.skipped if "line 3" in s.what)
    assert "the try-on failed: pair 3: no person detected" == failed.reason


def test_by_list(tmp_path: Path, photos: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    noise_image(1).save(results / "out_17.png")
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("result,truth\nout_17.png,bob.png\nonly-one-cell\n")
    matching = match_results(results, photos, pairs)
    assert [(m.result, m.truth, m.by) for m in matching.matches] == [
        (results / "out_17.png", photos / "bob.png", MatchedBy.LIST)]
    assert reasons(matching) == {"pairs.csv line 3": "expected two cells: result,truth"}


def test_no_match_at_all_is_one_error(tmp_path: Path, photos: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    noise_image(1).save(results / "zed.png")
    with pytest.raises(OotdError) as caught:
        match_results(results, photos)
    assert "nothing to evaluate" in str(caught.value) and "no photo named zed.png" in str(caught.value)
    with pytest.raises(UsageError, match="not found"):
        match_results(results, tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="holds no images"):
        match_results(tmp_path / "empty", photos)


def test_a_batch_still_writing_its_report_is_refused(tmp_path: Path, photos: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    report = write_report(out, [{"person": "alice.jpg", "outputs": ["r0.png"]}])
    fd = os.open(report, os.O_WRONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a running batch's ReportWriter holds
    try:
        with pytest.raises(UsageError, match="still writing"):
            match_results(out, photos)
    finally:
        os.close(fd)


def test_unpaired_takes_every_photo(tmp_path: Path, photos: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    noise_image(1).save(results / "anything.png")
    matching, every = unpaired_sets(results, photos)
    assert [m.truth for m in matching.matches] == [None] and len(every) == 4
