"""Pure parts of `auto` and outfits: the category word, the margin, the order of an outfit's passes, the seeds."""

from __future__ import annotations

import pytest

from ootd.app.tryon.autocategory import check_margin
from ootd.app.tryon.inputs import GarmentInput as Garment
from ootd.app.tryon.passes import order_outfit, pass_seed
from ootd.errors import UsageError
from ootd.method.classify import Classification
from ootd.settings import AUTO_CATEGORY, Category, check_category_margin, parse_category_word


def flag(name: str) -> str:
    """A front end's word for a setting, as the CLI's: `--category-margin`."""
    return "--" + name.replace("_", "-")


def test_category_words() -> None:
    assert parse_category_word("Auto") == AUTO_CATEGORY and parse_category_word("dresses") is Category.DRESS
    assert not isinstance(parse_category_word("auto"), Category)  # never a category a pipeline could be handed
    with pytest.raises(UsageError, match="upper, lower, dress or auto"):
        parse_category_word("hat")
    assert check_category_margin(0) == 0.0
    for bad in (-0.1, 1.0):
        with pytest.raises(UsageError, match="^category_margin must be") as refused:  # the library's words
            check_category_margin(bad)
        assert refused.value.words(flag).startswith("--category-margin must be from 0 up to (not including) 1")


def test_margin() -> None:
    found = Classification(((Category.UPPER, 0.5), (Category.DRESS, 0.4), (Category.LOWER, 0.1)))
    check_margin(found, 0.05, "g.png")
    with pytest.raises(UsageError) as caught:
        check_margin(found, 0.2, "g.png")
    message = caught.value.words(flag)  # as the CLI says it (the error names the setting: `category`)
    assert "upper 0.50" in message and "dress 0.40" in message and caught.value.setting == "category"
    assert "lower" not in message.split("give it")[0]
    assert message.endswith("give it with --category upper, dress or lower")  # every category, none left unsaid
    assert str(caught.value).endswith("give it with category upper, dress or lower")


def test_outfit_order_and_refusals() -> None:
    top, trousers = Garment("top.png", Category.UPPER), Garment("trousers.png", Category.LOWER)
    assert order_outfit([top, trousers]) == (trousers, top) == order_outfit([trousers, top])
    with pytest.raises(UsageError, match="dress.png is a dress"):
        order_outfit([Garment("dress.png", Category.DRESS), top])
    with pytest.raises(UsageError, match="both upper"):
        order_outfit([top, top])
    with pytest.raises(UsageError, match="two garments"):
        order_outfit([top])


def test_pass_seeds_are_derived_and_distinct() -> None:
    seeds = [pass_seed(7, name) for name in ("lower", "upper 0", "upper 1")]
    assert len(set(seeds)) == 3 and all(0 <= s < 2**63 for s in seeds)
    assert seeds == [pass_seed(7, name) for name in ("lower", "upper 0", "upper 1")]
    assert pass_seed(8, "lower") != seeds[0]
