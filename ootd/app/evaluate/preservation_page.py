"""preservation.html: the results that changed most of what they should have kept, worst first, each beside its
person photo with its summary and its figures region by region (bounded: the report's `WORST_KEPT`; the JSON
lines file has every result). Links are relative to the results folder (ootd/app/batch/pages.py's Links)."""

from __future__ import annotations

import html
from pathlib import Path

from ootd.app.batch.pages import STYLE, Links
from ootd.app.tryon.preservation import Measured
from ootd.errors import printable
from ootd.evaluation.preservation import CHANGED_DELTA_E, PartFigures, percent

GENERATOR = '<meta name="generator" content="ootd preservation">'  # what makes a page ours (replaced without asking)
PAGE_STYLE = (".pair{display:inline-block;margin:4px;vertical-align:top;max-width:100%}.pair img{height:160px}"
              ".review{color:#b00;font-weight:600}.figures td,.figures th{min-width:0;font-size:.8em;padding:2px 4px}")


def _text(value: object) -> str:
    return html.escape(printable(str(value)), quote=True)


def _part(part: PartFigures) -> str:
    if part.pixels == 0:
        return "<td>-</td>"
    return (f"<td>{percent(part.changed or 0.0)} of {percent(part.share)} "
            f"(ΔE {part.delta_e or 0.0:.1f}, SSIM {part.ssim or 0.0:.3f})</td>")


def figures_table(measured: Measured) -> str:
    """Each region's kept and redrawn parts: changed share of its area (share of the picture), mean ΔE, SSIM."""
    assert measured.figures is not None
    rows = "".join(f"<tr><th>{_text(r.name)}</th>" + ("<td colspan=\"2\">absent</td>" if r.absent else
                                                       _part(r.kept) + _part(r.redrawn)) + "</tr>"
                   for r in measured.figures.regions)
    return (f'<table class="figures"><tr><th></th><th>kept (outside the mask)</th><th>redrawn (inside)</th></tr>'
            f"{rows}</table>")


def _pair(measured: Measured, person: str, links: Links, review: bool) -> str:
    assert measured.figures is not None
    mark = ' <span class="review">review</span>' if review else ""
    return (f'<div class="pair">{links.thumb(measured.result)}{links.input_thumb(person)}'
            f"<div>{_text(Path(measured.result).name)}: {_text(measured.figures.summary())}{mark}</div>"
            f"{figures_table(measured)}</div>")


def preservation_page(results: Path, lines: list[str], worst: list[tuple[Measured, str]],
                      review_above: float | None) -> str:
    """The page of a preservation report: its `lines`, then the `worst` results (with their person photos)."""
    links = Links(results)
    pairs = "".join(_pair(m, person, links, review_above is not None and m.figures is not None
                          and m.figures.score > review_above) for m, person in worst)
    body = (f"<h1>What the try-on changed: {_text(results.name or results)}</h1>"
            + "".join(f'<p class="meta">{_text(line)}</p>' for line in lines)
            + f'<p class="meta">A pixel changed when its colour difference (CIEDE2000) is above {CHANGED_DELTA_E:g}; '
            "kept: the region outside the repainted mask and its seam, which should be unchanged; redrawn: inside "
            "the mask. The figures do not tell a plausible but different face from the same one.</p>"
            f"<h2>Worst first ({len(worst)} shown)</h2>{pairs}")
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">{GENERATOR}'
            f"<title>ootd preservation</title><style>{STYLE}{PAGE_STYLE}</style></head><body>{body}</body></html>\n")
