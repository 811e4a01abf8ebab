"""The resume rule every batch engine shares: is a pair already done, with the settings asked for now?

Every PNG ootd writes records the settings that made its pixels (ootd/app/tryon/provenance.py). A pair is done
only when all its outputs exist and record the same settings as this run would use; outputs made with other
settings are `stale`, and the batch refuses to start rather than mix them up or replace them (the user picks:
the old settings, --overwrite, another --output, or a --name template that tells them apart). Device, precision
and attention backend are not compared: they change pixels only by rounding, and a batch resumed on another
machine should not redo its work. When the seed was drawn at random, it is not compared either: the files' seed
is kept for the rest of the batch (see BatchRunner).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ootd.app.tryon.outputs import Targets
from ootd.app.tryon.provenance import differences, read_record, recorded_seed


@dataclass(frozen=True)
class ResumeState:
    """What the files on disk say about one pair: `todo` (some or all missing), `done` or `stale`."""

    status: str
    seed: int | None = None  # the seed the existing files were made with
    reason: str | None = None  # why they are stale, one line


def resume_state(targets: Targets, expected: dict[str, str],
                 read: Callable[[Path], dict[str, str]] = read_record,
                 view: Callable[[dict[str, str]], dict[str, str]] = lambda record: record) -> ResumeState:
    """The rule: `done` when every output (samples, intermediates, grid) exists and records `expected`; `stale`
    when an existing one records something else; `todo` otherwise (only the missing files will be written).
    `read`: how a file's record is read (a batch passes the records it already read); `view`: the record as
    `expected` is compared with (the job's `comparable`)."""
    wanted = targets.all()
    existing = [p for p in wanted if p.exists()]
    seeds: set[str] = set()
    for path in existing:
        recorded = view(read(path))
        problem = differences(recorded, expected)
        if problem is not None:
            return ResumeState("stale", reason=f"{path} was made with {problem}")
        seeds.add(recorded_seed(recorded))
    if len(seeds) > 1:
        return ResumeState("stale", reason=f"{existing[0]} and the other samples were made with different seeds "
                                           f"({', '.join(sorted(seeds))})")
    seed = next(iter(seeds), "")
    return ResumeState("done" if existing and len(existing) == len(wanted) else "todo",
                       int(seed) if seed.isdigit() else None)


def stale_error(count: int, example: str) -> str:
    """The one line a batch refuses with."""
    return (f"{count} pair(s) have outputs made with other settings ({example}); rerun with those settings to "
            "resume, or use --overwrite to redo them, another --output, or a --name with the changed field "
            "(e.g. {steps})")
