"""What a batch says of preservation (docs/preservation.md): each pair made now is measured as it finishes
(ootd/app/batch/runner.py, ootd/app/tryon/preservation.py); this module keeps the batch's tally of it (how many
pairs were measured, which were not and why, how many are marked for review, the worst few) for the summary and
--json, and renders the contact sheet's table of the pairs that changed most, worst first.

Bounded whatever the batch's size: counts, the first reason a pair was not measured, and a heap of the
`LISTED` worst pairs.
"""

from __future__ import annotations

import heapq
import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ootd.app.tryon.preservation import PairPreservation, PreservationChoice
from ootd.errors import printable
from ootd.evaluation.preservation import CHANGED_DELTA_E, percent

LISTED = 100  # the worst pairs the contact sheet's table lists (the report has every pair's figures)
SUMMARY_LISTED = 3  # ... and the summary names


@dataclass(frozen=True)
class Worst:
    """A pair as the worst-first list shows it."""

    score: float
    index: int
    summary: str
    review: bool
    outputs: tuple[str, ...]


class PreservationTally:
    """A batch's preservation figures as its reports go past, O(1) a report (a heap of the worst LISTED)."""

    def __init__(self, choice: PreservationChoice | None = None) -> None:
        self.choice = choice or PreservationChoice()
        self.measured = 0
        self.unmeasured = 0
        self.problem: str | None = None  # the first reason a pair was not measured
        self.reviews = 0
        self._worst: list[tuple[float, int, Worst]] = []  # a min-heap of (score, -index, ...)

    def add(self, index: int, kept: PairPreservation | None, outputs: Sequence[str]) -> None:
        if kept is None:
            return
        score = kept.score
        if score is None:
            self.unmeasured += 1
            self.problem = self.problem or next((m.problem for m in kept.results if m.problem), None)
            return
        self.measured += 1
        self.reviews += kept.review
        entry = (score, -index, Worst(score, index, kept.summary(), kept.review, tuple(outputs)))
        if len(self._worst) < LISTED:
            heapq.heappush(self._worst, entry)
        elif entry[:2] > self._worst[0][:2]:
            heapq.heapreplace(self._worst, entry)

    def worst(self, count: int | None = None) -> list[Worst]:
        ordered = [w for _, _, w in sorted(self._worst, key=lambda e: (-e[0], -e[1]))]
        return ordered if count is None else ordered[:count]

    def lines(self, made_earlier: int) -> list[str]:
        """The batch summary's lines (none when it was not asked for)."""
        if not self.choice.on:
            return []
        parts = [f"preservation: {self.measured} pair(s) measured"]
        if self.unmeasured:
            parts.append(f"{self.unmeasured} not: {self.problem}" if self.problem else f"{self.unmeasured} not")
        if made_earlier:
            parts.append(f"{made_earlier} made earlier not measured now (`ootd eval OUTPUT --preservation` "
                         "measures every pair)")
        lines = ["; ".join(parts)]
        for worst in self.worst(SUMMARY_LISTED):
            name = printable(worst.outputs[0]).rsplit("/", 1)[-1] if worst.outputs else f"pair {worst.index + 1}"
            lines.append(f"  {name}: {worst.summary}{' · review' if worst.review else ''}")
        above = self.choice.review_above
        if above is not None:
            lines.append(f"review: {self.reviews} pair(s) with more than {percent(above)} of a region outside the "
                         "mask changed (marked in the report and the contact sheet)")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"measured": self.measured, "not_measured": self.unmeasured, "problem": self.problem,
                "review_above": self.choice.review_above, "review": self.reviews,
                "changed_delta_e": CHANGED_DELTA_E,
                "worst_first": [{"index": w.index, "score": round(w.score, 6), "summary": w.summary,
                                 "review": w.review, "outputs": list(w.outputs)} for w in self.worst()]}


def worst_table(worst: Sequence[Worst], label: Callable[[int], str], thumb: Callable[[str], str]) -> str:
    """The contact sheet's table of the pairs that changed most, worst first: each pair (`label(index)`: person +
    garment), the share of its worst region outside the mask that changed, its summary and its results
    (`thumb(path)`: a result's linked picture)."""
    if not worst:
        return ""
    rows = "".join(
        f'<tr class="{"review" if w.review else ""}"><td>{html.escape(label(w.index))}</td>'
        f"<td>{percent(w.score)}</td><td>{html.escape(printable(w.summary))}</td>"
        f'<td>{"".join(thumb(p) for p in w.outputs)}</td></tr>' for w in worst)
    return ('<style>.preservation img{height:96px}</style>'
            '<h2 id="preservation">What the try-ons changed, worst first</h2>'
            f'<p class="meta">The {len(worst)} pair(s) where the largest share of a region outside the mask '
            f"(face, hair, neck, arms, hands, legs, shoes, background) changed: a colour difference (CIEDE2000) above "
            f"{CHANGED_DELTA_E:g}. Every pair's figures are in the report.</p>"
            '<div class="grid"><table class="preservation"><tr><th>pair</th><th>worst region changed</th>'
            f"<th>what changed</th><th>results</th></tr>{rows}</table></div>")
