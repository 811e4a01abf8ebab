"""The evaluation as HTML: its own page (eval.html: the numbers, then the pairs worst first, result beside photo)
and the block a batch's index.html shows (the numbers, the worst few pairs, the link to the page).

Bounded whatever the batch's size: the page lists the `PAGE_PAIRS` worst pairs (eval.json has them all), the
block `BLOCK_PAIRS`. Links are relative to the folder of the page (ootd/app/batch/pages.py's Links).
"""

from __future__ import annotations

import html
from pathlib import Path

from ootd.app.batch.pages import STYLE, Links
from ootd.app.evaluate.report import EvalReport, PairResult
from ootd.errors import printable

PAGE_PAIRS = 500
BLOCK_PAIRS = 8
SKIPPED_LISTED = 500
GENERATOR = '<meta name="generator" content="ootd eval">'  # what makes a page ours (replaced without asking)
BLOCK_START, BLOCK_END = "<!--ootd-eval-->", "<!--/ootd-eval-->"
EVAL_STYLE = (".stand-in{color:#b00;font-weight:600}.scores td{min-width:0}.pair{display:inline-block;margin:2px;"
              "vertical-align:top}.pair img{height:120px}.pair .meta{font-size:.8em}")


def _text(value: object) -> str:
    return html.escape(printable(str(value)), quote=True)


def _pair(pair: PairResult, links: Links) -> str:
    lpips = f"LPIPS {pair.lpips:.4f}, " if pair.lpips is not None else ""
    return (f'<div class="pair">{links.thumb(pair.result)}{links.thumb(pair.truth, "photo: " + Path(pair.truth).name)}'
            f'<div class="meta">{_text(Path(pair.result).name)}: {lpips}SSIM {pair.ssim:.4f}</div>'
            "</div>")


def _summary(report: EvalReport) -> str:
    warning = f'<p class="stand-in">{_text(report.stand_in)}</p>' if report.stand_in else ""
    return warning + "".join(f'<p class="meta">{_text(line)}</p>' for line in report.lines()
                             if not line.startswith("warning: "))


def eval_page(report: EvalReport, folder: Path) -> str:
    """eval.html in `folder`: the numbers, the pairs worst first (result, then photo), what was skipped."""
    links = Links(folder)
    worst = report.worst(PAGE_PAIRS)
    shown = f"the {len(worst)} worst of {len(report.pairs)}" if len(report.pairs) > len(worst) else "all"
    body = [f"<h1>ootd eval: {_text(report.results.name or report.results)}</h1>", _summary(report)]
    if worst:
        body.append(f"<h2>Pairs, worst first ({shown}: largest LPIPS, then lowest SSIM; result, then photo)</h2>"
                    + "".join(_pair(p, links) for p in worst))
    if report.skipped:
        items = "".join(f"<li>{_text(s.what)}: {_text(s.reason)}</li>" for s in report.skipped[:SKIPPED_LISTED])
        body.append(f"<h2>Skipped ({len(report.skipped)})</h2><ol>{items}</ol>")
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">{GENERATOR}'
            f"<title>ootd eval: {_text(report.results.name)}</title><style>{STYLE}{EVAL_STYLE}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")


def index_block(report: EvalReport, folder: Path, page: str) -> str:
    """What index.html shows of the evaluation, between markers so that a new evaluation replaces it."""
    links = Links(folder)
    worst = "".join(_pair(p, links) for p in report.worst(BLOCK_PAIRS))
    link = f'<p><a href="{html.escape(page, quote=True)}">every pair, worst first</a></p>'
    return (f'{BLOCK_START}<style>{EVAL_STYLE}</style><h2 id="evaluation">Against the real photos</h2>'
            f"{_summary(report)}{worst}{link}{BLOCK_END}")


def with_block(page: str, block: str) -> str | None:
    """`page` (a batch's index.html) with `block` in place of an earlier one, after its counts; None when the
    page is not a batch's contact sheet."""
    start, end = page.find(BLOCK_START), page.find(BLOCK_END)
    if start >= 0 and end > start:
        page = page[:start] + page[end + len(BLOCK_END):]
    counts = page.find('<p class="counts">')
    if counts < 0:
        return None
    after = page.find("</p>", counts) + len("</p>")
    return page[:after] + block + page[after:]
