"""Which real photo each result is to be measured against, and what cannot be measured, and why.

A result's photo is the photo of its person, found in the truth folder by file name (`alice.jpg`; else the one
photo with that stem, `alice.png`). Who the person was comes from, in this order:

- `--pairs CSV`: rows `result,truth` (paths relative to the results and the truth folder; header optional);
- the batch report(s) in the results folder (`batch_report*.jsonl`): each finished pair's outputs and its person;
  a failed pair is listed as skipped with its error;
- a result's PNG record (a picture ootd made: its `person`); the pictures ootd writes beside results (mask, pose,
  contact sheets: a record without a sample number) are skipped as not results;
- the result's own name (any other tool's images: `alice.png` against `alice.jpg`).

Every file is looked at once (a PNG's header chunks, not its pixels); the truth folder is listed once.
"""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from ootd.app.batch.folders import IMAGE_EXTENSIONS, list_images
from ootd.app.batch.report import REPORT_NAME
from ootd.app.tryon.provenance import is_intermediate_record, is_ours, read_record, recorded_inputs
from ootd.errors import OotdError, UsageError, printable

REPORT_GLOB = f"{Path(REPORT_NAME).stem}*.jsonl"  # batch_report.jsonl and the shards' batch_report.shard0of2.jsonl
DONE = ("ok", "skipped")  # report statuses whose outputs exist


class MatchedBy(StrEnum):
    LIST = "--pairs"
    REPORT = "batch report"
    RECORD = "PNG record"
    NAME = "name"


@dataclass(frozen=True)
class Match:
    result: Path
    truth: Path | None  # None in an unpaired set
    by: MatchedBy


@dataclass(frozen=True)
class Skipped:
    what: str  # the file or row
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"what": self.what, "reason": self.reason}


SKIPPED_SHOWN = 5  # skipped files named in the lines (all of them are in the JSON)


def skipped_text(skipped: list[Skipped]) -> str:
    """The skipped files for a summary line: the first few with their reasons, the rest counted."""
    shown = "; ".join(f"{s.what}: {s.reason}" for s in skipped[:SKIPPED_SHOWN])
    more = f"; and {len(skipped) - SKIPPED_SHOWN} more (--json lists all)" if len(skipped) > SKIPPED_SHOWN else ""
    return shown + more


@dataclass
class Matching:
    matches: list[Match] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    reports: list[Path] = field(default_factory=list)  # the batch reports it was read from

    def by(self) -> dict[str, int]:
        return dict(Counter(m.by.value for m in self.matches))

    def skip(self, what: str | Path, reason: str) -> None:
        self.skipped.append(Skipped(printable(what), reason))


def require_folder(path: Path, setting: str, what: str | None = None) -> Path:
    """`path`, a folder; else a UsageError about `setting`, the folder called `what` (default: the setting)."""
    if not path.is_dir():
        raise UsageError.about(setting, (what or "{@" + setting + "}") + " {path}: {problem}", path=printable(path),
                               problem="is not a folder" if path.exists() else "not found")
    return path


class PhotoIndex:
    """The truth folder, listed once: a name finds its photo by file name, else by stem when only one has it."""

    def __init__(self, folder: Path) -> None:
        self.folder = require_folder(folder, "truth", "{@truth} folder")
        self.names: dict[str, Path] = {}
        self.stems: dict[str, list[Path]] = {}
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise UsageError(f"cannot list {printable(folder)}: {exc.strerror or exc}") from None
        for entry in entries:
            if entry.name.startswith(".") or Path(entry.name).suffix.lower() not in IMAGE_EXTENSIONS:
                continue
            path = Path(entry.path)
            self.names[entry.name] = path
            self.stems.setdefault(Path(entry.name).stem, []).append(path)

    def photos(self) -> list[Path]:
        return list(self.names.values())

    def find(self, name: str) -> tuple[Path | None, str | None]:
        """The photo for `name`, or why there is none."""
        found = self.names.get(name)
        if found is not None:
            return found, None
        same = self.stems.get(Path(name).stem, [])
        if len(same) == 1:
            return same[0], None
        where = printable(self.folder)
        if same:
            return None, f"{len(same)} photos named {Path(name).stem}.* in {where}: rename all but one"
        return None, f"no photo named {printable(name)} (or {printable(Path(name).stem)}.*) in {where}"


def report_files(folder: Path) -> list[Path]:
    """The batch reports in a results folder (the batch's and its shards'), sorted."""
    return sorted(p for p in folder.glob(REPORT_GLOB) if p.is_file())


def _check_finished(report: Path) -> None:
    """A batch still writing its report holds an exclusive lock on it: measure after it ends."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no lock to ask
        return
    try:
        fd = os.open(report, os.O_RDONLY)
    except OSError as exc:
        raise UsageError(f"cannot read the batch report {printable(report)}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        raise UsageError(f"a batch is still writing {printable(report)}: evaluate when it has finished") from None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Made:
    """A result and what made it, as the batch report (or its record, or its name) gives them: the person photo
    and the mask as given to the batch (paths), or their file names."""

    result: Path
    person: str
    by: MatchedBy
    mask: str | None = None


def _from_reports(folder: Path, reports: list[Path], matching: Matching) -> Iterator[Made]:
    """Every finished pair's results in the reports, with its person and mask; failed pairs are skipped."""
    for report in reports:
        _check_finished(report)
        with open(report, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                where = f"{report.name} line {number}"
                try:
                    entry = json.loads(line)
                    status, person, outputs = entry["status"], entry["person"], list(entry.get("outputs") or ())
                    mask = entry.get("mask")
                except (ValueError, KeyError, TypeError, AttributeError):
                    matching.skip(where, "not a report line")
                    continue
                if status not in DONE:
                    matching.skip(f"{where} ({person})", f"the try-on failed: {entry.get('error') or status}")
                    continue
                for output in outputs:  # written into the output folder: found there wherever it moved
                    yield Made(folder / Path(output).name, str(person), MatchedBy.REPORT,
                               str(mask) if mask else None)


def _from_folder(folder: Path, matching: Matching) -> Iterator[Made]:
    """Every image of the folder: an ootd result by its record, an intermediate skipped, any other by name."""
    for path in list_images(folder, "results"):
        record = read_record(path)
        if is_intermediate_record(record):
            matching.skip(path, "a picture ootd writes beside its results (mask, pose, parsing, contact sheet), "
                                "not a result")
        elif is_ours(record) and (person := recorded_inputs(record).person):
            yield Made(path, person, MatchedBy.RECORD)
        else:
            yield Made(path, path.name, MatchedBy.NAME)


def _from_list(csv_path: Path, results: Path, truth: Path, matching: Matching) -> list[Match]:
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.reader(handle))
    except OSError as exc:
        raise UsageError.about("pairs", "cannot read {@pairs} {path}: {problem}", path=printable(csv_path),
                               problem=exc.strerror or exc) from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise UsageError.about("pairs", "{@pairs} {path} is not a CSV of result,truth rows ({problem})",
                               path=printable(csv_path), problem=exc) from None
    found = []
    for number, row in enumerate(rows, 1):
        cells = [c.strip() for c in row]
        if not any(cells) or cells[0].startswith("#"):
            continue
        if number == 1 and [c.lower() for c in cells[:2]] == ["result", "truth"]:
            continue
        if len(cells) != 2 or not all(cells):
            matching.skip(f"{csv_path.name} line {number}", "expected two cells: result,truth")
            continue
        found.append(Match(results / cells[0], truth / cells[1], MatchedBy.LIST))
    return found


def made_results(results: Path, matching: Matching, reports: list[Path] | None = None) -> Iterator[Made]:
    """Every result of a folder with its person (and mask): from its batch reports (`reports`, default every one
    in the folder), else from each image's record or name; what is left out is in `matching.skipped`."""
    matching.reports = report_files(results) if reports is None else list(reports)
    if matching.reports:
        return _from_reports(results, matching.reports, matching)
    return _from_folder(results, matching)


def match_results(results: Path, truth: Path, pairs_csv: Path | None = None,
                  reports: list[Path] | None = None) -> Matching:
    """Every result with its real photo (module docstring); what has none is in `skipped`. No match at all is
    one error naming the first reason. `reports`: read these batch reports (default: every one in `results`)."""
    matching = Matching()
    require_folder(results, "results", "results folder")
    photos = PhotoIndex(truth)
    if pairs_csv is not None:
        matching.matches = _from_list(pairs_csv, results, truth, matching)
    else:
        for made in made_results(results, matching, reports):
            photo, problem = photos.find(Path(made.person).name)
            if photo is None:
                matching.skip(made.result, problem or "no photo")
            else:
                matching.matches.append(Match(made.result, photo, made.by))
    if not matching.matches:
        first = f": {matching.skipped[0].what}: {matching.skipped[0].reason}" if matching.skipped else ""
        raise OotdError(f"nothing to evaluate: no result in {printable(results)} has a photo in "
                        f"{printable(truth)}{first}")
    return matching


def unpaired_sets(results: Path, truth: Path, reports: list[Path] | None = None) -> tuple[Matching, list[Path]]:
    """The results (as `match_results` finds them, without photos) and every photo of the truth folder."""
    matching = Matching()
    require_folder(results, "results", "results folder")
    photos = PhotoIndex(truth).photos()
    matching.matches = [Match(made.result, None, made.by) for made in made_results(results, matching, reports)]
    if not matching.matches:
        raise OotdError(f"nothing to evaluate: no result in {printable(results)}")
    if not photos:
        raise OotdError(f"nothing to evaluate: no photo in {printable(truth)} ({', '.join(IMAGE_EXTENSIONS)})")
    return matching, photos
