"""One evaluation with the stand-in networks (tests/helpers/evaluation.py: declared in every output): the set's
size, photos framed once, unreadable files skipped with their reason, photos shared by several results counted
once, the worst pairs first; and a batch folder's files (eval.json, eval.html, index.html's block)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ootd.app.evaluate.folder import eval_names, evaluate_batch, write_evaluation
from ootd.app.evaluate.pages import BLOCK_START
from ootd.app.evaluate.run import EvalOptions, evaluate
from ootd.errors import OotdError, OutputError, UsageError
from tests.helpers.evaluation import STAND_IN, blurred, noise_image, our_result, stand_ins, write_photos, write_report

OPTIONS = EvalOptions.from_words(batch=2)


@pytest.fixture(autouse=True)
def _stand_ins():  # noqa: ANN202
    with stand_ins():
        yield


def test_pairs_scored_worst_first_with_what_was_skipped(tmp_path: Path) -> None:
    photos = write_photos(tmp_path / "photos", [f"p{i}.png" for i in range(5)])
    results = tmp_path / "results"
    results.mkdir()
    for i, (name, image) in enumerate(photos.items()):
        blurred(image, 2 * i).save(results / name)
    (results / "p9.png").write_bytes(b"not a png")
    (tmp_path / "photos" / "p9.png").write_bytes(b"x")
    noise_image(1, (30, 40)).save(results / "p4.png")  # another size than the set's
    report = evaluate(results, tmp_path / "photos", OPTIONS)
    assert [Path(p.result).name for p in report.worst()] == ["p3.png", "p2.png", "p1.png", "p0.png"]
    assert report.pairs[0].ssim == pytest.approx(1.0, abs=1e-6) and report.pairs[0].lpips == pytest.approx(0.0)
    skipped = {Path(s.what).name: s.reason for s in report.skipped}
    assert "differs from the set's 48x64" in skipped["p4.png"] and "result: " in skipped["p9.png"]
    assert report.sets.results == report.sets.photos == 4 and report.size == (48, 64)
    assert report.stand_in == STAND_IN and any(STAND_IN in line for line in report.lines())
    data = report.to_json()
    assert data["pairs"] == 4 and data["stand_in"] == STAND_IN and len(data["skipped"]) == 2
    assert data["kid"] is not None and data["fid"] is not None
    assert data["matched_by"] == {"name": 6}  # six matched, two of them then skipped


def test_a_result_smaller_than_the_ssim_window_is_skipped_not_a_crash(tmp_path: Path) -> None:
    """A result 64x1 first in the folder (it would set the set's size) is skipped with its reason; the others are
    measured (it was an internal error in SSIM's padding)."""
    photos = write_photos(tmp_path / "photos", ["a.png", "b.png", "c.png"])
    results = tmp_path / "results"
    results.mkdir()
    noise_image(3, (64, 1)).save(results / "a.png")
    for name in ("b.png", "c.png"):
        blurred(photos[name], 2).save(results / name)
    report = evaluate(results, tmp_path / "photos", OPTIONS)
    skipped = {Path(s.what).name: s.reason for s in report.skipped}
    assert "image too small: 64x1" in skipped["a.png"] and report.size == (48, 64) and len(report.pairs) == 2


def test_a_photo_shared_by_samples_is_framed_and_counted_once(tmp_path: Path) -> None:
    photos = write_photos(tmp_path / "photos", ["alice.png", "bob.png"], size=(96, 128))
    results = tmp_path / "results"
    results.mkdir()
    for person in ("alice.png", "bob.png"):
        for sample in range(3):
            our_result(results / f"{person[:-4]}_{sample}.png", blurred(photos[person], sample).resize((48, 64)),
                       person, sample)
    report = evaluate(results, tmp_path / "photos", OPTIONS)
    assert len(report.pairs) == 6 and report.sets.results == 6 and report.sets.photos == 2
    assert report.framing == {"cropped": 0, "resized": 2}  # once per photo, not per result


def test_every_result_of_an_unreadable_photo_is_skipped_with_its_reason(tmp_path: Path) -> None:
    photos = write_photos(tmp_path / "photos", ["alice.png", "bob.png"])
    (tmp_path / "photos" / "bob.png").write_bytes(b"not a png")
    results = tmp_path / "results"
    results.mkdir()
    for person in ("alice.png", "bob.png"):
        for sample in range(3):
            our_result(results / f"{person[:-4]}_{sample}.png", blurred(photos["alice.png"], sample), person, sample)
    report = evaluate(results, tmp_path / "photos", OPTIONS)
    assert len(report.pairs) == 3
    skipped = {Path(s.what).name: s.reason for s in report.skipped}
    assert sorted(skipped) == ["bob_0.png", "bob_1.png", "bob_2.png"]  # each one, not only the first
    assert all(reason.startswith("photo ") and "bob.png" in reason for reason in skipped.values())


def test_unpaired_frames_every_photo_to_the_results_size(tmp_path: Path) -> None:
    write_photos(tmp_path / "photos", [f"q{i}.png" for i in range(3)], size=(80, 100))
    results = tmp_path / "results"
    results.mkdir()
    for i in range(4):
        noise_image(10 + i).save(results / f"r{i}.png")
    report = evaluate(results, tmp_path / "photos", EvalOptions.from_words(unpaired=True))
    assert not report.pairs and (report.sets.results, report.sets.photos) == (4, 3)
    assert report.framing == {"cropped": 3, "resized": 3} and report.to_json()["mode"] == "unpaired"


def test_nothing_left_to_measure_is_one_error(tmp_path: Path) -> None:
    write_photos(tmp_path / "photos", ["a.png"])
    results = tmp_path / "results"
    results.mkdir()
    (results / "a.png").write_bytes(b"broken")
    with pytest.raises(OotdError, match="nothing to evaluate: every result .* was skipped"):
        evaluate(results, tmp_path / "photos", OPTIONS)
    with pytest.raises(UsageError, match="^pairs matches results .* unpaired matches none"):  # the library's words
        EvalOptions.from_words(unpaired=True, pairs_csv=tmp_path / "p.csv")
    with pytest.raises(UsageError, match="^batch_size must be 1 to") as refused:  # `ootd eval` words it --batch-size
        EvalOptions.from_words(batch=0)
    assert refused.value.setting == "batch_size"


def batch_folder(tmp_path: Path) -> tuple[Path, Path]:
    photos = write_photos(tmp_path / "photos", [f"p{i}.png" for i in range(3)])
    out = tmp_path / "out"
    out.mkdir()
    entries = []
    for i, (name, image) in enumerate(photos.items()):
        our_result(out / f"r{i}.png", blurred(image, 3 * i), name)
        entries.append({"person": f"people/{name}", "outputs": [str(out / f"r{i}.png")]})
    write_report(out, entries)
    (out / "index.html").write_text('<!doctype html><html><body><h1>ootd batch: out</h1><p class="counts">3 pairs: '
                                    "3 done</p><div class=\"grid\"></div></body></html>\n")
    return out, tmp_path / "photos"


def test_a_batch_folder_gets_eval_files_and_its_index_a_block(tmp_path: Path) -> None:
    out, photos = batch_folder(tmp_path)
    report = evaluate_batch(out, photos, OPTIONS)
    assert report.written == [out / "eval.json", out / "eval.html", out / "index.html"]
    data = json.loads((out / "eval.json").read_text())
    assert data["software"].startswith("ootd") and data["pairs"] == 3 and data["stand_in"] == STAND_IN
    assert [Path(p["result"]).name for p in data["worst_first"]] == ["r2.png", "r1.png", "r0.png"]
    page = (out / "eval.html").read_text()
    assert STAND_IN in page and page.index("r2.png") < page.index("r1.png") < page.index("r0.png")
    assert 'src="r2.png"' in page and 'src="../photos/p2.png"' in page  # relative to the folder
    index = (out / "index.html").read_text()
    assert index.count(BLOCK_START) == 1 and index.index("3 done") < index.index(BLOCK_START)
    assert 'href="eval.html"' in index and STAND_IN in index
    evaluate_batch(out, photos, OPTIONS)  # again: the block is replaced, not repeated
    assert (out / "index.html").read_text().count(BLOCK_START) == 1


def test_files_not_ours_are_never_replaced(tmp_path: Path) -> None:
    out, photos = batch_folder(tmp_path)
    (out / "eval.json").write_text('{"mine": true}')
    with pytest.raises(OutputError, match="eval.json exists and is not an evaluation of ootd's"):
        evaluate_batch(out, photos, OPTIONS)
    assert (out / "eval.json").read_text() == '{"mine": true}' and not (out / "eval.html").exists()
    (out / "eval.json").unlink()
    report = evaluate(out, photos, OPTIONS)
    (out / "index.html").write_text("<html><body>someone's page</body></html>")
    write_evaluation(report, out)
    assert (out / "index.html").read_text() == "<html><body>someone's page</body></html>"  # not a contact sheet


def test_a_shards_files_are_its_own() -> None:
    assert eval_names() == eval_names(Path("out/batch_report.jsonl")) == ("eval.json", "eval.html")
    assert eval_names(Path("batch_report.shard0of2.jsonl")) == ("eval.shard0of2.json", "eval.shard0of2.html")


def test_a_missing_result_or_photo_named_by_pairs_is_skipped_with_its_reason(tmp_path: Path) -> None:
    photos = write_photos(tmp_path / "photos", ["alice.png", "bob.png"])
    results = tmp_path / "results"
    results.mkdir()
    for name in ("r0.png", "r1.png", "r3.png"):
        blurred(photos["alice.png"], 1).save(results / name)
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("result,truth\nr0.png,alice.png\nr1.png,bob.png\ngone.png,bob.png\nr3.png,nobody.png\n")
    report = evaluate(results, tmp_path / "photos", EvalOptions.from_words(batch=2, pairs_csv=pairs))
    assert [Path(p.result).name for p in report.pairs] == ["r0.png", "r1.png"]
    skipped = {Path(s.what).name: s.reason for s in report.skipped}
    assert sorted(skipped) == ["gone.png", "r3.png"]
    assert skipped["gone.png"].startswith("result: ") and "not found" in skipped["gone.png"]
    assert skipped["r3.png"].startswith("photo ") and "nobody.png: file not found" in skipped["r3.png"]
    assert report.sets.results == 2 and report.matched_by == {"--pairs": 4}  # matched, then skipped when read


def test_a_result_missing_from_the_folder_its_report_names_is_skipped_with_its_reason(tmp_path: Path) -> None:
    out, photos = batch_folder(tmp_path)
    (out / "r1.png").unlink()  # the photo p1.png is still there
    report = evaluate(out, photos, OPTIONS)
    assert sorted(Path(p.result).name for p in report.pairs) == ["r0.png", "r2.png"]
    assert [Path(s.what).name for s in report.skipped] == ["r1.png"]
    assert report.skipped[0].reason.startswith("result: ") and "not found" in report.skipped[0].reason
