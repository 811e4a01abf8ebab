"""The generated image corpus (tests/helpers/corpus.py: seeded mutations of every format Pillow writes, and
Hypothesis-made valid files of every mode) through the commands: `ootd batch` (each file as a person, a garment and
a mask), `ootd eval` (as results and as real photos), and in the slow group `ootd run` file by file, `ootd classify`,
`ootd mask` and `ootd train prepare`. Every file ends as a picture or one line naming it: no traceback, no internal
error, no hang. The diffusion models are FakePipe (the question is the way in), pose and parsing the synthetic ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import invoke_bounded
from tests.helpers.corpus import EVERYDAY, Sample, drawn, mutated, no_traceback, written
from tests.helpers.evaluation import stand_ins, write_photos
from tests.helpers.synthetic import synthetic_preprocessor

RUN = ["--steps", "1", "--resolution", "384x512", "--seed", "2"]


def _corpus(slow: bool) -> list[Sample]:
    return [*mutated(3), *drawn(150)] if slow else [*mutated(3, **EVERYDAY), *drawn(12)]


def _assert_clean(result, *codes: int) -> None:  # noqa: ANN001
    assert result.exit_code in codes, result.output
    assert no_traceback(result.output), result.output[-2000:]


def _batch(tmp_path: Path, tiny_tree: Path, example_images: dict[str, Path], samples: list[Sample],
           every_role: bool) -> None:
    """Each file as a person (automatic mask), a garment and a mask (`every_role`), or in one of those, in turn."""
    files = written(tmp_path / "corpus", samples)
    person, garment, mask = example_images["person"], example_images["tshirt"], example_images["mask"]
    rows = ["person,garment,category,mask"]
    for number, path in enumerate(files):
        roles = [f"{path},{garment},upper,", f"{person},{path},upper,{mask}", f"{person},{garment},upper,{path}"]
        rows += roles if every_role else [roles[number % 3]]
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("\n".join(rows) + "\n")
    result = invoke_bounded("batch", pairs, "-o", tmp_path / "out", "--checkpoints", tiny_tree, *RUN, limit=900)
    _assert_clean(result, 0, 1)
    report = [json.loads(line) for line in (tmp_path / "out" / "batch_report.jsonl").read_text().splitlines()]
    assert len(report) == (3 if every_role else 1) * len(files)
    statuses = {row["status"] for row in report}
    assert statuses <= {"ok", "error"} and statuses == {"ok", "error"}, statuses
    for row in report:
        if row["status"] == "error":
            assert row["error"] and "\n" not in row["error"] and no_traceback(row["error"]), row


def test_a_batch_of_the_corpus(models, tmp_path: Path, tiny_tree: Path,  # noqa: ANN001
                               example_images: dict[str, Path]) -> None:
    models.fake(preprocessor=synthetic_preprocessor())
    _batch(tmp_path, tiny_tree, example_images, _corpus(slow=False), every_role=False)


@pytest.mark.slow
def test_a_batch_of_the_whole_corpus(models, tmp_path: Path, tiny_tree: Path,  # noqa: ANN001
                                     example_images: dict[str, Path]) -> None:
    models.fake(preprocessor=synthetic_preprocessor())
    _batch(tmp_path, tiny_tree, example_images, _corpus(slow=True), every_role=True)


def _eval(tmp_path: Path, samples: list[Sample]) -> None:
    """The corpus as results (their photos fine), then as photos (their results fine): each unreadable file
    skipped with its reason."""
    names = [f"{sample.name}.png" for sample in samples]
    for side in ("results", "photos"):
        root = tmp_path / side
        corpus = written(root / "corpus", samples, ".png")
        good = list(write_photos(root / "good", names, (48, 64)))
        results, truth = (root / "corpus", root / "good") if side == "results" else (root / "good", root / "corpus")
        assert len(corpus) == len(good)
        with stand_ins():
            result = invoke_bounded("eval", results, "--truth", truth, "--json", limit=900)
        _assert_clean(result, 0, 1)
        if result.exit_code == 0:
            data = json.loads(result.stdout)
            assert data["pairs"] + len(data["skipped"]) >= len(samples) // 2, data.keys()


def test_eval_of_the_corpus(tmp_path: Path) -> None:
    _eval(tmp_path, _corpus(slow=False)[::4])  # a quarter of the everyday corpus: every format, a few seconds


@pytest.mark.slow
def test_eval_of_the_whole_corpus(tmp_path: Path) -> None:
    _eval(tmp_path, _corpus(slow=True))


@pytest.mark.slow
def test_ootd_run_file_by_file(models, tmp_path: Path, tiny_tree: Path,  # noqa: ANN001
                               example_images: dict[str, Path]) -> None:
    models.fake(preprocessor=synthetic_preprocessor())
    person, garment = example_images["person"], example_images["tshirt"]
    for path in written(tmp_path / "corpus", [*mutated(4, **EVERYDAY), *drawn(40)]):
        for role_args in (["-m", path, "-c", garment], ["-m", person, "-c", path],
                          ["-m", person, "-c", garment, "--mask", path]):
            result = invoke_bounded("run", *role_args, "-k", "upper", "--checkpoints", tiny_tree, *RUN,
                                    "-o", tmp_path / "out", "--overwrite")
            _assert_clean(result, 0, 2)
            if result.exit_code == 2:  # one error line, last, naming the file (a warning may come before it)
                lines = result.stderr.strip().splitlines()
                errors = [line for line in lines if line.startswith("error: ")]
                assert errors == lines[-1:] and path.name in errors[0], result.stderr
                assert all(line.startswith("warning: ") for line in lines[:-1]), result.stderr


@pytest.mark.slow
def test_classify_mask_and_train_prepare_of_the_corpus(tmp_path: Path, tiny_tree: Path,
                                                       example_images: dict[str, Path]) -> None:
    samples = [*mutated(5, **EVERYDAY), *drawn(30)]
    files = written(tmp_path / "garments", samples, ".png")
    classified = invoke_bounded("classify", tmp_path / "garments", "--checkpoints", tiny_tree, limit=900)
    _assert_clean(classified, 0, 1)
    assert len(classified.stdout.strip().splitlines()) == len(files) + 1  # a line per garment, the summary
    for path in files[::15]:
        masked = invoke_bounded("mask", "--model", path, "--category", "upper", "--checkpoints", tiny_tree,
                                "-o", tmp_path / "masks", "--overwrite")
        _assert_clean(masked, 1, 2)  # the tiny pose model finds nobody in a picture; the rest are bad files
    rows = ["person,garment,category"]
    rows += [f"{path},{example_images['tshirt']},upper" for path in files[::2]]
    rows += [f"{example_images['person']},{path},upper" for path in files[1::2]]
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")
    prepared = invoke_bounded("train", "prepare", tmp_path / "pairs.csv", "-o", tmp_path / "cache",
                              "--checkpoints", tiny_tree, "--resolution", "384x512", limit=900)
    _assert_clean(prepared, 0, 1, 2)
