"""A folder of results measured against their person photos (ootd/app/evaluate/preservation.py): each person found
by the batch report's path or by the recorded name in the people folder, every result that cannot be measured
skipped with its one-line reason and the rest measured, the worst first, every result's figures in
preservation.jsonl (read back by `recorded_figures`), the page, and only our own files replaced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ootd.app.evaluate.preservation import (
    FIGURES_NAME,
    PAGE_NAME,
    PreservationOptions,
    measure_folder,
    recorded_figures,
)
from ootd.errors import OotdError, OutputError, UsageError
from tests.helpers.evaluation import framed, made_from, write_report
from tests.helpers.synthetic import synthetic_preprocessor

FACE = (slice(55, 120), slice(167, 217))  # the synthetic parse's face at 384x512 (tests/helpers/synthetic.py)


@pytest.fixture
def folders(tmp_path: Path, example_images: dict[str, Path]) -> tuple[Path, Path]:
    """people/ with two copies of the example photo and one of another size; out/ with a result unchanged (p0),
    one whose face changed (p1), and three that cannot be measured: no record, a person photo that is not there,
    one of another size."""
    people, out = tmp_path / "people", tmp_path / "out"
    people.mkdir()
    out.mkdir()
    for name in ("p0.png", "p1.png"):
        shutil.copy(example_images["person"], people / name)
    Image.new("RGB", (300, 300), (9, 9, 9)).save(people / "small.png")
    made_from(out / "p0__shirt__0.png", framed(example_images["person"]), "p0.png")
    face = np.asarray(framed(example_images["person"])).copy()
    face[FACE] = 255 - face[FACE]
    made_from(out / "p1__shirt__0.png", Image.fromarray(face), "p1.png")
    Image.new("RGB", (384, 512)).save(out / "plain.png")
    made_from(out / "ghost__shirt__0.png", framed(example_images["person"]), "ghost.png")
    made_from(out / "small__shirt__0.png", framed(example_images["person"]), "small.png")
    return out, people


def parser() -> object:
    pre = synthetic_preprocessor()
    return lambda: pre


def test_every_result_is_measured_or_skipped_with_its_reason(folders: tuple[Path, Path]) -> None:
    out, people = folders
    report = measure_folder(out, PreservationOptions.from_words(people=people, review_above=1), parser())
    assert [Path(r.result).name for r in report.worst_rows()] == ["p1__shirt__0.png", "p0__shirt__0.png"]
    worst = report.worst_rows()[0]
    assert worst.summary.startswith("face ") and worst.review and report.reviews == 1
    assert report.worst_rows()[1].summary == "unchanged outside the mask"
    reasons = {Path(s.what).name: s.reason for s in report.skipped}
    assert set(reasons) == {"plain.png", "ghost__shirt__0.png", "small__shirt__0.png"}
    assert "not a result of ootd's" in reasons["plain.png"]
    assert "no photo named ghost.png" in reasons["ghost__shirt__0.png"]
    assert "not the photo it was made from" in reasons["small__shirt__0.png"]
    assert all("\n" not in reason for reason in reasons.values())
    assert report.parses == 1  # p0 and p1 are copies of one photo: the pixels pose and parsing see, parsed once
    assert report.regions["legs"] == {"present": 0, "absent": 2}
    assert report.regions["face"]["kept_changed"] > 0 and report.regions["hair"]["kept_changed"] == 0
    lines = report.lines()
    assert lines[0].startswith("preservation: measured 2 results") and any("review: 1 of 2" in x for x in lines)
    assert any(x.startswith("not measured 3:") for x in lines)
    data = report.to_json()
    assert data["measured"] == 2 and data["worst_first"][0]["review"] and len(data["skipped"]) == 3


def test_the_figures_file_and_the_page(folders: tuple[Path, Path]) -> None:
    out, people = folders
    report = measure_folder(out, PreservationOptions.from_words(people=people), parser())
    assert report.written == [out / FIGURES_NAME, out / PAGE_NAME]
    lines = [json.loads(line) for line in (out / FIGURES_NAME).read_text().splitlines()]
    assert lines[0]["kind"] == "preservation" and len(lines) == 3
    assert {Path(e["result"]).name for e in lines[1:]} == {"p0__shirt__0.png", "p1__shirt__0.png"}
    assert all(e["regions"]["legs"] == {"absent": True} for e in lines[1:])
    figures = recorded_figures(out)
    assert figures["p1__shirt__0.png"].summary().startswith("face ")
    page = (out / PAGE_NAME).read_text()
    assert 'src="p1__shirt__0.png"' in page and 'src="../people/p1.png"' in page  # each beside its photo
    measure_folder(out, PreservationOptions.from_words(people=people), parser())  # ours: replaced


def test_a_batch_folder_finds_its_photos_by_the_reports_paths(tmp_path: Path, example_images) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    out.mkdir()
    made_from(out / "r0.png", framed(example_images["person"]), "person.png")
    write_report(out, [{"person": str(example_images["person"]), "outputs": [str(out / "r0.png")]},
                       {"person": "x.png", "status": "error", "error": "broke"}])
    report = measure_folder(out, PreservationOptions(), parser())
    assert [Path(r.result).name for r in report.rows] == ["r0.png"]
    assert [s.reason for s in report.skipped] == ["the try-on failed: broke"]


def test_nothing_measured_is_one_error_and_writes_nothing(folders: tuple[Path, Path]) -> None:
    out, _ = folders
    with pytest.raises(OotdError, match="nothing measured: .*give the folder of the person photos"):
        measure_folder(out, PreservationOptions(), parser())
    assert not (out / FIGURES_NAME).exists() and not (out / PAGE_NAME).exists()


def test_files_not_ours_are_not_replaced(folders: tuple[Path, Path]) -> None:
    out, people = folders
    (out / FIGURES_NAME).write_text("somebody's notes\n")
    with pytest.raises(OutputError, match="is not ootd's preservation figures"):
        measure_folder(out, PreservationOptions.from_words(people=people), parser())
    assert (out / FIGURES_NAME).read_text() == "somebody's notes\n"


def test_options_are_checked_once(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="^people .*not found") as missing:  # the setting, by its name
        PreservationOptions.from_words(people=tmp_path / "none")
    assert missing.value.words(lambda name: "--" + name).startswith("--people ")
    with pytest.raises(UsageError, match="^review_above is a percentage") as refused:  # the setting, by its name
        PreservationOptions.from_words(review_above=100)
    assert refused.value.words(lambda name: "--" + name.replace("_", "-")).startswith("--review-above is a")
    assert PreservationOptions.from_words(review_above=2.5).review_above == pytest.approx(0.025)
