"""Every hint names an option of the command that prints it: each `--flag` in what a command says is one of its
own options, as click knows them (so the check holds however options come to be declared), or belongs to the
other command the hint names (`ootd run --mask`): tests/helpers/cli.py's `assert_hints_are_its_options`, which the
tests of each command's hints use (no person found: run, mask, batch, train prepare; no category told apart: run,
batch, classify; out of memory). Here the checker itself, and the hints no other test shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import assert_hints_are_its_options as hinted
from tests.helpers.cli import foreign_flags, invoke

RUN = ["--steps", "1", "--resolution", "384x512"]


def test_the_checker_catches_a_foreign_flag() -> None:
    assert foreign_flags("or give a mask image with --mask", ["batch"]) == ["--mask"]
    assert foreign_flags("give it to `ootd run --mask`", ["mask"]) == []
    assert foreign_flags("give it to `ootd mask --masks`", ["run"]) == ["ootd mask --masks"]
    assert foreign_flags("python -m pip install x --index-url https://a", ["eval"]) == []


@pytest.fixture
def scene(tmp_path: Path, example_images: dict[str, Path]) -> dict[str, Path]:
    people = tmp_path / "people"
    people.mkdir()
    (people / "person.png").write_bytes(example_images["person"].read_bytes())
    cloths = tmp_path / "cloths"
    cloths.mkdir()
    (cloths / "tshirt.png").write_bytes(example_images["tshirt"].read_bytes())
    return {"people": people, "cloths": cloths, "out": tmp_path / "out", **example_images}


def test_no_person_found_in_a_batch_and_in_train_prepare(models, pipe_hd, scene: dict[str, Path],  # noqa: ANN001
                                                         tiny_tree: Path, tmp_path: Path) -> None:
    """The tiny tree's pose weights find nobody. A batch's pair (run on the session's tiny pipeline) offers the
    batch's ways to give a mask, in its summary and its report; `train prepare` the pairs CSV's."""
    models.use(pipe_hd)
    batch = invoke("batch", "--models", scene["people"], "--cloths", scene["cloths"], "-k", "upper",
                   "--checkpoints", tiny_tree, "-o", scene["out"] / "batch", *RUN)
    hinted(batch, ["batch"], "no person detected", "--masks DIR", "the CSV's mask column")
    report = (scene["out"] / "batch" / "batch_report.jsonl").read_text()
    assert "--masks DIR" in report and "with --mask)" not in report
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(f"person,garment,category\n{scene['person']},{scene['tshirt']},upper\n")
    prepare = invoke("train", "prepare", pairs, "-o", tmp_path / "cache", "--checkpoints", tiny_tree,
                     "--resolution", "384x512")
    hinted(prepare, ["train", "prepare"], "no person detected", "pairs CSV (person,garment,category,mask)")


def test_out_of_memory_names_only_the_commands_own_remedies(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    """The same failure in `ootd eval` (a --batch-size, no --resolution or --samples) and in `ootd run`."""
    def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    # the command's own step, not ootd.app.evaluate.run.evaluate: a module first imported while that is patched
    # (app/evaluate/folder.py) would keep the failing stand-in for every later test
    monkeypatch.setattr("ootd.cli.eval._evaluate", fail)
    (tmp_path / "r").mkdir()
    (tmp_path / "p").mkdir()
    result = invoke("eval", tmp_path / "r", "--truth", tmp_path / "p")
    assert result.exit_code == 1
    hinted(result, ["eval"], "out of memory", "try a smaller --batch-size")
    assert "--samples" not in result.output
