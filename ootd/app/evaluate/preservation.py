"""`ootd eval RESULTS --preservation`: every result of a folder measured against the person photo it was made
from, without ground truth (ootd/app/tryon/preservation.py measures one; ootd/evaluation/preservation.py has the
figures).

Each result's person comes as eval finds it (matching.py `made_results`): a batch report gives the photo's path
as the batch was given it (and its mask); a result's record gives the photo's file name, found in `people` (the
folder of the person photos; `--truth` serves when none is given). A user's mask is found by the report's path or
by its recorded name in `masks`. The results are measured grouped by person, so each photo is parsed once.

Every result's figures are streamed to RESULTS/preservation.jsonl as they are measured (a header line, then one
line a result), written atomically; memory keeps a few numbers a result and the figures of the `WORST_KEPT` worst,
which preservation.html shows with their photos. A result that cannot be measured is skipped with its one-line
reason and the rest are measured; nothing measured at all is one error.
"""

from __future__ import annotations

import heapq
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ootd.app.evaluate.matching import (
    Made,
    MatchedBy,
    Matching,
    PhotoIndex,
    Skipped,
    made_results,
    report_files,
    require_folder,
    skipped_text,
)
from ootd.app.tryon.outputs import format_seconds
from ootd.app.tryon.preservation import Measured, ParseCache, Parser, measure_result
from ootd.app.tryon.provenance import is_ours
from ootd.app.tryon.record import software
from ootd.errors import OotdError, OutputError, printable
from ootd.evaluation.preservation import CHANGED_DELTA_E, REGIONS, Preservation, percent
from ootd.evaluation.settings import check_review_above
from ootd.imaging.atomic import write_atomic
from ootd.pipeline_types import Progress

FIGURES_NAME, PAGE_NAME = "preservation.jsonl", "preservation.html"
WORST_KEPT = 200  # results whose whole figures are kept for the page
WORST_SHOWN = 10  # results the terminal's lines name, worst first
STAGE = "preservation"


@dataclass(frozen=True)
class PreservationOptions:
    """Where the person photos and the users' masks are, and the review threshold (a share), checked once."""

    people: Path | None = None
    masks: Path | None = None
    review_above: float | None = None

    @classmethod
    def from_words(cls, people: Path | None = None, masks: Path | None = None,
                   review_above: float | None = None) -> PreservationOptions:
        for folder, setting in ((people, "people"), (masks, "masks")):
            if folder is not None:
                require_folder(Path(folder), setting)
        return cls(people, masks, check_review_above(review_above))


@dataclass(frozen=True)
class Row:
    """What a report keeps of every measured result."""

    result: str
    person: str
    score: float
    summary: str
    review: bool


@dataclass
class PreservationReport:
    results: Path
    rows: list[Row]
    worst: list[tuple[Measured, str]]  # the WORST_KEPT worst with their person photo, worst first
    regions: dict[str, dict[str, float | int]]  # per region: results where present, mean kept changed share
    skipped: list[Skipped]
    review_above: float | None
    parses: int
    seconds: float
    written: list[Path] = field(default_factory=list)

    def worst_rows(self, count: int | None = None) -> list[Row]:
        ordered = sorted(self.rows, key=lambda r: (-r.score, r.result))
        return ordered if count is None else ordered[:count]

    @property
    def reviews(self) -> int:
        return sum(r.review for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        return {**software(), "results": str(self.results), "measured": len(self.rows),
                "changed_delta_e": CHANGED_DELTA_E, "regions": self.regions, "parses": self.parses,
                "review_above": self.review_above, "review": self.reviews,
                "skipped": [s.to_json() for s in self.skipped], "seconds": round(self.seconds, 3),
                "worst_first": [{"result": r.result, "person": r.person, "score": round(r.score, 6),
                                 "summary": r.summary, "review": r.review} for r in self.worst_rows()],
                "figures": [str(p) for p in self.written if p.name == FIGURES_NAME]}

    def lines(self) -> list[str]:
        count = f"{len(self.rows)} result{'' if len(self.rows) == 1 else 's'}"
        lines = [f"preservation: measured {count} of {printable(self.results)} against their person photos "
                 f"({self.parses} parsed) in {format_seconds(self.seconds)}"]
        changed = [f"{name} {percent(v['kept_changed'])}" for name, v in self.regions.items()
                   if isinstance(v.get("kept_changed"), float)]
        if changed:
            lines.append(f"  changed outside the mask, mean over the results: {', '.join(changed)} "
                         f"(a pixel changed: CIEDE2000 above {CHANGED_DELTA_E:g})")
        for row in self.worst_rows(WORST_SHOWN):
            lines.append(f"  {printable(Path(row.result).name)}: {row.summary}")
        if len(self.rows) > WORST_SHOWN:
            lines.append(f"  ... {len(self.rows) - WORST_SHOWN} more (worst first in --json and {PAGE_NAME})")
        if self.review_above is not None:
            lines.append(f"review: {self.reviews} of {len(self.rows)} above {percent(self.review_above)} changed")
        if self.skipped:
            lines.append(f"not measured {len(self.skipped)}: {skipped_text(self.skipped)}")
        return lines


class _Finder:
    """A result's person photo and its user's masks, from the report's paths or the folders, by name."""

    def __init__(self, options: PreservationOptions, truth: Path | None) -> None:
        people = options.people or truth
        self.people = PhotoIndex(people) if people is not None else None
        self.masks = PhotoIndex(options.masks) if options.masks is not None else None

    def person(self, made: Made) -> Path:
        given = Path(made.person)
        if made.by is MatchedBy.REPORT and given.is_file():
            return given
        if self.people is None:
            raise OotdError.about("people", "its person photo {photo} is not found: give the folder of the "
                                  "person photos with {@people}", photo=printable(given.name))
        found, problem = self.people.find(given.name)
        if found is None:
            raise OotdError(f"person photo: {problem}")
        return found

    def masks_of(self, made: Made) -> dict[str, Path]:
        found: dict[str, Path] = {}
        if self.masks is not None:
            found.update(self.masks.names)
        if made.mask and Path(made.mask).is_file():
            found[Path(made.mask).name] = Path(made.mask)
        return found


class _Regions:
    """The mean kept changed share of each region over the results where it is present."""

    def __init__(self) -> None:
        self.present = dict.fromkeys(REGIONS, 0)
        self.absent = dict.fromkeys(REGIONS, 0)
        self.sums = dict.fromkeys(REGIONS, 0.0)
        self.counted = dict.fromkeys(REGIONS, 0)

    def add(self, measured: Measured) -> None:
        assert measured.figures is not None
        for region in measured.figures.regions:
            if region.absent:
                self.absent[region.name] += 1
                continue
            self.present[region.name] += 1
            if region.kept.changed is not None:
                self.sums[region.name] += region.kept.changed
                self.counted[region.name] += 1

    def to_json(self) -> dict[str, dict[str, float | int]]:
        return {name: {"present": self.present[name], "absent": self.absent[name],
                       **({"kept_changed": round(self.sums[name] / self.counted[name], 6)}
                          if self.counted[name] else {})} for name in REGIONS}


class _Run:
    def __init__(self, made: list[Made], matching: Matching, finder: _Finder, cache: ParseCache,
                 options: PreservationOptions, progress: Progress | None) -> None:
        self.made, self.matching, self.finder, self.cache = made, matching, finder, cache
        self.options, self.progress = options, progress
        self.rows: list[Row] = []
        self.heap: list[tuple[float, int, Measured, str]] = []  # the worst kept: (score, order, ...) min-heap
        self.regions = _Regions()
        self.first_error: OotdError | None = None  # the first skip's own error (its words for the front end)

    def measure(self, handle: IO[bytes]) -> None:
        handle.write((json.dumps({**software(), "kind": "preservation", "changed_delta_e": CHANGED_DELTA_E})
                      + "\n").encode())
        for done, made in enumerate(self.made, 1):
            try:
                if made.by is MatchedBy.NAME:
                    raise OotdError("not a result of ootd's (its PNG has no try-on record), so its photo, framing "
                                    "and mask are not known")
                person = self.finder.person(made)
                measured = Measured(printable(made.result),
                                    measure_result(made.result, person, self.cache, self.finder.masks_of(made)))
            except OotdError as exc:
                self.matching.skip(made.result, " ".join(str(exc).split()))
                self.first_error = self.first_error or exc
            else:
                self._keep(measured, printable(person), handle)
            if self.progress is not None:
                self.progress(STAGE, done, len(self.made))
        if not self.rows:  # the temporary file goes, an earlier preservation.jsonl stays
            raise self._nothing_measured()

    def _nothing_measured(self) -> OotdError:
        """One error naming the first skip's reason, in the front end's words when that reason names a setting."""
        first = self.matching.skipped[0] if self.matching.skipped else None
        if first is None:
            return OotdError("nothing measured: every result was skipped")
        cause = self.first_error
        if cause is not None and cause.setting is not None and cause._template is not None:
            template, otherwise, values = cause._template
            return OotdError.about(cause.setting, "nothing measured: every result was skipped: {what}: " + template,
                                   value=cause.value, otherwise=otherwise,
                                   **{**{k: v for k, v in values.items() if k != "value"}, "what": first.what})
        return OotdError(f"nothing measured: every result was skipped: {first.what}: {first.reason}")

    def _keep(self, measured: Measured, person: str, handle: IO[bytes]) -> None:
        assert measured.figures is not None
        figures, above = measured.figures, self.options.review_above
        review = above is not None and figures.score > above
        row = Row(measured.result, person, figures.score, figures.summary() + (" · review" if review else ""),
                  review)
        self.rows.append(row)
        self.regions.add(measured)
        entry = {**measured.to_json(), "person": person, "review": review}
        handle.write((json.dumps(entry) + "\n").encode("utf-8", "backslashreplace"))
        item = (figures.score, -len(self.rows), measured, person)
        if len(self.heap) < WORST_KEPT:
            heapq.heappush(self.heap, item)
        elif item[:2] > self.heap[0][:2]:
            heapq.heapreplace(self.heap, item)


def _check_replaceable(path: Path) -> None:
    """Only our own figures and page are replaced without asking."""
    from ootd.app.evaluate.preservation_page import GENERATOR

    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            first = handle.readline(1 << 20)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"cannot read {printable(path)}: {exc.strerror or exc}") from None
    if path.suffix == ".html":
        ours = GENERATOR in first
    else:
        try:
            ours = is_ours(json.loads(first))
        except (ValueError, AttributeError):
            ours = False
    if not ours:
        raise OutputError(f"{printable(path)} exists and is not ootd's preservation figures: move it away first")


def measure_folder(results: Path, options: PreservationOptions, parser: Parser, progress: Progress | None = None,
                   truth: Path | None = None, reports: list[Path] | None = None) -> PreservationReport:
    """Every result of `results` measured against its person photo (module docstring); `parser` loads the pose
    and parsing models when the first photo is parsed. Writes preservation.jsonl and preservation.html there."""
    from ootd.app.evaluate.preservation_page import preservation_page
    from ootd.imaging.atomic import write_text_atomic

    start = time.perf_counter()
    results = require_folder(Path(results), "results", "results folder")
    figures_path = results / FIGURES_NAME
    _check_replaceable(figures_path)
    matching = Matching()
    made = sorted(made_results(results, matching, reports), key=lambda m: (m.person, str(m.result)))
    if not made:
        raise OotdError(f"nothing to measure: no result in {printable(results)}")
    run = _Run(made, matching, _Finder(options, truth), ParseCache(parser), options, progress)
    page = results / PAGE_NAME
    _check_replaceable(page)
    write_atomic(figures_path, run.measure, overwrite=True)
    worst = [(m, person) for _, _, m, person in sorted(run.heap, key=lambda i: (-i[0], -i[1]))]
    report = PreservationReport(results, run.rows, worst, run.regions.to_json(), matching.skipped,
                                options.review_above, run.cache.parses, time.perf_counter() - start)
    write_text_atomic(page, preservation_page(results, report.lines(), worst, options.review_above))
    report.written = [figures_path, page]
    return report


def recorded_figures(folder: Path) -> dict[str, Preservation]:
    """The preservation figures already measured for the results of `folder`, by file name: its batch reports'
    (a batch measures each pair it makes) and its preservation.jsonl (`ootd eval --preservation`; newer when
    both have a result). Lines that hold none are passed over."""
    found: dict[str, Preservation] = {}
    for path in [*report_files(folder), folder / FIGURES_NAME]:
        try:
            handle = open(path, encoding="utf-8", errors="replace")
        except OSError:
            continue
        with handle:
            for line in handle:
                try:
                    entry = json.loads(line)
                    entries = entry["preservation"]["results"] if "preservation" in entry else [entry]
                    for one in entries:
                        measured = Measured.from_json(one)
                        if measured.figures is not None:
                            found[Path(measured.result).name] = measured.figures
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
    return found
