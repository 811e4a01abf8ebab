"""`ootd run --category auto` on a tree whose CLIP classifies the garment as the test decides: the choice and its
probability in the summary line, the JSON and the PNG record; the refusal under the margin; a CLIP without its
text tower; a given category records nothing new."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path

import pytest

from ootd.settings import Category
from tests.helpers.cli import assert_hints_are_its_options, assert_one_line_error, invoke
from tests.helpers.clip import controlled_tree, without_text_tower
from tests.helpers.images import text

RUN = ["--steps", "1", "--resolution", "384x512", "--seed", "7"]


@pytest.fixture
def use_pipes(models, pipe_hd, pipe_dc, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN001, ANN201
    """The session's pipelines; each pipeline load records whether a classifier the owner loaded is still alive
    (it must be dropped before a diffusion model loads)."""
    from ootd.models import build

    pipes, classifiers, alive = {"hd": pipe_hd, "dc": pipe_dc}, [], []
    load = build.load_classifier
    monkeypatch.setattr(build, "load_classifier", lambda root: classifiers.append(weakref.ref(made := load(root)))
                        or made)

    def pipeline(model_type):  # noqa: ANN001, ANN202
        gc.collect()
        alive.append([ref() is not None for ref in classifiers])
        return pipes[model_type.value]

    models.use(pipeline)
    return alive


def _args(tree: Path, out: Path, example_images: dict[str, Path], *extra: object) -> list[object]:
    return ["run", "-m", example_images["person"], "-c", example_images["tshirt"], "--mask", example_images["mask"],
            "--checkpoints", tree, "-o", out, *RUN, *extra]


def test_auto_category_is_printed_recorded_and_in_json(tiny_tree: Path, tmp_path: Path,
                                                        example_images: dict[str, Path], use_pipes) -> None:  # noqa: ANN001
    tree, expected = controlled_tree(tiny_tree, tmp_path / "tree", example_images["tshirt"],
                                     {Category.DRESS: 3.0, Category.UPPER: 1.0})
    p = expected[Category.DRESS]
    assert p - max(v for c, v in expected.items() if c is not Category.DRESS) > 0.2
    result = invoke(*_args(tree, tmp_path / "out", example_images, "--category", "auto", "--json"))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["category"], summary["category_source"], summary["model_type"]) == ("dress", "auto", "dc")
    assert summary["category_p"] == pytest.approx(p, abs=1e-4) and summary["timings"]["classify"] > 0
    record = text(summary["outputs"][0])
    assert (record["category"], record["category_source"], record["model_type"]) == ("dress", "auto", "dc")
    assert float(record["category_p"]) == pytest.approx(p, abs=1e-4)

    result = invoke(*_args(tree, tmp_path / "out2", example_images, "--category", "auto"))
    assert result.exit_code == 0, result.output
    assert f"category: dress (auto, p {p:.2f})" in result.stdout.splitlines()
    assert use_pipes == [[False], [False, False]]  # each run's classifier dropped before its diffusion model loaded


def test_auto_refuses_a_garment_under_the_margin(tiny_tree: Path, tmp_path: Path, example_images: dict[str, Path],
                                                 models) -> None:  # noqa: ANN001
    tree, expected = controlled_tree(tiny_tree, tmp_path / "tree", example_images["tshirt"],
                                     {Category.UPPER: 1.0, Category.LOWER: 1.0})  # a tie
    ranked = sorted(expected, key=lambda c: -expected[c])
    assert set(ranked[:2]) == {Category.UPPER, Category.LOWER} and expected[ranked[0]] - expected[ranked[1]] < 0.2
    models.forbid()
    result = invoke(*_args(tree, tmp_path / "out", example_images, "--category", "auto"))
    line = assert_one_line_error(result, 2, "cannot tell the category", "tshirt.png", "--category",
                                 f"upper {expected[Category.UPPER]:.2f}", f"lower {expected[Category.LOWER]:.2f}")
    assert "dress" not in line.split("--category")[0]
    assert_hints_are_its_options(result, ["run"])
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
    result = invoke(*_args(tree, tmp_path / "out", example_images, "--category", "auto", "--category-margin", "1.5"))
    assert_one_line_error(result, 2, "--category-margin")


def test_a_clip_without_text_tower_is_one_line(tiny_tree: Path, tmp_path: Path, example_images: dict[str, Path],
                                               models) -> None:  # noqa: ANN001
    tree = without_text_tower(tiny_tree, tmp_path / "tree")
    models.forbid()
    result = invoke(*_args(tree, tmp_path / "out", example_images, "--category", "auto"))
    assert_one_line_error(result, 1, "text tower", "--category")


def test_a_given_category_records_no_classification(tiny_tree: Path, tmp_path: Path,
                                                    example_images: dict[str, Path], use_pipes) -> None:  # noqa: ANN001
    result = invoke(*_args(tiny_tree, tmp_path / "out", example_images, "--category", "upper", "--json"))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["category_source"] == "given" and summary["category_p"] is None
    record = text(summary["outputs"][0])
    assert "category_source" not in record and "category_p" not in record and record["category"] == "upper"


def test_classify_reviews_a_folder(tiny_tree: Path, tmp_path: Path, example_images: dict[str, Path],
                                   models) -> None:  # noqa: ANN001
    tree, expected = controlled_tree(tiny_tree, tmp_path / "tree", example_images["tshirt"],
                                     {Category.DRESS: 3.0, Category.UPPER: 1.0})
    folder = tmp_path / "garments"
    folder.mkdir()
    (folder / "a_tshirt.png").write_bytes(example_images["tshirt"].read_bytes())
    (folder / "b_broken.png").write_bytes(b"not a picture")
    models.forbid()  # no diffusion model
    result = invoke("classify", folder, "--checkpoints", tree, "--json")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert lines[0]["category"] == "dress" and lines[0]["refused"] is False
    assert lines[0]["category_p"] == pytest.approx(expected[Category.DRESS], abs=1e-4)
    assert lines[1]["error"] and lines[1]["category"] is None
    assert lines[2]["summary"] == {"classified": 1, "refused": 0, "failed": 1}
    result = invoke("classify", folder, "--checkpoints", tree, "--category-margin", "0.99")
    assert result.exit_code == 0, result.output
    assert "a_tshirt.png: dress" in result.stdout and "REFUSED" in result.stdout
    assert_hints_are_its_options(result, ["classify"], "`ootd run --category`")


def test_batch_rows_with_auto_and_a_row_that_fails_alone(tiny_tree: Path, tmp_path: Path,
                                                          example_images: dict[str, Path], use_pipes) -> None:  # noqa: ANN001
    from tests.helpers.fakes import read_report

    tree, expected = controlled_tree(tiny_tree, tmp_path / "tree", example_images["tshirt"],
                                     {Category.DRESS: 3.0, Category.UPPER: 1.0})
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a picture")
    person, garment, mask = example_images["person"], example_images["tshirt"], example_images["mask"]
    rows = [f"{person},{garment},auto,{mask}", f"{person},{broken},,{mask}", f"{person},{garment},upper,{mask}"]
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    named = ["--name", "{person}__{garment}__{category}__{i}"]  # rows 1 and 3 differ by category only
    result = invoke("batch", tmp_path / "pairs.csv", "--checkpoints", tree, "-o", out, *RUN, *named)
    assert result.exit_code == 1, result.output  # one row failed
    reports = sorted(read_report(out / "batch_report.jsonl"), key=lambda r: r["index"])
    assert [r["status"] for r in reports] == ["ok", "error", "ok"]
    assert (reports[0]["category"], reports[0]["model_type"]) == ("dress", "dc")
    assert "broken.png" in reports[1]["error"]
    record = text(reports[0]["outputs"][0])
    assert record["category_source"] == "auto"
    assert float(record["category_p"]) == pytest.approx(expected[Category.DRESS], abs=1e-4)
    assert "category_source" not in text(reports[2]["outputs"][0])

    out = tmp_path / "strict"
    result = invoke("batch", tmp_path / "pairs.csv", "--checkpoints", tree, "-o", out, *RUN, *named,
                    "--category-margin", "0.99")
    assert result.exit_code == 1, result.output
    reports = sorted(read_report(out / "batch_report.jsonl"), key=lambda r: r["index"])
    assert [r["status"] for r in reports] == ["error", "error", "ok"]
    assert "cannot tell the category" in reports[0]["error"] and "--category" in reports[0]["error"]
    assert_hints_are_its_options(result, ["batch"], "cannot tell the category")


def test_explain_shows_the_classifier_text_tower(tiny_tree: Path, tmp_path: Path, example_images: dict[str, Path],
                                                 use_pipes) -> None:  # noqa: ANN001
    from transformers import CLIPTextModelWithProjection

    tree, _ = controlled_tree(tiny_tree, tmp_path / "tree", example_images["tshirt"],
                              {Category.DRESS: 3.0, Category.UPPER: 1.0})
    tower = CLIPTextModelWithProjection.from_pretrained(tree / "clip-vit-large-patch14")
    parameters = sum(p.numel() for p in tower.parameters())  # counted on the loaded tower, not from its config
    result = invoke(*_args(tree, tmp_path / "out", example_images, "--category", "auto", "--explain"))
    assert result.exit_code == 0, result.output
    line = next(line for line in result.stdout.splitlines() if "classifier text tower" in line)
    assert f"({parameters:,} parameters, fp32" in line and "--category auto" in line
    given = invoke(*_args(tree, tmp_path / "given", example_images, "--category", "upper", "--explain"))
    assert given.exit_code == 0 and "classifier text tower" not in given.stdout
