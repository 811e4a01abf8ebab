"""index.html of a batch output folder, kept current while the batch runs, at a cost that does not grow with it.

What the pages show is ootd/app/batch/pages.py; this module decides when and where they are written:

- Each finished pair's cell is rendered once, when its report arrives (O(1) per pair). Pages are rewritten on a
  timer, never per pair: at most every `REFRESH_S` seconds and never more than `COST_SHARE` of the time (a
  write that took 0.1 s waits 2 s), only the pages whose pairs changed, then the front page (its counts); and
  once more, every page, when the batch ends, saying how it ended (finished, interrupted, stopped).
- A batch of at most `PAGE_PAIRS` pairs is index.html alone. A bigger one writes index.html (counts, links)
  and its pages in a folder beside it, `index_files/` (`index.shardKofN_files/` for a shard, so shards never
  share a file); pages of an earlier, bigger batch in that folder are removed.
- Every file is written atomically (complete or absent); a page that cannot be written is a warning, never the
  batch's failure (the results and the report matter more).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ootd.app.batch import pages
from ootd.app.batch.pages import (
    Counts,
    Heading,
    Links,
    Page,
    State,
    cell,
    document,
    error_item,
    error_items,
    front_page,
    grid,
    layout,
    nav,
    page_label,
    top,
)
from ootd.app.batch.pairs import Pair, Shard
from ootd.app.batch.preservation import PreservationTally, worst_table
from ootd.app.batch.report import PairReport
from ootd.app.batch.texts import TextStore
from ootd.errors import OotdError
from ootd.imaging.atomic import write_text_atomic

logger = logging.getLogger(__name__)

REFRESH_S = 3.0  # at most this often while pairs finish
COST_SHARE = 0.05  # writing pages may take at most this share of the batch's time
STATUSES = (None, "ok", "skipped", "error")
STATUS = {status: code for code, status in enumerate(STATUSES) if status is not None}
PAGE_FILE = re.compile(r"^(page|errors)-\d{4,}\.html$")


def index_name(shard: Shard | None = None) -> str:
    """index.html, or one per shard (index.shardKofN.html), so shards never write the same file."""
    return "index.html" if shard is None else f"index.{shard.name()}.html"


def pages_folder(index: Path) -> Path:
    """Where the pages of a big batch go: `index_files/` beside `index.html`."""
    return index.with_name(f"{index.stem}_files")


def _page_file(number: int) -> str:
    return f"page-{number:04d}.html"


def _errors_file(number: int) -> str:
    return f"errors-{number:04d}.html"


class ContactIndex:
    """The contact sheet of one batch: `add` each pair's report as it arrives, `refresh` once the precheck's
    reports are in (the first write; timed writes follow), `finish` when the batch ends, however it ends."""

    def __init__(self, path: Path, pairs: Sequence[Pair], heading: Heading, *, interval: float | None = None,
                 page_pairs: int | None = None, errors_per_page: int | None = None,
                 files: Callable[[Pair], tuple[list[str], dict[str, str]]] | None = None) -> None:
        """`files`: where a done pair's pictures and intermediates are (its job's targets), so the sheet keeps
        a byte a pair and makes each cell when its page is written; without it, each report's files are kept."""
        self.path = Path(path)
        self.pairs = pairs
        self.heading = heading
        self.interval = REFRESH_S if interval is None else interval
        self.errors_per_page = errors_per_page or pages.ERRORS_PER_PAGE
        page_pairs = page_pairs or pages.PAGE_PAIRS
        self.pages, self.page_of = layout(pairs, page_pairs)
        self.single = len(pairs) <= page_pairs  # index.html holds the grid and the errors
        self.folder = pages_folder(self.path)
        self.links = Links(self.path.parent, "" if self.single else "../")
        self.position = _Positions(pairs)
        self.status = bytearray(len(pairs))  # position -> STATUS of its report (0: none yet)
        self.messages = array("i")  # position -> its error's number in `texts` (made at the first error)
        self.texts = TextStore()  # the errors' messages, compressed
        self.files_of = files
        self.files: dict[int, tuple[list[str], dict[str, str]]] = {}  # position -> its report's, without `files`
        self.grids: dict[int, bytes] = {}  # page -> its grid, rendered once complete, compressed
        self.counts = Counts(len(pairs))
        self.kept = _Kept(len(pairs))  # each measured pair's preservation summary, the worst ones
        self.writes = 0  # how many times the pages were written (tests, benchmarks)
        self._dirty: set[int] = set(range(len(self.pages)))
        self._errors_dirty = True
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._next = 0.0  # time.monotonic() before which no timed write starts
        self._started = False
        self._ended: State | None = None
        self._swept = False
        self._warned = False

    # ------------------------------------------------------------------------------------------ updates

    def add(self, report: PairReport) -> None:
        """A pair's report: its cell is rendered now, its page written at the next timed write."""
        with self._lock:
            position = self.position.get(report.pair.index)
            if position is None or self._ended is not None:
                return
            self.counts.add(report.status)
            self.status[position] = STATUS[report.status]
            if report.status == "error":
                if not self.messages:
                    self.messages = array("i", [0]) * len(self.pairs)
                self.messages[position] = self.texts.add(report.error or "")
                self._errors_dirty = True
            elif self.files_of is None:
                self.files[position] = (list(report.outputs), dict(report.intermediates))
            if report.preservation is not None and report.status != "error":
                self.kept.add(position, report)
            page = self.page_of[position]
            if page >= 0:
                self.pages[page].counts.add(report.status)
                self._dirty.add(page)
                self._complete(page)
            if self._started and self._timer is None:
                self._timer = threading.Timer(max(0.0, self._next - time.monotonic()), self._timed)
                self._timer.daemon = True
                self._timer.start()

    def _complete(self, number: int) -> None:
        """A page whose every pair is in: its grid rendered once and kept compressed (a few bytes a pair); only
        the state around it changes from here on."""
        page = self.pages[number]
        if page.counts.done + page.counts.errors < page.counts.total or number in self.grids:
            return
        self.grids[number] = zlib.compress(grid(page, self.pairs, _Cells(self), self.links).encode("utf-8"))

    def _grid(self, number: int) -> str:
        kept = self.grids.get(number)
        if kept is not None:
            return zlib.decompress(kept).decode("utf-8")
        return grid(self.pages[number], self.pairs, _Cells(self), self.links)

    def report_at(self, position: int) -> PairReport | None:
        """What the sheet shows of a pair: its report as far as a cell or an error item needs it."""
        status, pair = STATUSES[self.status[position]], self.pairs[position]
        if status is None:
            return None
        if status == "error":
            return PairReport(pair, status, error=self.texts.get(self.messages[position]))
        outputs, intermediates = self.files_of(pair) if self.files_of is not None else self.files[position]
        return PairReport(pair, status, outputs=outputs, intermediates=intermediates)

    def refresh(self) -> None:
        """Write what changed now (the first write of a running batch); timed writes follow from here on."""
        with self._lock:
            if self._ended is None:
                self._started = True
                self._write(State("running", time.time()))

    def finish(self, phase: str = "finished", reason: str | None = None) -> None:
        """The last write: every page, saying how the batch ended (finished, interrupted, stopped)."""
        with self._lock:
            if self._ended is not None:
                return
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._ended = State(phase, time.time(), reason)
            self._dirty = set(range(len(self.pages)))
            self._errors_dirty = True
            self._write(self._ended)

    def _timed(self) -> None:
        with self._lock:
            self._timer = None
            if self._ended is None:
                self._write(State("running", time.time()))

    # ------------------------------------------------------------------------------------------ files

    def _write(self, state: State) -> None:
        """Render and write the dirty pages, then the front page. A failure is one warning per batch, none when
        the batch is stopping anyway (its own error says why: a full disk is one line, not two)."""
        start = time.monotonic()
        try:
            for path, text in self._files(state):
                write_text_atomic(path, text)
        except (OSError, OotdError) as exc:
            quiet = self._warned or state.phase in ("interrupted", "stopped")
            self._warned = True
            logger.log(logging.DEBUG if quiet else logging.WARNING, "cannot write the contact sheet %s: %s",
                       self.path, getattr(exc, "strerror", None) or exc)
        self.writes += 1
        took = time.monotonic() - start
        self._next = time.monotonic() + max(self.interval, took / COST_SHARE)

    def _files(self, state: State) -> Iterable[tuple[Path, str]]:
        if not self._swept:
            self._sweep()
        if self.single:
            self._dirty.clear()
            self._errors_dirty = False
            yield self.path, self._single_page(state)
            return
        self.folder.mkdir(exist_ok=True)
        dirty, self._dirty = sorted(self._dirty), set()
        for number in dirty:
            yield self.folder / _page_file(number + 1), self._grid_page(self.pages[number], state)
        if self._errors_dirty:
            self._errors_dirty = False
            yield from self._error_pages(state)
        yield self.path, self._front_page(state)

    def _sweep(self) -> None:
        """Remove the pages an earlier, bigger batch left in the pages folder (names of ours only); the error
        pages are all rewritten."""
        self._swept = True
        keep = set() if self.single else {_page_file(n) for n in range(1, len(self.pages) + 1)}
        try:
            names = [entry.name for entry in os.scandir(self.folder) if entry.is_file(follow_symlinks=False)]
        except OSError:
            return
        for name in names:
            if PAGE_FILE.match(name) and name not in keep:
                (self.folder / name).unlink(missing_ok=True)
        if self.single:
            try:
                self.folder.rmdir()  # only when empty: nothing else of anyone's is touched
            except OSError:
                pass

    # ------------------------------------------------------------------------------------------ pages

    def _error_positions(self) -> Any:
        """The positions of the pairs that failed, by row (a numpy array: 8 bytes an error, no list of ints)."""
        import numpy as np

        failed = np.flatnonzero(np.frombuffer(self.status, dtype=np.uint8) == STATUS["error"])
        if self.position.map is not None:  # pairs not in row order (never from a CSV or a shard)
            indices = np.frombuffer(self.position.indices, dtype=np.int64)
            failed = failed[np.argsort(indices[failed], kind="stable")]
        return failed

    def _error_items(self, positions: Iterable[int]) -> str:
        return error_items(error_item(self.report_at(int(position))) for position in positions)  # type: ignore[arg-type]

    def _single_page(self, state: State) -> str:
        body = [top(self.heading, state, self.counts)]
        if self.pages[0].positions:
            body.append(self._grid(0))
        body.append(self._worst())
        if self.counts.errors:
            body.append(f"<h2 id=\"errors\">Errors ({self.counts.errors})</h2>"
                        f"{self._error_items(self._error_positions())}")
        return document(self.heading.title, "".join(body), state)

    def _index_href(self) -> str:
        return "../" + self.path.name

    def _grid_page(self, page: Page, state: State) -> str:
        count = len(self.pages)
        links = [(self._index_href(), "index"),
                 (_page_file(page.number - 1) if page.number > 1 else "", "previous"),
                 (_page_file(page.number + 1) if page.number < count else "", "next")]
        if self.counts.errors:
            links.append((_errors_file(1), f"errors ({self.counts.errors})"))
        title = f"{self.heading.title} · page {page.number} of {count}"
        body = (nav(links) + top(self.heading, state, self.counts, page.counts, title)
                + f"<p class=\"meta\">{page_label(page)}</p>" + self._grid(page.number - 1))
        return document(title, body, state)

    def _error_pages(self, state: State) -> Iterable[tuple[Path, str]]:
        errors = self._error_positions()  # each page's items rendered when it is written, never all at once
        size = self.errors_per_page
        count = max(1, -(-len(errors) // size))
        for number in range(1, count + 1):
            chunk = errors[(number - 1) * size:number * size]
            links = [(self._index_href(), "index"),
                     (_errors_file(number - 1) if number > 1 else "", "previous"),
                     (_errors_file(number + 1) if number < count else "", "next")]
            title = f"{self.heading.title} · errors {number} of {count}"
            first = (number - 1) * size + 1
            what = (f"errors {first} to {first + len(chunk) - 1} of {len(errors)}, by row" if len(errors)
                    else "no errors")
            body = nav(links) + top(self.heading, state, self.counts, title=title) + f"<p class=\"meta\">{what}</p>"
            yield self.folder / _errors_file(number), document(title, body + self._error_items(chunk), state)

    def _front_page(self, state: State) -> str:
        entries = [(f"{self.folder.name}/{_page_file(page.number)}", page_label(page), page.counts.text())
                   for page in self.pages]
        errors = f"{self.folder.name}/{_errors_file(1)}" if self.counts.errors else None
        page = front_page(self.heading, state, self.counts, entries, errors, self.counts.errors)
        worst = self._worst()
        return page.replace("</body>", worst + "</body>", 1) if worst else page

    def _worst(self) -> str:
        """The table of the pairs that changed most, worst first (ootd/app/batch/preservation.py)."""
        def label(index: int) -> str:
            position = self.position.get(index)
            return self.pairs[position].describe() if position is not None else f"pair {index + 1}"

        return worst_table(self.kept.tally.worst(), label, self.links.thumb)


class _Cells:
    """The cells of a page being rendered, each made now from what the sheet keeps of its pair."""

    def __init__(self, index: ContactIndex) -> None:
        self.index = index

    def get(self, position: int, default: str) -> str:
        report = self.index.report_at(position)
        if report is None:
            return default
        return cell(self.index.pairs[position], report, self.index.links, self.index.kept.get(position))


class _Kept:
    """Each measured pair's preservation summary (compressed, a few bytes a pair, made at the first) and whether
    it is marked for review, and the batch's worst pairs (ootd/app/batch/preservation.py)."""

    def __init__(self, pairs: int) -> None:
        self.pairs = pairs
        self.numbers = array("i")  # position -> its summary's number in `texts` + 1 (0: none)
        self.review = bytearray()
        self.texts = TextStore()
        self.tally = PreservationTally()

    def add(self, position: int, report: PairReport) -> None:
        kept = report.preservation
        assert kept is not None
        if not self.numbers:
            self.numbers = array("i", [0]) * self.pairs
            self.review = bytearray(self.pairs)
        self.numbers[position] = self.texts.add(kept.summary()) + 1
        self.review[position] = kept.review
        self.tally.add(report.pair.index, kept, report.outputs)

    def get(self, position: int) -> tuple[str, bool] | None:
        if not self.numbers or not self.numbers[position]:
            return None
        return self.texts.get(self.numbers[position] - 1), bool(self.review[position])


class _Positions:
    """A pair's position in the batch's list from its index (its row): the indices are increasing (a CSV's, a
    shard's), so a sorted array and a bisection, 8 bytes a pair instead of a dict's ~100."""

    def __init__(self, pairs: Sequence[Pair]) -> None:
        self.indices = array("q", (pair.index for pair in pairs))
        ordered = all(a < b for a, b in zip(self.indices, self.indices[1:]))  # noqa: B905 - one shorter
        self.map = None if ordered else {index: i for i, index in enumerate(self.indices)}

    def get(self, index: int) -> int | None:
        if self.map is not None:
            return self.map.get(index)
        i = bisect_left(self.indices, index)
        return i if i < len(self.indices) and self.indices[i] == index else None


def write_index(path: Path, pairs: Sequence[Pair], reports: Iterable[PairReport], heading: Heading,
                phase: str = "finished", **options: object) -> ContactIndex:
    """The contact sheet built at once from a batch's reports (e.g. read back from its report file)."""
    index = ContactIndex(path, pairs, heading, **options)  # type: ignore[arg-type]
    for report in reports:
        index.add(report)
    index.finish(phase)
    return index
