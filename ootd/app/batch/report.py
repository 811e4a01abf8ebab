"""The batch report: one JSON line per pair (PairReport), the summary of a batch (BatchSummary), and the writer
that keeps the file whole.

The lock: `ReportWriter` takes an exclusive flock on the report file itself before truncating it, so a second
batch writing the same report (same output folder, same shard) stops at once with "another batch is writing
here"; shards have their own reports and still share a folder. The kernel drops the lock when its process ends,
however it ends, so a killed batch never leaves a stale lock. Each line goes out in one append write; a line that
could not be written whole is cut off again, so the report only ever holds whole lines.
"""

from __future__ import annotations

import errno
import heapq
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.app.batch.pairs import Pair, Shard
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.outputs import format_seconds
from ootd.app.tryon.record import Record
from ootd.errors import OutputError, no_space, printable
from ootd.pipeline_types import RunInfo

if TYPE_CHECKING:
    from ootd.app.tryon.preservation import PairPreservation, PreservationChoice

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, whole-line appends only
    fcntl = None

REPORT_NAME = "batch_report.jsonl"
REPORT_LINE_START = b'{"index": '  # how every report line begins (PairReport.to_json)
ERRORS_LISTED = 100  # the summary's --json lists the first errors by row; the report has them all


def report_name(shard: Shard | None = None) -> str:
    """The report's file name in the output folder: one per shard, so shards never share a file."""
    return REPORT_NAME if shard is None else f"batch_report.{shard.name()}.jsonl"


@dataclass
class PairReport:
    """One line of the JSON-lines report: the pair's inputs as its row gave them, its outcome, and the settings
    its job's record gives (`of`: Record.report_fields, so they are decided in ootd/app/tryon/record.py)."""

    pair: Pair
    status: str  # ok | skipped | error
    model_type: str | None = None
    outputs: list[str] = field(default_factory=list)
    intermediates: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    seed: int | None = None
    timings: dict[str, Any] = field(default_factory=dict)
    reused: dict[str, bool] = field(default_factory=dict)
    category: str | None = None  # the category of the garment given first
    preservation: PairPreservation | None = None  # what its results changed of the photo (made now, measured)

    @classmethod
    def of(cls, pair: Pair, status: str, record: Record, seed: int | None = None, *, resumed: bool = False,
           **outcome: Any) -> PairReport:
        """The report of a pair with a job: its settings from the job's `record` (planned, or what ran);
        `resumed`: done by an earlier run, with the `seed` its files record."""
        return cls(pair, status, **record.report_fields(seed, resumed=resumed), **outcome)

    @classmethod
    def unplanned(cls, pair: Pair, error: str | None, seed: int | None) -> PairReport:
        """The error of a pair no job could be made for (an unreadable row, a refused combination): what its row
        says, and the batch's seed."""
        return cls(pair, "error", error=error, seed=seed,
                   category=pair.category.value if pair.category is not None else None)

    def ran(self, record: Record) -> None:
        """Its settings as the record of what ran gives them (a pair's report is made before it runs)."""
        for key, value in record.report_fields().items():
            setattr(self, key, value)

    def to_json(self) -> dict[str, Any]:
        pair = self.pair
        return {
            "index": pair.index,
            "source": pair.source,
            "person": printable(pair.person),  # file names that are not UTF-8 as \xNN escapes
            "garment": printable(pair.garment),
            "category": self.category,
            "mask": printable(pair.mask) if pair.mask is not None else None,
            "model_type": self.model_type,
            "status": self.status,
            "outputs": [printable(p) for p in self.outputs],
            "intermediates": {k: printable(p) for k, p in self.intermediates.items()},
            "error": printable(self.error) if self.error is not None else None,
            "seed": self.seed,
            "timings": self.timings,
            "reused": self.reused,
            **({"preservation": self.preservation.to_json()} if self.preservation is not None else {}),
        }


class Tally:
    """A batch's counts as its reports stream past, O(1) a report: what the summary says, without keeping every
    pair's report (a batch of 10^6 pairs would hold a GB). The errors it lists are the first `ERRORS_LISTED` by
    row; the report file has every one."""

    def __init__(self, preservation: PreservationChoice | None = None) -> None:
        from ootd.app.batch.preservation import PreservationTally

        self.preservation = PreservationTally(preservation)
        self.counts = {"ok": 0, "skipped": 0, "error": 0}
        self._seed: tuple[int, int] | None = None  # (row, seed) of the first row with a seed
        self._errors: list[tuple[int, dict[str, Any]]] = []  # a heap of (-row, entry): the first rows kept

    def add(self, report: PairReport) -> None:
        index = report.pair.index
        self.counts[report.status] = self.counts.get(report.status, 0) + 1
        self.preservation.add(index, report.preservation, report.outputs)
        if report.seed is not None and (self._seed is None or index < self._seed[0]):
            self._seed = (index, report.seed)
        if report.status == "error":
            entry = (-index, {"index": index, "person": str(report.pair.person), "garment": str(report.pair.garment),
                              "error": report.error})
            if len(self._errors) < ERRORS_LISTED:
                heapq.heappush(self._errors, entry)
            elif entry[0] > self._errors[0][0]:  # an earlier row than the last one kept
                heapq.heapreplace(self._errors, entry)

    @property
    def pairs(self) -> int:
        return sum(self.counts.values())

    @property
    def seed(self) -> int | None:
        return self._seed[1] if self._seed is not None else None

    def errors(self) -> list[dict[str, Any]]:
        """The first errors by row (at most ERRORS_LISTED)."""
        return [entry for _, entry in sorted(self._errors, key=lambda item: -item[0])]


@dataclass
class BatchSummary:
    tally: Tally
    seconds: float
    load_seconds: float
    loads: dict[str, int]
    prepared: dict[str, int]  # how many person/garment preparations actually ran
    report_path: Path | None
    ran: RunInfo | None = None  # how the latest pair ran (device, precision, attention); None: no pair ran
    engine: dict[str, Any] = field(default_factory=dict)  # what an engine adds (the Ray engine's workers)
    peak_memory: dict[str, int | None] = field(default_factory=dict)
    seed: int | None = None  # the batch's seed (a resumed random-seed batch keeps its files' seed)
    evaluation: Any = None  # with --truth: the EvalReport of ootd/app/evaluate (its `lines`, `to_json`)

    def count(self, status: str) -> int:
        return self.tally.counts.get(status, 0)

    @property
    def ok(self) -> bool:
        """True when every pair succeeded now or earlier (skipped = already done)."""
        return self.count("error") == 0

    def summary_lines(self, config: RunConfig) -> list[str]:
        """The human summary printed after a batch (counts, time, reuse, seed, where things went)."""
        counts = f"{self.count('ok')} ok, {self.count('skipped')} skipped, {self.count('error')} error"
        people, garments = self.prepared["person"], self.prepared["garment"]
        lines = [
            f"{self.tally.pairs} pairs: {counts} in {format_seconds(self.seconds)} "
            f"(model loading {format_seconds(self.load_seconds)}; prepared {people} "
            f"{'person' if people == 1 else 'people'}, {garments} garment{'' if garments == 1 else 's'})",
            f"seed: {self.seed if self.seed is not None else config.sampling.seed}",
            f"outputs: {config.output}",
            f"report: {self.report_path}",
        ]
        if not self.ok:
            lines.append(f"{self.count('error')} pair(s) failed (listed above and in the report); fix them and "
                         "rerun the same command: finished pairs are skipped")
        lines += self.tally.preservation.lines(self.count("skipped"))
        if self.evaluation is not None:
            lines += self.evaluation.lines()
        return lines

    def to_json(self) -> dict[str, Any]:
        errors = self.tally.errors()
        return {
            "pairs": self.tally.pairs, "ok": self.count("ok"), "skipped": self.count("skipped"),
            "error": self.count("error"), "seconds": round(self.seconds, 3),
            "load_seconds": round(self.load_seconds, 3), "loads": self.loads, "prepared": self.prepared,
            "report": str(self.report_path) if self.report_path else None,
            "seed": self.seed if self.seed is not None else self.tally.seed,
            **(self.ran.to_json() if self.ran is not None else {}), **self.engine, "peak_memory": self.peak_memory,
            "errors": errors, "errors_not_listed": self.count("error") - len(errors),
            **({"preservation": self.tally.preservation.to_json()} if self.tally.preservation.choice.on else {}),
            **({"evaluation": self.evaluation.to_json()} if self.evaluation is not None else {}),
        }


def read_reports(path: Path, pairs: Sequence[Pair]) -> list[PairReport]:
    """A report's lines as the PairReports of `pairs` (matched by index), e.g. to rebuild a batch's contact sheet;
    lines of pairs not in `pairs` are left out. File names that were not UTF-8 come back as their escapes."""
    from ootd.app.tryon.preservation import PairPreservation

    by_index = {pair.index: pair for pair in pairs}
    reports = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            entry = json.loads(line)
            pair = by_index.get(entry.get("index"))
            if pair is not None:
                kept = entry.get("preservation")
                reports.append(PairReport(
                    pair, entry["status"], entry.get("model_type"), list(entry.get("outputs") or ()),
                    dict(entry.get("intermediates") or {}), entry.get("error"), entry.get("seed"),
                    dict(entry.get("timings") or {}), dict(entry.get("reused") or {}), entry.get("category"),
                    PairPreservation.from_json(kept) if isinstance(kept, dict) else None))
    return reports


def is_our_report(path: Path) -> bool:
    """An empty file or a JSON-lines batch report (its first line is a pair's entry)."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(1 << 20)
    except OSError:
        return False
    if not first:
        return True  # empty: a batch stopped before its first line
    if not first.endswith(b"\n"):  # a running batch is writing its first line
        return first.startswith(REPORT_LINE_START)
    try:
        entry = json.loads(first)
    except ValueError:
        return False
    return isinstance(entry, dict) and {"index", "status", "person", "garment"} <= entry.keys()


class ReportWriter:
    """The batch report: locked against a second batch, truncated, then one whole-line append per entry."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._size = 0

    def open(self) -> ReportWriter:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        except OSError as exc:
            raise self._error(exc, "cannot write the report") from None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise OutputError.about("report", "another batch is writing here ({path} is locked by a running "
                                        "ootd batch); wait for it to finish, or use another {@output} or "
                                        "{@report}", path=printable(self.path)) from None
        try:
            os.ftruncate(fd, 0)  # only now: the report of a running batch is never cut
        except OSError as exc:
            os.close(fd)
            raise self._error(exc, "cannot write the report") from None
        self._fd, self._size = fd, 0
        return self

    def _error(self, exc: OSError, what: str) -> OutputError:
        if exc.errno == errno.ENOSPC:
            return no_space(self.path)
        return OutputError(f"{what} {printable(self.path)}: {exc.strerror or exc}")

    def write(self, entry: dict[str, Any]) -> None:
        """Append one line; on failure the file is cut back to its last whole line and the error raised."""
        if self._fd is None:
            raise OutputError(f"the report {printable(self.path)} is not open")
        data = (json.dumps(entry) + "\n").encode("utf-8")
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # a short write: the device filled up mid-line
                written += os.write(self._fd, data[written:])
        except OSError as exc:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                pass
            raise self._error(exc, "cannot write the report") from None
        self._size += len(data)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # releases the lock

    def __enter__(self) -> ReportWriter:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
