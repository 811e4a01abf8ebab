"""What an evaluation found: every pair's SSIM and LPIPS, the sets' FID and KID, what was skipped and why, and
what the numbers were computed with; as lines for a terminal (and a batch's summary) and as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ootd.app.evaluate.matching import Skipped, skipped_text
from ootd.app.tryon.outputs import format_seconds
from ootd.app.tryon.record import software
from ootd.errors import printable
from ootd.evaluation.framing import RESAMPLE
from ootd.evaluation.sets import SetScores
from ootd.evaluation.settings import NOT_COMPUTED

FRAMING_RULE = (f"results at their own size; each photo centre-cropped to the result's aspect and resized to its "
                f"size ({RESAMPLE.name.lower()})")


@dataclass(frozen=True)
class PairResult:
    result: str
    truth: str
    ssim: float
    lpips: float | None  # None: not computed (no network)

    def to_json(self) -> dict[str, Any]:
        return {"result": self.result, "truth": self.truth, "ssim": self.ssim, "lpips": self.lpips}


def worst_first(pairs: list[PairResult]) -> list[PairResult]:
    """The pairs a person should look at first: the largest LPIPS, then the lowest SSIM."""
    return sorted(pairs, key=lambda p: (-(p.lpips or 0.0), p.ssim, p.result))


@dataclass
class EvalReport:
    results: Path
    truth: Path
    paired: bool
    size: tuple[int, int] | None
    pairs: list[PairResult]
    sets: SetScores
    skipped: list[Skipped]
    matched_by: dict[str, int]
    framing: dict[str, int]  # photos cropped / resized to the results' frame
    stand_in: str | None
    networks: tuple[str, str] | None  # None: none installed (`missing` says why and how)
    seconds: float
    missing: str | None = None  # why LPIPS, FID and KID were not computed, with the command that installs them
    written: list[Path] = field(default_factory=list)

    def mean(self, name: str) -> float | None:
        values = [getattr(p, name) for p in self.pairs if getattr(p, name) is not None]
        return sum(values) / len(values) if values else None

    def worst(self, count: int | None = None) -> list[PairResult]:
        ordered = worst_first(self.pairs)
        return ordered if count is None else ordered[:count]

    def to_json(self) -> dict[str, Any]:
        return {
            **software(), "results": str(self.results), "truth": str(self.truth),
            "mode": "paired" if self.paired else "unpaired",
            "size": f"{self.size[0]}x{self.size[1]}" if self.size else None,
            "stand_in": self.stand_in, "networks": list(self.networks or ()), "not_computed": self.missing,
            "framing": FRAMING_RULE,
            "pairs": len(self.pairs), "ssim": self.mean("ssim"), "lpips": self.mean("lpips"),
            **{k: v for k, v in self.sets.to_json().items()}, "matched_by": self.matched_by,
            "photos_framed": self.framing, "skipped": [s.to_json() for s in self.skipped],
            "seconds": round(self.seconds, 3),
            "worst_first": [p.to_json() for p in self.worst()],
        }

    def lines(self) -> list[str]:
        """The table a terminal shows (and a batch's summary ends with)."""
        sets = self.sets
        where = f"{printable(self.results)} against {printable(self.truth)}"
        size = f" at {self.size[0]}x{self.size[1]}" if self.size else ""
        if self.paired:
            how = ", ".join(f"{n} by {by}" for by, n in self.matched_by.items())
            lpips = self.mean("lpips")
            lines = [f"evaluated {len(self.pairs)} pairs of {where}{size} (matched {how}) in "
                     f"{format_seconds(self.seconds)}",
                     f"  SSIM   {self.mean('ssim'):.4f}   higher is closer, 1 = identical (mean over the pairs)",
                     f"  LPIPS  {lpips:.4f}   lower is closer, 0 = identical (mean over the pairs)" if lpips is not None
                     else f"  LPIPS  {NOT_COMPUTED}"]
        else:
            lines = [f"evaluated {sets.results} results of {where}{size}, unpaired, in {format_seconds(self.seconds)}"]
        if sets.problem == NOT_COMPUTED:
            lines.append(f"  FID, KID: {NOT_COMPUTED}")
        elif sets.problem is not None:
            lines.append(f"  FID, KID: not computed: {sets.problem}")
        else:
            lines += [f"  FID    {sets.fid:.3f}   {sets.results} results against {sets.photos} photos",
                      f"  KID    {sets.kid:.5f} ± {sets.kid_std:.5f}   {sets.kid_subsets} subsets of "
                      f"{sets.kid_subset_size}"]
        framed = [f"{n} {what}" for what, n in self.framing.items() if n]
        if framed:
            lines.append(f"photos framed to the results' size: {', '.join(framed)} ({FRAMING_RULE})")
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)}: {skipped_text(self.skipped)}")
        if self.missing:
            lines.append(f"not computed: LPIPS, FID and KID: {self.missing}")
        if self.stand_in:
            lines.append(f"warning: {self.stand_in}")
        return lines
