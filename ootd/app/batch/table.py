"""The pairs of a batch held as columns, so 10^6 pairs are tens of MB, not hundreds.

A `Pair` object with its `source` string and its index is ~250 bytes; a list of 10^6 of them is a quarter of a
GB before anything is done with them. Here each pair is ~65 bytes of arrays: numbers for its files (each distinct
Path held once), its categories, flags, index and where it came from (`pairs.csv line 17` as the shared
`pairs.csv line ` and 17), and for a row that could not be read the number of its reason (held once however
many rows share it). A `Pair` is made when it is read - what every part of a batch already does one at a time.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from ootd.app.batch.pair import Pair
from ootd.settings import Category

CATEGORIES = list(Category)
_NUMBERED = re.compile(r"(.*?)([1-9][0-9]{0,17})", re.DOTALL)  # `pairs.csv line 17`: the shared part, 17
FILES = 5  # person, garment, mask, garment2, mask2


class _Interned:
    """Distinct values by number (0: None)."""

    def __init__(self) -> None:
        self.values: list = [None]
        self.numbers: dict = {}

    def number(self, value: object) -> int:
        if value is None:
            return 0
        found = self.numbers.get(value)
        if found is None:
            found = self.numbers[value] = len(self.values)
            self.values.append(value)
        return found


class PairTable(Sequence[Pair]):
    """A read-only sequence of pairs (`append` while it is being filled), a few dozen bytes a pair."""

    def __init__(self, pairs: Iterable[Pair] = ()) -> None:
        self._paths = _Interned()
        self._texts = _Interned()  # sources' shared parts and reasons
        self._files = array("i")  # FILES a pair
        self._categories = array("b")  # 2 a pair: a Category's position, -1 for None
        self._flags = bytearray()  # auto | auto2 << 1
        self._indices = array("q")
        self._sources = array("i")  # the shared part of its source
        self._numbers = array("q")  # ... and its number (-1: none)
        self._reasons = array("i")
        self._probabilities = array("d")  # 2 a pair: category_p, category2_p (nan: None)
        for pair in pairs:
            self.append(pair)

    def append(self, pair: Pair) -> None:
        path = self._paths.number
        self._files.extend((path(pair.person), path(pair.garment), path(pair.mask), path(pair.garment2),
                            path(pair.mask2)))
        self._categories.extend(CATEGORIES.index(c) if c is not None else -1 for c in (pair.category, pair.category2))
        self._flags.append(pair.auto | pair.auto2 << 1)
        self._indices.append(pair.index)
        match = _NUMBERED.fullmatch(pair.source)
        shared, number = (match.group(1), int(match.group(2))) if match else (pair.source, -1)
        self._sources.append(self._texts.number(shared))
        self._numbers.append(number)
        self._reasons.append(self._texts.number(pair.reason))
        self._probabilities.extend(math.nan if p is None else p for p in (pair.category_p, pair.category2_p))

    def __len__(self) -> int:
        return len(self._indices)

    @overload
    def __getitem__(self, position: int) -> Pair: ...

    @overload
    def __getitem__(self, position: slice) -> list[Pair]: ...

    def __getitem__(self, position: int | slice) -> Pair | list[Pair]:
        if isinstance(position, slice):
            return [self[i] for i in range(*position.indices(len(self)))]
        if position < 0:
            position += len(self)
        if not 0 <= position < len(self):
            raise IndexError(position)
        paths, texts, files, categories, chances = (self._paths.values, self._texts.values, self._files,
                                                    self._categories, self._probabilities)
        first, second = FILES * position, 2 * position
        category, category2 = categories[second], categories[second + 1]
        chance, chance2 = chances[second], chances[second + 1]
        number, source, flags = self._numbers[position], texts[self._sources[position]] or "", self._flags[position]
        return Pair(paths[files[first]], paths[files[first + 1]], CATEGORIES[category] if category >= 0 else None,
                    paths[files[first + 2]], self._indices[position],
                    source if number < 0 else f"{source}{number}", texts[self._reasons[position]], bool(flags & 1),
                    None if chance != chance else chance, paths[files[first + 3]],  # nan != nan: None
                    CATEGORIES[category2] if category2 >= 0 else None, paths[files[first + 4]], bool(flags & 2),
                    None if chance2 != chance2 else chance2)

    def __iter__(self) -> Iterator[Pair]:
        return (self[i] for i in range(len(self)))


def pair_table(pairs: Sequence[Pair] | Iterable[Pair]) -> PairTable:
    """`pairs` as a table (a table already is one)."""
    return pairs if isinstance(pairs, PairTable) else PairTable(pairs)
