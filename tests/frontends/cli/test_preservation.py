"""Preservation as a user meets it: `ootd eval RESULTS --preservation` (lines, --json, the files, bad input in one
line), `ootd batch` measuring each pair by default (report line, summary, --json, the contact sheet's cells and
worst-first table, --review-above marking pairs without changing the exit code, --no-preservation), and
`ootd compare` showing both sides' figures, and `ootd run` measuring its results by default (--json, its line,
--no-preservation, a result it cannot measure). Pose and parsing are the synthetic ones (tests/helpers/synthetic.py):
the tiny checkpoints' random ones find nobody."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ootd.app.evaluate.preservation import PreservationOptions, measure_folder
from tests.helpers.cli import assert_one_line_error, invoke
from tests.helpers.evaluation import framed, made_from
from tests.helpers.fakes import images_tree, read_report
from tests.helpers.synthetic import counted_preprocessor, synthetic_preprocessor

RUN = ["--steps", "1", "--resolution", "384x512", "--seed", "3"]
FACE = (slice(55, 120), slice(167, 217))  # the synthetic parse's face at 384x512


def results(folder: Path, example_images: dict[str, Path], face_changed: bool) -> Path:
    """Two results made from people/p0.png and p1.png: copies of the framed photo, the face inverted or not."""
    folder.mkdir(parents=True)
    for person in ("p0.png", "p1.png"):
        picture = np.asarray(framed(example_images["person"])).copy()
        if face_changed and person == "p1.png":
            picture[FACE] = 255 - picture[FACE]
        made_from(folder / f"{Path(person).stem}__shirt__0.png", Image.fromarray(picture), person)
    return folder


@pytest.fixture
def people(tmp_path: Path, example_images: dict[str, Path]) -> Path:
    folder = tmp_path / "people"
    folder.mkdir()
    for name in ("p0.png", "p1.png"):
        shutil.copy(example_images["person"], folder / name)
    return folder


def test_eval_preservation_lines_json_and_files(models, tmp_path: Path, people: Path, example_images,  # noqa: ANN001
                                                tiny_tree: Path) -> None:
    models.use(lambda model_type: pytest.fail("no diffusion model"), preprocessor=synthetic_preprocessor())
    out = results(tmp_path / "out", example_images, face_changed=True)
    args = ["eval", out, "--preservation", "--people", people, "--checkpoints", tiny_tree]
    shown = invoke(*args, "--review-above", "2")
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    assert "preservation: measured 2 results" in text and "p1__shirt__0.png: face " in text
    assert text.index("p1__shirt__0.png") < text.index("p0__shirt__0.png: unchanged outside the mask")
    assert "review: 1 of 2 above 2.0% changed" in text and "preservation.jsonl" in text
    data = json.loads(invoke(*args, "--json").stdout)
    assert data["measured"] == 2 and data["worst_first"][0]["summary"].startswith("face ")
    assert data["regions"]["legs"]["absent"] == 2 and data["figures"] == [str(out / "preservation.jsonl")]


def test_eval_preservation_bad_input_is_one_line(models, tmp_path: Path, people: Path, example_images,  # noqa: ANN001
                                                 tiny_tree: Path) -> None:
    models.use(lambda model_type: pytest.fail("no diffusion model"), preprocessor=synthetic_preprocessor())
    out = results(tmp_path / "out", example_images, face_changed=False)
    assert_one_line_error(invoke("eval", out), 2, "--truth", "--preservation")
    assert_one_line_error(invoke("eval", out, "--people", people), 2, "add --preservation")
    assert_one_line_error(invoke("eval", out, "--preservation", "--review-above", "200"), 2, "--review-above")
    assert_one_line_error(invoke("eval", out, "--preservation", "--people", tmp_path / "none"), 2, "--people",
                          "not found")
    assert_one_line_error(invoke("eval", out, "--preservation", "--checkpoints", tiny_tree), 1,
                          "nothing measured", "--people")
    assert not (out / "preservation.jsonl").exists()


def masks_for(people: Path, example_images: dict[str, Path]) -> Path:
    """The example's mask for every person photo (the tiny pipeline's own pose finds nobody)."""
    masks = people.parent / "masks"
    masks.mkdir()
    for photo in people.iterdir():
        shutil.copy(example_images["mask"], masks / photo.name)
    return masks


def test_batch_measures_each_pair_marks_for_review_and_keeps_the_exit_code(models, tmp_path: Path, pipe_hd,  # noqa: ANN001
                                                                           tiny_tree: Path, example_images) -> None:
    models.use(pipe_hd, preprocessor=synthetic_preprocessor())
    people, garments = images_tree(tmp_path, example_images, 2, 1)
    masks = masks_for(people, example_images)
    out = tmp_path / "out"
    args = ["batch", "--models", people, "--cloths", garments, "--masks", masks, "-k", "upper", "--checkpoints",
            tiny_tree, "-o", out, *RUN, "--review-above", "5"]
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output  # every pair marked for review, and still 0
    summary = json.loads(result.stdout)["preservation"]
    assert summary["measured"] == 2 and summary["review"] == 2 and summary["review_above"] == 0.05
    lines = read_report(out / "batch_report.jsonl")
    for line in lines:
        kept = line["preservation"]
        assert kept["review"] and kept["score"] > 0.05 and kept["results"][0]["regions"]["legs"] == {"absent": True}
        assert kept["results"][0]["result"] == line["outputs"][0] and "preservation" in line["timings"]
    index = (out / "index.html").read_text()
    assert "What the try-ons changed, worst first" in index and index.count('class="kept review"') == 2
    assert 'class="review"' in index  # the table's rows
    shown = invoke(*args)  # resumed: the pairs made earlier are not measured again
    assert "2 made earlier not measured now" in shown.stdout


def test_batch_measures_each_pair_from_the_parse_its_automatic_mask_came_from(
        models, tmp_path: Path, pipe_hd, tiny_tree: Path, example_images, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    pre, runs = counted_preprocessor()
    monkeypatch.setattr(pipe_hd, "_preprocessor", pre)  # the pipeline's own pose + parsing make a batch's masks
    models.use(pipe_hd, preprocessor=pre)
    people, garments = images_tree(tmp_path, example_images, 1, 2)
    out = tmp_path / "out"
    result = invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--checkpoints", tiny_tree,
                    "-o", out, *RUN)
    assert result.exit_code == 0, result.output
    lines = read_report(out / "batch_report.jsonl")
    assert len(lines) == 2 and all(line["preservation"]["score"] is not None for line in lines), lines
    assert runs == {"pose": 1, "parsing": 1}  # one person: one parse, for both masks and both pairs' figures


@pytest.mark.slow
def test_batch_kept_outside_the_mask_is_unchanged_and_no_preservation_measures_nothing(
        models, tmp_path: Path, pipe_hd, tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    models.use(pipe_hd, preprocessor=synthetic_preprocessor())
    people, garments = images_tree(tmp_path, example_images, 1, 1)
    masks = masks_for(people, example_images)
    kept = invoke("batch", "--models", people, "--cloths", garments, "--masks", masks, "-k", "upper",
                  "--checkpoints", tiny_tree, "-o", tmp_path / "kept", *RUN, "--keep-unmasked")
    assert kept.exit_code == 0, kept.output
    assert "preservation: unchanged outside the mask" in kept.stderr + kept.stdout
    assert "  p0__g0__0.png: unchanged outside the mask" in kept.stdout
    off = invoke("batch", "--models", people, "--cloths", garments, "--masks", masks, "-k", "upper",
                 "--checkpoints", tiny_tree, "-o", tmp_path / "off", *RUN, "--no-preservation")
    assert off.exit_code == 0, off.output
    assert "preservation" not in off.stdout and "preservation" not in read_report(tmp_path / "off" /
                                                                                  "batch_report.jsonl")[0]
    assert "What the try-ons changed" not in (tmp_path / "off" / "index.html").read_text()
    assert_one_line_error(invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--checkpoints",
                                 tiny_tree, "-o", tmp_path / "x", *RUN, "--no-preservation", "--review-above", "1"),
                          2, "--review-above")


def test_compare_shows_both_sides_preservation(tmp_path: Path, people: Path, example_images) -> None:  # noqa: ANN001
    pre = synthetic_preprocessor()
    exact = results(tmp_path / "exact", example_images, face_changed=False)
    fast = results(tmp_path / "fast", example_images, face_changed=True)
    for folder in (exact, fast):
        measure_folder(folder, PreservationOptions(people=people), lambda: pre)
    shown = invoke("compare", exact, fast)
    assert shown.exit_code == 0, shown.output
    assert "p1__shirt__0.png: PSNR" in shown.stdout
    assert "preservation A: unchanged outside the mask | B: face " in shown.stdout
    assert "preservation (2 measured on both sides)" in shown.stdout and "B changed more in 1 of 2" in shown.stdout
    data = json.loads(invoke("compare", exact, fast, "--json").stdout)
    assert data["overall"]["preservation"]["b_changed_more"] == 1
    assert data["images"][1]["preservation"]["b"]["summary"].startswith("face ")


def run_args(example_images: dict[str, Path], tiny_tree: Path, out: Path) -> list:
    return ["run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper", "--mask",
            example_images["mask"], "--checkpoints", tiny_tree, "-o", out, *RUN]


def test_run_json_and_line_carry_the_figures_eval_computes(models, tmp_path: Path, pipe_hd, tiny_tree: Path,  # noqa: ANN001
                                                           example_images) -> None:
    models.use(pipe_hd, preprocessor=synthetic_preprocessor())
    out = tmp_path / "out"
    args = run_args(example_images, tiny_tree, out)
    result = invoke(*args, "--json", "--review-above", "5")
    assert result.exit_code == 0, result.output  # marked for review, and still 0
    data = json.loads(result.stdout)
    kept = data["preservation"]
    assert kept["review"] and kept["score"] > 0.05 and kept["summary"] == kept["summary"].strip()
    assert kept["results"][0]["result"] == data["outputs"][0] and "preservation" in data["timings"]
    assert kept["results"][0]["regions"]["legs"] == {"absent": True} and "face" in kept["results"][0]["regions"]
    # the same figures `ootd eval --preservation` computes for the same result
    folder = example_images["person"].parent
    evaluated = invoke("eval", out, "--preservation", "--people", folder, "--masks", folder, "--checkpoints",
                       tiny_tree, "--json")
    assert evaluated.exit_code == 0, evaluated.output
    (line,) = read_report(out / "preservation.jsonl")[1:]  # eval's line also names the photo and its own mark
    assert line.pop("person") == str(example_images["person"]) and line.pop("review") is False
    assert [line] == kept["results"]
    shown = invoke(*args, "--overwrite")
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0] == str(out / "person__tshirt__0.png"), lines
    assert lines[1].startswith("preservation: ") and lines[2].startswith("seed: "), lines
    assert lines[1].removeprefix("preservation: ") == kept["summary"]  # not marked: no --review-above


def test_run_parses_the_photo_once_and_measures_what_a_parse_of_its_own_measures(
        models, tmp_path: Path, pipe_hd, tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    from ootd.app.tryon.inputs import JobInputs
    from ootd.app.tryon.preservation import measure_made
    from ootd.settings import Category

    pre, runs = counted_preprocessor()
    models.use(pipe_hd, preprocessor=pre)
    person, garment = example_images["person"], example_images["tshirt"]
    result = invoke("run", "-m", person, "-c", garment, "-k", "upper", "--checkpoints", tiny_tree, "-o",
                    tmp_path / "out", *RUN, "--samples", "2", "--json")
    assert result.exit_code == 0, result.output
    assert runs == {"pose": 1, "parsing": 1}  # the automatic mask's parse is the one the figures come from
    data = json.loads(result.stdout)
    kept = data["preservation"]
    assert len(kept["results"]) == 2 and all("regions" in r for r in kept["results"]), kept
    # the same figures as the measure parsing the photo again itself
    again = measure_made([Path(p) for p in data["outputs"]], JobInputs.single(person, garment, Category.UPPER),
                         synthetic_preprocessor)
    assert json.loads(json.dumps(again.to_json())) == kept


def test_run_no_preservation_and_review_above_bounds(models, tmp_path: Path, pipe_hd, tiny_tree: Path,  # noqa: ANN001
                                                     example_images) -> None:
    models.use(pipe_hd, preprocessor=synthetic_preprocessor())
    args = run_args(example_images, tiny_tree, tmp_path / "off")
    off = invoke(*args, "--no-preservation", "--json")
    assert off.exit_code == 0, off.output
    data = json.loads(off.stdout)
    assert "preservation" not in data and "preservation" not in data["timings"]
    plain = invoke(*args, "--no-preservation", "--overwrite")
    assert plain.exit_code == 0, plain.output
    assert len(plain.stdout.splitlines()) == 3 and "preservation:" not in plain.stdout, plain.stdout
    models.forbid()  # refused before anything loads
    for words in (["--review-above", "100"], ["--review-above", "-1"], ["--no-preservation", "--review-above", "1"]):
        assert_one_line_error(invoke(*run_args(example_images, tiny_tree, tmp_path / "x"), *words), 2,
                              "--review-above")
    assert not (tmp_path / "x").exists()


def test_run_says_why_a_result_cannot_be_measured_and_exits_0(models, tmp_path: Path, pipe_hd,  # noqa: ANN001
                                                              tiny_tree: Path, example_images) -> None:
    models.use(pipe_hd)  # the tiny checkpoints' own pose and parsing: their random pose model finds nobody
    out = tmp_path / "out"
    result = invoke(*run_args(example_images, tiny_tree, out), "--json", "--review-above", "1")
    assert result.exit_code == 0, result.output
    kept = json.loads(result.stdout)["preservation"]
    assert kept["score"] is None and not kept["review"]
    assert kept["summary"].startswith("not measured: nobody found in the photo"), kept
    assert kept["results"] == [{"result": str(out / "person__tshirt__0.png"), "problem": kept["summary"][14:]}]
    shown = invoke(*run_args(example_images, tiny_tree, out), "--overwrite")
    assert shown.exit_code == 0, shown.output
    assert "preservation: not measured: nobody found in the photo" in shown.stdout.splitlines()[1]
