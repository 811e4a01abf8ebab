"""An evaluation of a batch's output folder, kept beside the batch's own files: eval.json (every number, every
pair worst first, what was skipped), eval.html, and its block in the batch's index.html. A shard's batch writes
its own (eval.shard0of2.json ...), as its report and index are its own.

Written atomically, and only over files of ours: an eval.json or eval.html that ootd did not write is refused.
A batch that rewrites its index.html later (a resumed run) drops the block; evaluating again puts it back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ootd.app.batch.report import REPORT_NAME
from ootd.app.evaluate.matching import report_files
from ootd.app.evaluate.pages import GENERATOR, eval_page, index_block, with_block
from ootd.app.evaluate.report import EvalReport
from ootd.app.evaluate.run import EvalOptions, evaluate
from ootd.app.tryon.provenance import is_ours
from ootd.errors import OutputError, printable
from ootd.imaging.atomic import write_text_atomic
from ootd.pipeline_types import Progress

if TYPE_CHECKING:
    from ootd.models import Models

EVAL_STEM = "eval"
INDEX_GLOB = "index*.html"


def eval_names(report: Path | None = None) -> tuple[str, str]:
    """eval.json and eval.html, or a shard's (its report's suffix: batch_report.shard0of2.jsonl ->
    eval.shard0of2.json)."""
    suffix = ""
    if report is not None:
        suffix = report.name[len(Path(REPORT_NAME).stem):-len(Path(REPORT_NAME).suffix)]
    return f"{EVAL_STEM}{suffix}.json", f"{EVAL_STEM}{suffix}.html"


def _ours(path: Path, kind: str) -> bool:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if kind == "json":
        try:
            data = json.loads(text)
        except ValueError:
            return False
        return isinstance(data, dict) and is_ours(data)
    return GENERATOR in text


def _check_replaceable(paths: list[Path]) -> None:
    for path in paths:
        if not _ours(path, path.suffix.lstrip(".")):
            raise OutputError(f"{printable(path)} exists and is not an evaluation of ootd's: move it away first")


def write_evaluation(report: EvalReport, folder: Path, batch_report: Path | None = None,
                     indexes: list[Path] | None = None) -> list[Path]:
    """eval.json, eval.html and the index block (in `indexes`: default every index*.html of ours in `folder`)."""
    json_name, page_name = eval_names(batch_report)
    json_path, page_path = folder / json_name, folder / page_name
    _check_replaceable([json_path, page_path])
    write_text_atomic(json_path, json.dumps(report.to_json(), indent=1) + "\n")
    write_text_atomic(page_path, eval_page(report, folder))
    written = [json_path, page_path]
    block = index_block(report, folder, page_name)
    for index in sorted(folder.glob(INDEX_GLOB)) if indexes is None else indexes:
        try:
            page = with_block(index.read_text(encoding="utf-8"), block)
        except OSError:
            continue
        if page is not None:
            write_text_atomic(index, page)
            written.append(index)
    report.written = written
    return written


def is_batch_folder(folder: Path) -> bool:
    return Path(folder).is_dir() and bool(report_files(Path(folder)))


def evaluate_batch(output: Path, truth: Path, options: EvalOptions, batch_report: Path | None = None,
                   index: Path | None = None, models: Models | None = None,
                   progress: Progress | None = None) -> EvalReport:
    """A batch's results against the real photos, written beside them (`batch_report`, `index`: one batch's
    or shard's own; default: every report and index in the folder; `models`: the owner of the networks)."""
    _check_replaceable([Path(output) / name for name in eval_names(batch_report)])  # before the work, not after
    report = evaluate(output, truth, options, progress, [batch_report] if batch_report is not None else None,
                      models)
    write_evaluation(report, Path(output), batch_report, [index] if index is not None else None)
    return report
