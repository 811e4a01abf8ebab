"""What a batch report line and `ootd run`'s summary take from the typed record (issue 34): the record decides,
so the front ends never tell one garment from an outfit themselves."""

from __future__ import annotations

from pathlib import Path

from ootd.app.tryon.autocategory import category_words
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.record import PassRecord, Record
from ootd.settings import Category, ModelType, SamplingSettings


def _pass(name: str, category: Category, model: ModelType, seed: int, p: float | None = None) -> PassRecord:
    config = RunConfig(Path("ckpt"), sampling=SamplingSettings(seed=seed))
    return PassRecord(model, category, config, "p.png", f"{name or 'g'}.png", "auto", p, name)


def test_one_garments_report_fields_are_its_pass() -> None:
    record = Record(_pass("", Category.DRESS, ModelType.DC, 5), run_seed=5)
    assert record.report_fields() == {"category": "dress", "model_type": "dc", "seed": 5}
    assert record.report_fields(9, resumed=True)["seed"] == 9  # a resumed pair: its files' seed
    assert record.report_fields(None, resumed=True)["seed"] is None


def test_an_outfits_report_fields_name_the_garment_given_first_and_the_runs_seed() -> None:
    lower, upper = _pass("lower", Category.LOWER, ModelType.DC, 111), _pass("upper", Category.UPPER, ModelType.HD, 222)
    for listed, category in ((("upper", "lower"), "upper"), (("lower", "upper"), "lower")):
        record = Record(upper, (lower, upper), run_seed=7, listed=listed)
        assert record.report_fields() == {"category": category, "model_type": "dc+hd", "seed": 7}


def test_garment_lines_say_an_outfits_passes_or_a_classified_category() -> None:
    assert Record(_pass("", Category.UPPER, ModelType.HD, 1)).garment_lines(category_words) == []
    classified = Record(_pass("", Category.DRESS, ModelType.DC, 1, p=0.87))
    assert classified.garment_lines(category_words) == ["category: dress (auto, p 0.87)"]
    lower, upper = _pass("lower", Category.LOWER, ModelType.DC, 1), _pass("upper", Category.UPPER, ModelType.HD, 2)
    assert Record(upper, (lower, upper)).garment_lines(category_words) == [
        "outfit: lower.png lower with dc, then upper.png upper with hd"]
