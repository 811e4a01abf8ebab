"""The pairs of a batch as columns: every pair read back equal to the one put in (outfits, `auto`, reasons,
sources of every shape), and a few dozen bytes a pair where a list of Pair objects holds ~250."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from ootd.app.batch.pair import Pair
from ootd.app.batch.table import PairTable
from ootd.settings import Category

SOURCES = ["pairs.csv line 17", "pairs.csv line 1", "product #3", "zip #10", "line 007", "x", "", "a 0", "9",
           "pairs.csv line 123456789012"]


def some_pairs() -> list[Pair]:
    folder = Path("/data")
    pairs = []
    for i, source in enumerate(SOURCES):
        pairs.append(Pair(folder / f"p{i % 3}.png", folder / f"g{i}.png", list(Category)[i % 3] if i % 4 else None,
                          mask=folder / "m.png" if i % 2 else None, index=i * 7, source=source,
                          reason="no category" if i % 4 == 0 else None, auto=i == 5, category_p=0.25 * (i % 3) or None))
    pairs.append(Pair(folder / "p.png", folder / "top.png", Category.UPPER, folder / "m1.png", index=99,
                      source="pairs.csv line 100", garment2=folder / "trousers.png", category2=None,
                      mask2=folder / "m2.png", auto2=True, category2_p=0.875))
    return pairs


def test_every_pair_comes_back_as_it_went_in() -> None:
    pairs = some_pairs()
    table = PairTable(pairs)
    assert len(table) == len(pairs)
    assert list(table) == pairs and [table[i] for i in range(len(pairs))] == pairs
    assert table[-1] == pairs[-1] and table[2:5] == pairs[2:5]
    assert table[0].problem == "pairs.csv line 17: no category"
    with pytest.raises(IndexError):
        table[len(pairs)]


def test_the_table_holds_a_few_dozen_bytes_a_pair() -> None:
    folder = Path("/catalogue")
    people = [folder / f"person{i:04d}.png" for i in range(100)]
    garments = [folder / f"garment{j:03d}.png" for j in range(100)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        table = PairTable(Pair(people[i // 100], garments[i % 100], Category.UPPER, index=i,
                               source=f"pairs.csv line {i + 2}") for i in range(10000))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(table) == 10000 and table[4321].source == "pairs.csv line 4323"
    assert held / 10000 < 100, held / 10000
