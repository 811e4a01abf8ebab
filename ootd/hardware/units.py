"""Byte counts as people read them: the one formatter of every table, line and message that shows a size (memory
plans, checkpoint files, downloads, the doctor's GPUs)."""

from __future__ import annotations

_UNITS = (("GiB", 2**30, 2), ("MiB", 2**20, 1), ("KiB", 2**10, 1))


def size_text(n: float) -> str:
    """Bytes for tables and logs in the unit that shows them: `4.20 GiB`, `10.0 MiB`, `512.0 KiB`, `0 B` (a
    budget of 10 MiB is not `0.01 GiB`)."""
    for unit, scale, digits in _UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n:.0f} B"
