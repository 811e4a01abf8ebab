"""What a batch's contact sheet shows, as HTML: the front page, the pages of people x garments, the errors.

Pure rendering of the pairs, their reports and the heading; ootd/app/batch/index.py decides when pages are
written. Every size stays bounded whatever the batch's size: a batch of at most `PAGE_PAIRS` pairs is one page
(index.html, its grid and its errors); a bigger one gets a front page of counts and links, and pages of at most
`PAGE_PAIRS` pairs (whole people where they fit) and of at most `ERRORS_PER_PAGE` errors in a folder beside it.

Work grows with the pairs, never with people x garments: a page lists the garments its own people wear, and a
page where most of that grid would be empty (zip pairing, a sparse CSV) lists each person's pairs instead. An
outfit row is a column of its own (both garments named and shown), its cell holding both masks. Links
are relative, URL-encoded per path segment and HTML-escaped; each folder is resolved once, not each file.
"""

from __future__ import annotations

import html
import os
import time
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ootd.app.batch.pairs import Pair
from ootd.app.batch.report import PairReport
from ootd.app.tryon.config import RunConfig
from ootd.errors import printable

PAGE_PAIRS = 200  # pairs per page of the grid (a page opens at once in a phone's browser)
ERRORS_PER_PAGE = 500
BROWSER_REFRESH_S = 10  # how often a page of a running batch reloads itself
SPARSE = 4  # a page whose grid would have more than SPARSE cells per pair lists each person's pairs instead

STYLE = (
    "body{font-family:system-ui,sans-serif;margin:0 auto;padding:8px 12px;max-width:1600px;overflow-wrap:anywhere}"
    "h1{font-size:1.35em;margin:.3em 0}h2{font-size:1.1em}p{margin:.4em 0}nav{margin:.3em 0}"
    ".settings,.meta{color:#444}.state{font-weight:600}.running{color:#05a}.interrupted,.stopped{color:#b00}"
    ".grid{overflow-x:auto;max-width:100%;-webkit-overflow-scrolling:touch;border:1px solid #ddd}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px;vertical-align:top;text-align:left;"
    "min-width:124px}"
    "th{font-weight:normal;font-size:.85em}img{height:160px;max-width:none;display:block}"
    ".mask img{height:80px;opacity:.8}.item{display:inline-block;vertical-align:top;margin:2px}"
    ".item .garment img{height:60px}.cell{display:flex;flex-wrap:wrap;gap:2px}"
    ".outfit{display:flex;gap:2px}.outfit img,.outfit .missing{height:80px;width:auto;min-width:60px}"
    ".error{color:#b00;max-width:20em;font-size:.85em}.pending{color:#888}"
    ".missing{width:120px;height:160px;background:#eee;color:#777;display:flex;align-items:center;"
    "justify-content:center;font-size:.8em;text-align:center}"
    "ol.errors li,ul.pages li{margin:.25em 0}.where{color:#555}"
    ".grid tr>th:first-child{position:sticky;left:0;background:#fff;z-index:1}"  # a row's person stays in view
    ".kept{font-size:.8em;color:#444;flex-basis:100%}.review,.review .kept{color:#b00;font-weight:600}"
)


def _quote(segment: str) -> str:
    """A path segment as it goes into a URL: every byte that is not plain percent-encoded (file names that are
    not UTF-8 keep their bytes)."""
    return quote(os.fsencode(segment), safe="")


def _text(value: object) -> str:
    return html.escape(printable(str(value)), quote=True)


class Links:
    """hrefs relative to the page's folder, and whether an input file is there, found once per distinct folder
    (hrefs) and file (existence): a catalogue's person appears in thousands of cells."""

    def __init__(self, root: Path, prefix: str = "") -> None:
        self.root = os.path.realpath(root)
        self.prefix = prefix  # "../" for pages one folder below the root
        self._folders: dict[str, str] = {}
        self._exists: dict[str, bool] = {}

    def href(self, path: str | Path) -> str:
        head, name = os.path.split(os.fspath(path))
        folder = self._folders.get(head)
        if folder is None:
            rel = os.path.relpath(os.path.realpath(head or os.curdir), self.root)
            folder = "" if rel == os.curdir else "/".join(_quote(part) for part in rel.split(os.sep)) + "/"
            self._folders[head] = folder
        return html.escape(self.prefix + folder + _quote(name), quote=True)

    def exists(self, path: str | Path) -> bool:
        key = os.fspath(path)
        found = self._exists.get(key)
        if found is None:
            found = self._exists[key] = os.path.isfile(key)
        return found

    def thumb(self, path: str | Path, title: str | None = None) -> str:
        src = self.href(path)
        label = _text(title if title is not None else os.path.basename(path))
        return f'<a href="{src}"><img src="{src}" alt="{label}" title="{label}" loading="lazy"></a>'

    def input_thumb(self, path: str | Path) -> str:
        """An input's picture, or a placeholder when the file is not there (no broken-image icon)."""
        if self.exists(path):
            return self.thumb(path)
        return f'<div class="missing" title="{_text(path)}">not found</div>'


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


@dataclass(frozen=True)
class Heading:
    """What every page says on top: the batch, its settings (seed included) and when it started."""

    title: str
    settings: str
    started: float

    @classmethod
    def of(cls, config: RunConfig, started: float | None = None) -> Heading:
        sampling, speed = config.sampling, config.speed
        model = (f"model {config.model_type.value}" if config.model_type is not None
                 else "model hd (upper) / dc (lower, dress)")
        parts = [model, _count(sampling.num_samples, "sample"), _count(sampling.steps, "step"),
                 f"scale {sampling.guidance_scale:g}", str(sampling.resolution),
                 sampling.scheduler.value, f"seed {sampling.seed}", f"fit {config.fit.value}"]
        if config.mask_grow:
            parts.append(f"mask grow {config.mask_grow}")
        if speed.label() != "exact":
            parts.append(f"speed {speed.label()}")
        if config.photo.keep_unmasked:
            parts.append(f"the photos kept outside the garment (feather {config.photo.feather})")
        elif config.photo.at_photo_size:
            parts.append("at the photos' size")
        name = config.output.name or str(config.output)
        return cls(f"ootd batch: {name}", " · ".join(parts), time.time() if started is None else started)


@dataclass(frozen=True)
class State:
    """Where the batch is: running, finished, interrupted (Ctrl-C, SIGTERM) or stopped (an error), and when."""

    phase: str
    at: float
    reason: str | None = None

    @property
    def running(self) -> bool:
        return self.phase == "running"


@dataclass
class Counts:
    total: int = 0
    done: int = 0  # ok or skipped
    skipped: int = 0
    errors: int = 0

    def add(self, status: str) -> None:
        self.done += status != "error"
        self.skipped += status == "skipped"
        self.errors += status == "error"

    def text(self) -> str:
        pending = self.total - self.done - self.errors
        earlier = f" ({self.skipped} made earlier)" if self.skipped else ""
        return f"{self.total} pairs: {self.done} done{earlier}, {self.errors} error, {pending} pending"


@dataclass
class Page:
    """One page of the grid: its pairs (positions in the batch's pair list, a person's pairs together), their
    counts and the page's label; what it shows of them (`arrange`) is worked out when it is rendered, so a batch
    holds a few bytes a pair for its pages."""

    number: int
    positions: array = field(default_factory=lambda: array("i"))
    counts: Counts = field(default_factory=Counts)
    label: str = ""


@dataclass
class Arranged:
    """A page as it is shown: its people (rows), the garments they wear here (columns), its pairs per cell and
    per person; keys are normalised paths (`_Names`)."""

    people: list[tuple[str, Path]]
    columns: list[tuple[tuple[str, str], Pair]]  # ((garments' key, category), the column's first pair)
    cells: dict[tuple[str, str, str], list[int]]
    rows: dict[str, list[int]]
    dense: bool


def arrange(page: Page, pairs: Sequence[Pair]) -> Arranged:
    name = _Names()
    people: list[tuple[str, Path]] = []
    columns: list[tuple[tuple[str, str], Pair]] = []  # (column key, its first pair)
    seen: set[tuple[str, str]] = set()
    cells: dict[tuple[str, str, str], list[int]] = {}
    rows: dict[str, list[int]] = {}
    for position in page.positions:
        pair = pairs[position]
        key = name(pair.person)
        if not people or people[-1][0] != key:
            people.append((key, pair.person))
        column = _column(pair, name)
        if column not in seen:
            seen.add(column)
            columns.append((column, pair))
        cells.setdefault((key, *column), []).append(position)
        rows.setdefault(key, []).append(position)
    dense = len(people) * len(columns) <= SPARSE * max(1, len(page.positions)) or min(len(people), len(columns)) <= 1
    return Arranged(people, columns, cells, rows, dense)


def _category(pair: Pair) -> str:
    """The pair's category word (a StrEnum member is its word); an outfit's two, in its garments' order."""
    if pair.outfit:
        return f"{pair.category or ''};{pair.category2 or ''}"
    return pair.category or ""


def _garments(pair: Pair) -> tuple[tuple[Path, str], ...]:
    """The pair's garments with their categories: one, or an outfit's two."""
    first = ((pair.garment, pair.category or ""),)
    return first if pair.garment2 is None else (*first, (pair.garment2, pair.category2 or ""))


def _column(pair: Pair, name: _Names) -> tuple[str, str]:
    """A pair's column: its garment (an outfit: both, in order) and category; an outfit is never under its top's
    column."""
    return ("\0".join(name(garment) for garment, _ in _garments(pair)), _category(pair))


def garment_label(pair: Pair) -> str:
    """`shirt.png (upper)`, or for an outfit `shirt.png (upper) with jeans.png (lower)`."""
    return " with ".join(f"{garment.name} ({category})" for garment, category in _garments(pair))


def _garment_header(pair: Pair, links: Links) -> str:
    """The garment's picture and name; an outfit's two pictures side by side, then both names."""
    thumbs = "".join(links.input_thumb(garment) for garment, _ in _garments(pair))
    if pair.outfit:
        thumbs = f'<div class="outfit">{thumbs}</div>'
    return thumbs + _text(garment_label(pair))


class _Names:
    """One key per file however its path is spelled (`a/../b.png` is `b.png`), worked out once per spelling."""

    def __init__(self) -> None:
        self.seen: dict[Path, str] = {}

    def __call__(self, path: Path) -> str:
        key = self.seen.get(path)
        if key is None:
            key = self.seen[path] = os.path.normpath(os.path.abspath(path))
        return key


def layout(pairs: Sequence[Pair], page_pairs: int = PAGE_PAIRS) -> tuple[list[Page], array]:
    """The pages of the grid and each pair's page (by position; -1: none). Pairs without a category (rows that
    could not be read) are in no column: they are listed with the errors only. People keep their first
    appearance's order; a person stays on one page unless they alone have more than `page_pairs` pairs.
    Grouped with numpy (a person number a pair, then a stable sort), not a list of positions a person: a few
    bytes a pair, however many distinct people."""
    import numpy as np

    name = _Names()
    number: dict[str, int] = {}  # a person's key -> its number, in order of first appearance
    person_of = array("i", [-1]) * len(pairs)
    for position, pair in enumerate(pairs):
        if pair.category is not None and pair.reason is None:
            person_of[position] = number.setdefault(name(pair.person), len(number))
    people = np.frombuffer(person_of, dtype=np.int32) if pairs else np.empty(0, np.int32)
    shown = np.flatnonzero(people >= 0)
    grouped = shown[np.argsort(people[shown], kind="stable")]
    starts = np.flatnonzero(np.diff(people[grouped], prepend=-1)).tolist() + [len(grouped)]
    del number, people, shown
    pages: list[Page] = []
    page_of = array("i", [-1]) * len(pairs)
    page = Page(1)
    for first, end in zip(starts, starts[1:]):  # noqa: B905 - one shorter
        for start in range(first, end, page_pairs):
            chunk = grouped[start:min(start + page_pairs, end)].tolist()
            if page.positions and len(page.positions) + len(chunk) > page_pairs:
                pages.append(page)
                page = Page(len(pages) + 1)
            page.positions.extend(chunk)
            page.counts.total += len(chunk)
            for position in chunk:
                page_of[position] = page.number - 1
    if page.positions or not pages:
        pages.append(page)
    for page in pages:
        page.label = _label(page, pairs, name)
    return pages, page_of


def _label(page: Page, pairs: Sequence[Pair], name: _Names) -> str:
    """`first to last (N people)`: the page's people, for the front page's list."""
    people: list[Path] = []
    last = None
    for position in page.positions:
        person = pairs[position].person
        if name(person) != last:
            last = name(person)
            people.append(person)
    if not people:
        return " (0 people)"
    first, final = people[0].name, people[-1].name
    shown = first if first == final else f"{first} to {final}"
    return f"{shown} ({len(people)} {'person' if len(people) == 1 else 'people'})"


def error_text(report: PairReport) -> str:
    """The report's error without its leading `<source>: ` (the row is said once, beside it)."""
    problem = str(report.error or "")
    source = report.pair.source
    return problem[len(source) + 2:] if source and problem.startswith(f"{source}: ") else problem


def _masks(pair: Pair, report: PairReport) -> list[tuple[str, str]]:
    """The masks to show with a pair's results, each with its title: the one the run saved or was given, and for
    an outfit one per garment (`mask of shirt.png`)."""
    saved, given = report.intermediates, (pair.mask, pair.mask2)
    if not pair.outfit:
        mask = saved.get("mask") or (os.fspath(pair.mask) if pair.mask is not None else None)
        return [(mask, "mask")] if mask else []
    masks = []
    for (garment, category), mask in zip(_garments(pair), given, strict=True):
        found = saved.get(f"{category}_mask") or (os.fspath(mask) if mask is not None else None)
        if found:
            masks.append((found, f"mask of {garment.name}"))
    return masks


def cell(pair: Pair, report: PairReport | None, links: Links, kept: tuple[str, bool] | None = None) -> str:
    """One pair's cell: its results and mask (an outfit: both masks), its error, or `pending`; `kept`: its
    preservation summary and whether it is marked for review."""
    if report is None:
        return '<div class="pending">pending</div>'
    if report.status == "error":
        return f'<div class="error">{_text(error_text(report))}</div>'
    parts = [links.thumb(p) for p in report.outputs]
    parts += [f'<span class="mask">{links.thumb(mask, title)}</span>' for mask, title in _masks(pair, report)]
    if kept is not None:
        parts.append(f'<div class="kept{" review" if kept[1] else ""}">{_text(kept[0])}</div>')
    return f'<div class="cell {report.status}">{"".join(parts)}</div>'


def _person_header(person: Path, links: Links) -> str:
    return f"<th>{links.input_thumb(person)}{_text(person.name)}</th>"


def grid(page: Page, pairs: Sequence[Pair], cells: Any, links: Links) -> str:
    """The page's people x garments table (in its own scrolling box), or its people's pairs listed per person
    when that table would be mostly empty. `cells.get(position, pending)`: a pair's cell (a dict, or cells
    made as they are asked for)."""
    pending = '<div class="pending">pending</div>'
    rows = []
    shown = arrange(page, pairs)
    if shown.dense:
        head = "".join(f"<th>{_garment_header(first, links)}</th>" for _, first in shown.columns)
        for key, person in shown.people:
            tds = "".join("<td>" + "".join(cells.get(p, pending) for p in shown.cells.get((key, *column), ()))
                          + "</td>" for column, _ in shown.columns)
            rows.append(f"<tr>{_person_header(person, links)}{tds}</tr>")
        return f'<div class="grid"><table><tr><th></th>{head}</tr>{"".join(rows)}</table></div>'
    for key, person in shown.people:
        items = "".join(
            f'<div class="item"><div class="garment">{_garment_header(pairs[p], links)}</div>'
            f"{cells.get(p, pending)}</div>"
            for p in shown.rows[key])
        rows.append(f"<tr>{_person_header(person, links)}<td>{items}</td></tr>")
    return f'<div class="grid"><table>{"".join(rows)}</table></div>'


def error_item(report: PairReport) -> str:
    """One error, with its row (`pairs.csv line 7`) and its pair."""
    return (f'<li><span class="where">{_text(report.pair.source or f"pair {report.pair.index + 1}")} · '
            f"{_text(report.pair.describe())}</span>: {_text(error_text(report))}</li>")


def error_items(items: Iterable[str]) -> str:
    """Errors (`error_item`) as a list."""
    return f'<ol class="errors">{"".join(items)}</ol>'


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def state_line(state: State, heading: Heading, counts: Counts) -> str:
    started = f"started {_stamp(heading.started)}"
    if state.running:
        text = (f"Running: {started}, updated {_stamp(state.at)}; this page reloads every {BROWSER_REFRESH_S} s "
                "while the batch runs.")
    elif state.phase == "finished":
        text = f"Finished {_stamp(state.at)} ({started})."
    else:
        pending = counts.total - counts.done - counts.errors
        why = f": {state.reason}" if state.reason else ""
        text = (f"{'Interrupted' if state.phase == 'interrupted' else 'Stopped'} {_stamp(state.at)}{why} "
                f"({started}). {pending} pending pair(s) were not run: rerun the same command to resume.")
    return f'<p class="state {state.phase}">{_text(text)}</p>'


def document(title: str, body: str, state: State) -> str:
    refresh = f'<meta http-equiv="refresh" content="{BROWSER_REFRESH_S}">' if state.running else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{refresh}<title>{_text(title)}</title><style>{STYLE}</style></head><body>{body}</body></html>\n"
    )


def top(heading: Heading, state: State, batch: Counts, counts: Counts | None = None, title: str | None = None) -> str:
    """Title, settings, how the batch stands (`batch`: its counts) and the counts of this page (`counts`)."""
    return (f"<h1>{_text(title or heading.title)}</h1><p class=\"settings\">{_text(heading.settings)}</p>"
            f"{state_line(state, heading, batch)}<p class=\"counts\">{_text((counts or batch).text())}</p>")


def page_label(page: Page) -> str:
    return page.label


def nav(links: list[tuple[str, str]]) -> str:
    return "<nav>" + " · ".join(f'<a href="{html.escape(href, quote=True)}">{_text(text)}</a>' if href else
                                _text(text) for href, text in links) + "</nav>"


def front_page(heading: Heading, state: State, counts: Counts, entries: Sequence[tuple[str, str, str]],
               errors_href: str | None, errors: int) -> str:
    """The front page of a big batch: its counts, a link per page (href, label, counts), the errors' link.
    `href`s are relative paths of ours (plain ASCII names); each segment is URL-encoded all the same."""

    def link(href: str) -> str:
        return html.escape("/".join(_quote(part) for part in href.split("/")), quote=True)

    items = "".join(f'<li><a href="{link(href)}">{_text(label)}</a>: {_text(text)}</li>'
                    for href, label, text in entries)
    listed = f'<p><a href="{link(errors_href)}">{errors} error(s), listed by row</a></p>' if errors_href else ""
    body = top(heading, state, counts) + f'{listed}<h2>Pages ({len(entries)})</h2><ul class="pages">{items}</ul>'
    return document(heading.title, body, state)
