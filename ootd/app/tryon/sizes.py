"""A memory size as a user gives it (`20GiB`, `512MiB`, `2e10`): the word of the `max_memory` setting, kept with
the unit it was given in so that messages speak it."""

from __future__ import annotations

import math
import re

from ootd.errors import UsageError

_SCALES = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_AUTO_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


class ByteSize(int):
    """A number of bytes that remembers how it was given (`10MiB` -> 10485760, text "10MiB", unit "MiB"), so
    messages about it speak the user's unit; everywhere else it is the int it equals."""

    text: str
    unit: str

    def __new__(cls, value: int, text: str = "", unit: str = "") -> ByteSize:
        size = super().__new__(cls, value)
        size.text, size.unit = text or str(int(value)), unit
        return size

    def __getnewargs__(self) -> tuple[int, str, str]:  # pickling and copying keep the words
        return int(self), self.text, self.unit

    def format(self, n: int) -> str:
        """`n` bytes in this size's unit (a plain byte count: the largest binary unit under `n`), rounded up to
        three digits, as an option value (`481MiB`, `0.5GiB`): a suggested budget never falls short of `n`."""
        letter = self.unit[:1].lower()
        unit, per = (self.unit, _SCALES[letter]) if letter else next(
            ((u, size) for u, size in _AUTO_UNITS if n >= size), ("", 1))
        value = n / per
        digits = max(0, 2 - math.floor(math.log10(value))) if value > 0 else 0
        rounded = math.ceil(value * 10**digits - 1e-9) / 10**digits
        return f"{rounded:g}{unit}"


def parse_size(value: str | None) -> ByteSize | None:
    """'20GiB', '20GB', '512MiB', '2e10' -> bytes (GB and GiB both mean 2**30: what users mean), keeping the
    words as typed for messages (and the unit, its case normalised: 10mib -> MiB)."""
    if value is None:
        return None
    text = value.strip().replace(" ", "")
    match = re.fullmatch(r"(?P<number>[0-9.eE+-]+)(?P<unit>[kKmMgGtT]?)(?P<i>[iI]?)(?P<b>[bB]?)", text)
    if match is None or (match["i"] and not match["unit"]):
        raise UsageError(f"bad memory size {value!r}: use e.g. 20GiB or 512MiB")
    letter = match["unit"].lower()
    try:
        size = int(float(match["number"]) * _SCALES[letter])
    except (ValueError, OverflowError):
        raise UsageError(f"bad memory size {value!r}: use e.g. 20GiB or 512MiB") from None
    if size <= 0:
        raise UsageError(f"memory size must be positive, got {value!r}")
    unit = "" if not letter else letter.upper() + ("iB" if match["i"] or not match["b"] else "B")
    return ByteSize(size, text, unit)
