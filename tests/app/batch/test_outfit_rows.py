"""Outfit rows of a batch (`person,top;trousers,upper;lower`): the same pixels and records as `ootd run` with two
`--cloth`, resumed like any other pair, and a refused outfit row (a dress with a second garment) failing alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers.cli import invoke
from tests.helpers.images import pixels, text
from tests.helpers.synthetic import counted_preprocessor, synthetic_preprocessor

RUN = ["--steps", "1", "--resolution", "384x512", "--seed", "7"]


@pytest.fixture
def use_pipes(models, pipe_hd, pipe_dc):  # noqa: ANN001, ANN201
    pipes = {"hd": pipe_hd, "dc": pipe_dc}
    models.use(lambda model_type: pipes[model_type.value], preprocessor=synthetic_preprocessor())


@pytest.fixture
def inputs(tmp_path: Path, example_images: dict[str, Path]) -> Path:
    """The example pictures, a lower-half mask and a dress (a copy of the t-shirt) in one folder."""
    folder = tmp_path / "in"
    folder.mkdir()
    for key, name in (("person", "person.png"), ("tshirt", "tshirt.png"), ("trousers", "trousers.png"),
                      ("mask", "mask_upper.png"), ("tshirt", "dress.png")):
        shutil.copy(example_images[key], folder / name)
    size = Image.open(example_images["person"]).size
    mask = np.zeros((size[1], size[0]), np.uint8)
    mask[size[1] // 2:, size[0] // 5: 4 * size[0] // 5] = 255
    Image.fromarray(mask, "L").save(folder / "mask_lower.png")
    return folder


def without_trace(record: dict[str, str]) -> dict[str, str]:
    """A record without the attention dispatch trace (a count of calls on the shared test pipeline)."""
    return {k: v for k, v in record.items() if k != "attention"}


def test_outfit_row_equals_ootd_run_and_a_refused_row_fails_alone(tiny_tree: Path, tmp_path: Path, inputs: Path,
                                                                  use_pipes) -> None:  # noqa: ANN001
    common = ["--checkpoints", tiny_tree, *RUN]
    (inputs / "pairs.csv").write_text(
        "person,garment,category,mask\n"
        "person.png,tshirt.png;trousers.png,upper;lower,mask_upper.png;mask_lower.png\n"
        "person.png,dress.png;trousers.png,dress;lower,\n"
        "person.png,tshirt.png,upper,mask_upper.png\n"
    )
    batch = invoke("batch", inputs / "pairs.csv", "-o", tmp_path / "batch", *common)
    assert batch.exit_code == 1, batch.output  # the refused row is the batch's one failure
    report = [json.loads(line) for line in (tmp_path / "batch" / "batch_report.jsonl").read_text().splitlines()]
    by_line = {r["source"]: r for r in report}
    assert by_line["pairs.csv line 2"]["status"] == "ok" and by_line["pairs.csv line 4"]["status"] == "ok"
    refused = by_line["pairs.csv line 3"]
    assert refused["status"] == "error" and "dress.png is a dress" in refused["error"]

    outfit = invoke("run", "-m", inputs / "person.png", "-c", inputs / "tshirt.png", "-c", inputs / "trousers.png",
                    "-k", "upper", "-k", "lower", "--mask", inputs / "mask_upper.png", "--mask",
                    inputs / "mask_lower.png", "-o", tmp_path / "run", *common)
    assert outfit.exit_code == 0, outfit.output
    single = invoke("run", "-m", inputs / "person.png", "-c", inputs / "tshirt.png", "-k", "upper", "--mask",
                    inputs / "mask_upper.png", "-o", tmp_path / "run", *common)
    assert single.exit_code == 0, single.output
    for name in ("person__tshirt-with-trousers__0.png", "person__tshirt__0.png"):
        made, by_run = tmp_path / "batch" / name, tmp_path / "run" / name
        assert str(made) in {p for r in report for p in r["outputs"]}
        assert np.array_equal(pixels(made), pixels(by_run))
        assert without_trace(text(made)) == without_trace(text(by_run))
    assert text(tmp_path / "batch" / "person__tshirt-with-trousers__0.png")["outfit"] == "lower+upper"

    # resumed like any other pair: the rerun skips both rows it finished, and a changed setting is refused
    again = invoke("batch", inputs / "pairs.csv", "-o", tmp_path / "batch", *common)
    report = [json.loads(line) for line in (tmp_path / "batch" / "batch_report.jsonl").read_text().splitlines()]
    assert [r["status"] for r in sorted(report, key=lambda r: r["index"])] == ["skipped", "error", "skipped"], \
        again.output
    stale = invoke("batch", inputs / "pairs.csv", "-o", tmp_path / "batch", "--checkpoints", tiny_tree,
                   "--steps", "2", "--resolution", "384x512", "--seed", "7")
    assert stale.exit_code == 1 and "other settings" in stale.output


@pytest.mark.parametrize(("cells", "fragment"), [
    ("tshirt.png;trousers.png,upper", "one category per garment"),
    ("tshirt.png;trousers.png;dress.png,upper;lower", "an outfit is two garments"),
])
def test_unreadable_outfit_rows_fail_alone(tiny_tree: Path, tmp_path: Path, inputs: Path, use_pipes,  # noqa: ANN001
                                           cells: str, fragment: str) -> None:
    (inputs / "pairs.csv").write_text(f"person.png,{cells}\nperson.png,tshirt.png,upper,mask_upper.png\n")
    result = invoke("batch", inputs / "pairs.csv", "-o", tmp_path / "batch", "--checkpoints", tiny_tree, *RUN)
    assert result.exit_code == 1, result.output
    report = [json.loads(line) for line in (tmp_path / "batch" / "batch_report.jsonl").read_text().splitlines()]
    statuses = {r["source"]: (r["status"], r["error"] or "") for r in report}
    assert statuses["pairs.csv line 2"][0] == "ok"
    assert statuses["pairs.csv line 1"][0] == "error" and fragment in statuses["pairs.csv line 1"][1]


def test_an_outfit_rows_auto_garment_is_classified_as_a_single_rows(tiny_tree: Path, tmp_path: Path, inputs: Path,
                                                                    use_pipes, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """`auto` in an outfit row goes through the one classification every front end uses, per garment file."""
    import ootd.app.tryon.autocategory as autocategory
    from ootd.method.classify import Classification
    from ootd.settings import Category

    asked: list[str] = []

    def classify(garment, label, checkpoints, margin):  # noqa: ANN001, ANN202
        asked.append(Path(label).name)
        return Classification(((Category.UPPER, 0.9), (Category.LOWER, 0.06), (Category.DRESS, 0.04)))

    monkeypatch.setattr(autocategory, "classify_image", classify)
    (inputs / "pairs.csv").write_text("person.png,tshirt.png;trousers.png,auto;lower,mask_upper.png;mask_lower.png\n"
                                      "person.png,tshirt.png,auto,mask_upper.png\n")
    result = invoke("batch", inputs / "pairs.csv", "-o", tmp_path / "batch", "--checkpoints", tiny_tree, *RUN)
    assert result.exit_code == 0, result.output
    assert asked == ["tshirt.png"]  # each garment file once, whatever rows it is in
    record = text(tmp_path / "batch" / "person__tshirt-with-trousers__0.png")
    assert record["upper_category"] == "upper" and record["upper_category_p"] == "0.9000"
    assert record["lower_category_p"] == "given" and record["category_source"] == "auto"


def test_an_outfit_rows_parse_makes_its_masks_and_its_preservation_figures(
        tiny_tree: Path, tmp_path: Path, inputs: Path, models, pipe_hd, pipe_dc) -> None:  # noqa: ANN001
    pre, runs = counted_preprocessor()
    pipes = {"hd": pipe_hd, "dc": pipe_dc}
    models.use(lambda model_type: pipes[model_type.value], preprocessor=pre)
    (inputs / "pairs.csv").write_text("person,garment,category\nperson.png,tshirt.png;trousers.png,upper;lower\n")
    batch = invoke("batch", inputs / "pairs.csv", "-o", tmp_path / "out", "--checkpoints", tiny_tree, *RUN)
    assert batch.exit_code == 0, batch.output
    (line,) = [json.loads(x) for x in (tmp_path / "out" / "batch_report.jsonl").read_text().splitlines()]
    assert line["status"] == "ok" and line["preservation"]["score"] is not None, line
    assert runs == {"pose": 1, "parsing": 1}  # both masks and the figures from one parse of the photo
