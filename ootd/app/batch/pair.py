"""One try-on request of a batch: a person and a garment (or an outfit's two), as read from a CSV row or a
folder listing; ootd/app/batch/pairs.py reads them, ootd/app/batch/table.py holds many of them compactly."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ootd.app.tryon.inputs import GarmentInput, JobInputs
from ootd.errors import UsageError
from ootd.settings import AUTO_CATEGORY, Category


@dataclass(frozen=True, slots=True)
class Pair:
    """One person + garment try-on request, as read from a CSV row or a folder listing."""

    person: Path
    garment: Path
    category: Category | None  # None when `problem` says why, or until an `auto` pair is classified
    mask: Path | None = None  # None: computed from pose + parsing
    index: int = 0  # position in the input (report order)
    source: str = ""  # where it came from, for messages ("pairs.csv line 4")
    reason: str | None = None  # why the request could not even be read (bad CSV row); shared by rows alike
    auto: bool = False  # the category is to be classified from the garment (`classify_pairs`)
    category_p: float | None = None  # ... and was, with this probability
    garment2: Path | None = None  # an outfit row's second garment (`top.png;trousers.png`), its category, mask
    category2: Category | None = None
    mask2: Path | None = None
    auto2: bool = False
    category2_p: float | None = None

    @property
    def outfit(self) -> bool:
        return self.garment2 is not None

    @property
    def problem(self) -> str | None:
        """`reason` with the row it is about (`pairs.csv line 4: ...`): made when asked, never kept a pair."""
        return None if self.reason is None else f"{self.source}: {self.reason}"

    @property
    def classified(self) -> bool:
        """Every garment's category is known (given, or `auto` done)."""
        return not (self.auto or self.auto2)

    def describe(self) -> str:
        second = f" + {self.garment2.name}" if self.garment2 is not None else ""
        return f"{self.person.name} + {self.garment.name}{second}"

    def inputs(self) -> tuple[Path | None, ...]:
        return self.person, self.garment, self.mask, self.garment2, self.mask2

    def job_inputs(self) -> JobInputs:
        """What this pair tries on (a pair with a `problem` has nothing to try on)."""
        if self.reason is not None:
            raise UsageError(self.problem)
        garments = [GarmentInput(self.garment, AUTO_CATEGORY if self.auto else self.category, self.mask,
                                 category_p=self.category_p)]
        if self.garment2 is not None:
            garments.append(GarmentInput(self.garment2, AUTO_CATEGORY if self.auto2 else self.category2, self.mask2,
                                         category_p=self.category2_p))
        return JobInputs.of(self.person, garments)
