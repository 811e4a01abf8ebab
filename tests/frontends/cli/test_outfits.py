"""`ootd run` with two garments: the outfit equals its two passes run by hand with the derived seeds (pixels and
records); pose and parsing run once for both automatic masks; the dc model serving both passes when asked; a dress
with a second garment, or two garments of one category, refused in one line before any model loads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers.cli import assert_one_line_error, invoke
from tests.helpers.images import pixels, text
from tests.helpers.synthetic import synthetic_preprocessor

RUN = ["--steps", "1", "--resolution", "384x512"]
PASS_KEYS = ("garment", "category", "model_type", "seed", "mask")


def derived(seed: int, name: str) -> int:
    """The documented derivation of a pass's seed (docs/categories.md), written out again here."""
    return int.from_bytes(hashlib.sha256(f"ootd outfit {seed} {name}".encode()).digest()[:8], "big") % 2**63


@pytest.fixture
def use_pipes(models, pipe_hd, pipe_dc):  # noqa: ANN001, ANN201
    pipes = {"hd": pipe_hd, "dc": pipe_dc}
    loads: list[str] = []

    def load(model_type):  # noqa: ANN001, ANN202
        loads.append(model_type.value)
        return pipes[model_type.value]

    models.use(load, preprocessor=synthetic_preprocessor())
    return loads


@pytest.fixture
def lower_mask(tmp_path: Path, example_images: dict[str, Path]) -> Path:
    """The lower half of the photo, as a user's mask for the trousers."""
    size = Image.open(example_images["person"]).size
    mask = np.zeros((size[1], size[0]), np.uint8)
    mask[size[1] // 2:, size[0] // 5: 4 * size[0] // 5] = 255
    path = tmp_path / "mask_lower.png"
    Image.fromarray(mask, "L").save(path)
    return path


def test_outfit_equals_two_passes_by_hand(tiny_tree: Path, tmp_path: Path, example_images: dict[str, Path],
                                          lower_mask: Path, use_pipes) -> None:  # noqa: ANN001
    person, top, trousers, top_mask = (example_images[k] for k in ("person", "tshirt", "trousers", "mask"))
    common = ["--checkpoints", tiny_tree, *RUN]
    result = invoke("run", "-m", person, "-c", top, "-c", trousers, "-k", "upper", "-k", "lower", "--mask", top_mask,
                    "--mask", lower_mask, "--seed", "7", "-o", tmp_path / "outfit", *common, "--json",
                    "--save-intermediates")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    final = tmp_path / "outfit" / "person__tshirt-with-trousers__0.png"
    assert summary["outputs"] == [str(final)]
    assert use_pipes == ["dc", "hd"]  # lower first with dc, then the top with hd
    assert {"lower_mask", "lower_result_0", "upper_mask", "upper_masked_person"} <= set(summary["intermediates"])

    # by hand: the trousers with dc on the photo, then the top on that result, with the derived seeds
    first_seed, second_seed = derived(7, "lower"), derived(7, "upper 0")
    hand = invoke("run", "-m", person, "-c", trousers, "-k", "lower", "--model-type", "dc", "--mask", lower_mask,
                  "--seed", first_seed, "-o", tmp_path / "hand1", *common)
    assert hand.exit_code == 0, hand.output
    first = tmp_path / "hand1" / "person__trousers__0.png"
    hand = invoke("run", "-m", first, "-c", top, "-k", "upper", "--mask", top_mask, "--seed", second_seed,
                  "-o", tmp_path / "hand2", *common)
    assert hand.exit_code == 0, hand.output
    second = tmp_path / "hand2" / "person_trousers_0__tshirt__0.png"
    assert np.array_equal(pixels(final), pixels(second))
    assert np.array_equal(pixels(summary["intermediates"]["lower_result_0"]), pixels(first))

    record, by_hand = text(final), {"lower": text(first), "upper": text(second)}
    for name, recorded in by_hand.items():
        assert {k: record[f"{name}_{k}"] for k in PASS_KEYS} == {k: recorded[k] for k in PASS_KEYS}
    # every key but the person's name and the attention dispatch trace (a count of calls on the shared pipeline)
    same = {k: v for k, v in by_hand["upper"].items() if k not in ("person", "attention")}
    assert {k: record[k] for k in same} == same and record["person"] == "person.png"
    assert record["lower_seed"] == str(first_seed) and record["upper_model_type"] == "hd"


def test_automatic_masks_come_from_one_parse_and_dc_serves_both(tiny_tree: Path, tmp_path: Path,
                                                                 example_images: dict[str, Path],
                                                                 use_pipes) -> None:  # noqa: ANN001
    result = invoke("run", "-m", example_images["person"], "-c", example_images["trousers"], "-c",
                    example_images["tshirt"], "-k", "lower", "-k", "upper", "--model-type", "dc", "--seed", "3",
                    "-o", tmp_path / "out", "--checkpoints", tiny_tree, *RUN, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["pose_parsing_runs"] == 1 and use_pipes == ["dc"]
    assert [p["model_type"] for p in summary["passes"]] == ["dc", "dc"]
    assert [p["category"] for p in summary["passes"]] == ["lower", "upper"]
    assert [p["seed"] for p in summary["passes"]] == [str(derived(3, "lower")), str(derived(3, "upper 0"))]

    result = invoke("run", "-m", example_images["person"], "-c", example_images["trousers"], "-c",
                    example_images["tshirt"], "-k", "lower", "-k", "upper", "--seed", "3", "-o", tmp_path / "text",
                    "--checkpoints", tiny_tree, *RUN)
    assert result.exit_code == 0, result.output
    assert "outfit: trousers.png lower with dc, then tshirt.png upper with hd" in result.stdout


@pytest.mark.parametrize(("categories", "fragments"), [
    (["dress", "upper"], ("is a dress", "alone")),
    (["upper"], ("both upper",)),
])
def test_refused_outfits_are_one_line(tiny_tree: Path, tmp_path: Path, example_images: dict[str, Path], models,  # noqa: ANN001
                                      categories: list[str], fragments: tuple[str, ...]) -> None:
    models.forbid()
    words = [x for c in categories for x in ("-k", c)]
    result = invoke("run", "-m", example_images["person"], "-c", example_images["trousers"], "-c",
                    example_images["tshirt"], *words, "-o", tmp_path / "out", "--checkpoints", tiny_tree, *RUN)
    assert_one_line_error(result, 2, *fragments)
    assert not (tmp_path / "out").exists()


def test_mismatched_counts_are_one_line(tiny_tree: Path, tmp_path: Path, example_images: dict[str, Path],
                                        models) -> None:  # noqa: ANN001
    models.forbid()
    base = ["run", "-m", example_images["person"], "-c", example_images["trousers"], "-c", example_images["tshirt"],
            "-o", tmp_path / "out", "--checkpoints", tiny_tree, *RUN]
    assert_one_line_error(invoke(*base, "-k", "lower", "-k", "upper", "-k", "dress"), 2, "one per --cloth")
    assert_one_line_error(invoke(*base, "-k", "lower", "-k", "upper", "--mask", example_images["mask"]), 2,
                          "one --mask per --cloth")
