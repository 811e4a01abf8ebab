"""index.html of a batch output folder: people x garments, each cell with its results, the mask and any error.

Links are relative to the folder, so it can be moved or served as it is; the page is written atomically.
"""

from __future__ import annotations

import html
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ootd.app.batch.pairs import Pair, Shard
from ootd.app.batch.report import PairReport
from ootd.imaging.files import write_text_atomic

logger = logging.getLogger(__name__)


def index_name(shard: Shard | None = None) -> str:
    """index.html, or one per shard (index.shardKofN.html), so shards never write the same file."""
    return "index.html" if shard is None else f"index.{shard.name()}.html"


def _link(path: str | Path, folder: Path) -> str:
    return html.escape(Path(os.path.relpath(Path(path).resolve(), folder.resolve())).as_posix(), quote=True)


def _thumb(path: str | Path, folder: Path, title: str) -> str:
    src = _link(path, folder)
    return f'<a href="{src}"><img src="{src}" title="{html.escape(title, quote=True)}" loading="lazy"></a>'


def _cell(pair: Pair, report: PairReport | None, folder: Path) -> str:
    if report is None:
        return '<div class="pending">pending</div>'
    parts = [_thumb(p, folder, Path(p).name) for p in report.outputs] if report.status != "error" else []
    mask = report.intermediates.get("mask") or (str(pair.mask) if pair.mask is not None else None)
    if mask and report.status != "error":
        parts.append(f'<span class="mask">{_thumb(mask, folder, "mask")}</span>')
    if report.error:
        parts.append(f'<div class="error">{html.escape(report.error)}</div>')
    return f'<div class="{report.status}">{"".join(parts)}</div>'


def render_index(pairs: Sequence[Pair], reports: dict[int, PairReport], folder: Path) -> str:
    """The page: a row per person, a column per (garment, category), a cell per pair (pending until done)."""
    people = list(dict.fromkeys(p.person for p in pairs))
    columns = list(dict.fromkeys((p.garment, p.category.value if p.category else "?") for p in pairs))
    cells: dict[tuple[Any, ...], list[str]] = {}
    for pair in pairs:
        key = (pair.person, pair.garment, pair.category.value if pair.category else "?")
        cells.setdefault(key, []).append(_cell(pair, reports.get(pair.index), folder))
    done = sum(r.status != "error" for r in reports.values())
    head = "".join(f"<th>{_thumb(g, folder, g.name)}<br>{html.escape(g.name)} ({c})</th>" for g, c in columns)
    rows = "".join(
        f"<tr><th>{_thumb(person, folder, person.name)}<br>{html.escape(person.name)}</th>"
        + "".join(f"<td>{''.join(cells.get((person, g, c), []))}</td>" for g, c in columns) + "</tr>"
        for person in people
    )
    errors = sum(r.status == "error" for r in reports.values())
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>ootd results</title><style>"
        "body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px;"
        "vertical-align:top}img{height:160px}.mask img{height:80px;opacity:.8}.error{color:#b00;max-width:20em}"
        ".pending{color:#888}</style></head><body>"
        f"<p>{len(pairs)} pairs: {done} done, {errors} error, {len(pairs) - len(reports)} pending</p>"
        f"<table><tr><th></th>{head}</tr>{rows}</table></body></html>\n"
    )


class ContactIndex:
    """index.html of a batch, rewritten as each pair finishes (beyond SMALL_BATCH pairs at most once a second,
    and when the last one is in: rewriting a large page per pair would cost more than the pairs)."""

    SMALL_BATCH = 1000

    def __init__(self, path: Path, pairs: Sequence[Pair], min_interval: float | None = None) -> None:
        self.path = path
        self.pairs = list(pairs)
        self.reports: dict[int, PairReport] = {}
        self.min_interval = min_interval if min_interval is not None else (
            0.0 if len(self.pairs) <= self.SMALL_BATCH else 1.0)
        self._written = float("-inf")
        self.write()

    def add(self, report: PairReport) -> None:
        import time

        self.reports[report.pair.index] = report
        if len(self.reports) >= len(self.pairs) or time.monotonic() - self._written >= self.min_interval:
            self.write()

    def write(self) -> None:
        """Rewrite the page; a failure is a warning (the results and the report matter more than the page)."""
        import time

        self._written = time.monotonic()
        try:
            write_text_atomic(self.path, render_index(self.pairs, self.reports, self.path.parent))
        except OSError as exc:
            logger.warning("cannot write %s: %s", self.path, exc.strerror or exc)
