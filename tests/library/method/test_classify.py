"""Zero-shot garment classification on a tiny CLIP whose embeddings the test sets: the category and probability
ootd computes equal an independent reference (tests/helpers/clip.py); a CLIP without its text tower is refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from PIL import Image

from ootd.errors import CheckpointError
from ootd.method.classify import CATEGORY_PROMPTS, category_texts, classify_garment
from ootd.settings import Category
from ootd.weights.layout import Layout
from ootd.weights.loading import (
    check_text_tower,
    load_image_encoder,
    load_image_processor,
    load_text_tower,
    load_tokenizer,
)
from tests.helpers.clip import SCALE, controlled_tree, without_text_tower


def test_every_category_has_its_prompts() -> None:
    assert set(CATEGORY_PROMPTS) == set(Category)
    words = {c: " ".join(p) for c, p in CATEGORY_PROMPTS.items()}
    assert all(w in words[Category.UPPER] for w in ("shirt", "t-shirt", "top", "blouse", "jacket", "sweater"))
    assert all(w in words[Category.LOWER] for w in ("trousers", "jeans", "shorts", "skirt"))
    assert all(w in words[Category.DRESS] for w in ("dress", "jumpsuit"))


@pytest.mark.parametrize("weights", [
    {Category.DRESS: 3.0, Category.UPPER: 1.0},
    {Category.LOWER: 2.0, Category.UPPER: 1.5, Category.DRESS: -1.0},
], ids=["dress", "lower"])
def test_classification_equals_the_reference(tiny_tree: Path, tmp_path: Path, example_images: dict[str, Path],
                                             weights: dict[Category, float]) -> None:
    garment = example_images["tshirt"]
    tree, expected = controlled_tree(tiny_tree, tmp_path / "tree", garment, weights)
    chosen = max(expected, key=expected.get)
    assert chosen is max(weights, key=weights.get)  # the construction does what the test means
    layout = Layout(tree)
    text_model, logit_scale = load_text_tower(layout)
    assert logit_scale == pytest.approx(math.log(SCALE), abs=1e-6)
    texts = category_texts(load_tokenizer(layout), text_model, logit_scale)
    found = classify_garment(Image.open(garment), texts, load_image_processor(layout),
                             load_image_encoder(layout, torch.float32))
    assert found.category is chosen
    assert found.probability == pytest.approx(expected[chosen], abs=1e-4)
    assert dict(found.ranked) == pytest.approx(expected, abs=1e-4)
    assert [c for c, _ in found.ranked] == sorted(expected, key=lambda c: -expected[c])


def test_a_clip_without_its_text_tower_is_one_clear_error(tiny_tree: Path, tmp_path: Path) -> None:
    layout = Layout(without_text_tower(tiny_tree, tmp_path / "tree"))
    with pytest.raises(CheckpointError, match="describes no CLIP text tower|has no CLIP text tower") as caught:
        check_text_tower(layout)
    # the library names the setting (each front end words it: `--category` on the command line)
    text = str(caught.value)
    assert caught.value.setting == "category" and "--category" not in text and "\n" not in text
    with pytest.raises(CheckpointError, match="text tower"):
        load_text_tower(layout)
