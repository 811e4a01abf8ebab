"""`ootd batch`: many pairs (a CSV, or two folders) with the models loaded once; the engines are in
ootd/app/batch/."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ootd.app.batch.report import REPORT_NAME
from ootd.cli.display import Display, print_json, show_progress
from ootd.cli.errors import echo_err, guarded_command, one_line
from ootd.cli.options import (
    CATEGORY_METAVAR,
    HARDWARE,
    INPUTS,
    LOGGING_OPTIONS,
    OUTPUTS,
    RUN_OPTIONS,
    JsonOpt,
    checked_config,
    choices,
    with_options,
)
from ootd.errors import UsageError, escaped
from ootd.settings import EngineName, Pairing

if TYPE_CHECKING:
    from ootd.app.batch.report import BatchSummary
    from ootd.app.evaluate.run import EvalOptions
    from ootd.app.tryon.preservation import PreservationChoice
    from ootd.errors import OotdError
    from ootd.models import Models

logger = logging.getLogger("ootd.cli")

EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd batch pairs.csv -o results   (rows: person,garment,category,mask; header optional)\n\n"
    "  ootd batch --models people/ --cloths shirts/ --category upper --pairing product\n\n"
    "  ootd batch pairs.csv --shard 0/2 --device cuda:0   (one of two processes; see scripts/multi_gpu.sh)\n\n"
    "  ootd batch pairs.csv --engine ray --address auto   (on the GPUs of a Ray cluster)"
)
PER_PAIR_BARS = ("person", "garment", "denoise", "decode")


def error_text(entry: Any) -> str:
    """`<source> (<person> + <garment>): <problem>`, the location said once."""
    problem = str(entry.error or "")
    source = entry.pair.source
    if source and problem.startswith(f"{source}: "):
        problem = problem[len(source) + 2:]
    return escaped(f"{source} ({entry.pair.describe()}): {problem}")


def pair_line(entry: Any, done: int, total: int) -> str:
    """One finished pair as one plain line: position, status, seconds, outputs (or the error)."""
    from ootd.app.tryon.outputs import format_seconds

    seconds = entry.timings.get("wall") if entry.timings else None
    took = f" in {format_seconds(seconds)}" if isinstance(seconds, float | int) else ""
    what = error_text(entry) if entry.status == "error" else f"{entry.pair.describe()}: {', '.join(entry.outputs)}"
    kept = f" · preservation: {entry.preservation.line()}" if getattr(entry, "preservation", None) else ""
    return escaped(f"[{done}/{total}] {entry.status}{took} {what}{kept}")


class PairLog:
    """Counts finished pairs; appends each one's line (with the time of day) to --log-file when given."""

    def __init__(self, path: Path | None, total: int) -> None:
        self.path, self.total, self.done = path, total, 0
        self._file = None

    def __enter__(self) -> PairLog:
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in __exit__
            except OSError as exc:
                raise UsageError(f"cannot write the log file {self.path}: {exc.strerror or exc}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()

    def write(self, entry: Any) -> str:
        self.done += 1
        line = pair_line(entry, self.done, self.total)
        if self._file is not None:
            self._file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
            self._file.flush()
        return line


@with_options(RUN_OPTIONS, LOGGING_OPTIONS)
@guarded_command
def batch_command(
    csv_file: Annotated[Path | None, typer.Argument(help="CSV of person,garment,category[,mask] rows (paths "
                                                    "relative to the CSV).", metavar="[PAIRS.CSV]",
                                                    show_default=False)] = None,
    models: Annotated[Path | None, typer.Option("--models", "--people", help="Folder of person photos.",
                                                rich_help_panel=INPUTS, show_default=False)] = None,
    cloths: Annotated[Path | None, typer.Option("--cloths", "--garments", help="Folder of garment photos.",
                                                rich_help_panel=INPUTS, show_default=False)] = None,
    masks: Annotated[Path | None, typer.Option("--masks", help="Folder of masks named like the person photos "
                                               "(folder mode).", rich_help_panel=INPUTS,
                                               show_default=False)] = None,
    category: Annotated[str | None, typer.Option("--category", "-k", metavar=CATEGORY_METAVAR,
                                                 help="Category for folder mode (and for CSV "
                                                 "rows without one); auto: classified from each garment (CSV rows "
                                                 "without a category are auto unless this is given).",
                                                 rich_help_panel=INPUTS,
                                                 show_default=False)] = None,
    pairing: Annotated[str, typer.Option("--pairing", metavar=choices(Pairing), help="Folder mode: product "
                                         "(everyone x everything) or zip (i-th with i-th).",
                                         rich_help_panel=INPUTS)] = Pairing.PRODUCT.value,
    shard: Annotated[str | None, typer.Option("--shard", metavar="K/N", help="Run only shard K of N (K/N, from 0), "
                                              "e.g. one per GPU.", rich_help_panel=HARDWARE,
                                              show_default=False)] = None,
    report: Annotated[Path | None, typer.Option("--report", help=f"JSON-lines report. Default: OUTPUT/{REPORT_NAME}"
                                                " (one per shard).", rich_help_panel=OUTPUTS,
                                                show_default=False)] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Redo pairs whose outputs exist (default: skip "
                                            "those made with these settings, so a rerun resumes; refuse to start "
                                            "when some were made with others).", rich_help_panel=OUTPUTS)] = False,
    log_file: Annotated[Path | None, typer.Option("--log-file", help="Also append one line per finished pair "
                                                  "(time, status, seconds, outputs) to this file.",
                                                  rich_help_panel=OUTPUTS, show_default=False)] = None,
    engine: Annotated[str, typer.Option("--engine", metavar=choices(EngineName), help="Where the pairs run: in "
                                        "this process, or on a Ray cluster (needs the ray extra).",
                                        rich_help_panel=HARDWARE)] = EngineName.LOCAL.value,
    address: Annotated[str | None, typer.Option("--address", metavar="auto|HOST:PORT", help="--engine ray: join "
                                                "this Ray cluster (default: start one on this machine).",
                                                rich_help_panel=HARDWARE, show_default=False)] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="--engine ray: workers, each holding one "
                                                "pipeline (default: one per GPU; 1 without GPUs).",
                                                rich_help_panel=HARDWARE, show_default=False)] = None,
    gpus_per_worker: Annotated[float | None, typer.Option("--gpus-per-worker", help="--engine ray: GPUs per "
                                                          "worker (default: 1 if the cluster has GPUs, else 0).",
                                                          rich_help_panel=HARDWARE, show_default=False)] = None,
    truth: Annotated[Path | None, typer.Option("--truth", metavar="PHOTOS", help="Folder of the real photos: when "
                                               "the batch ends, measure its results against them (SSIM, LPIPS, "
                                               "FID, KID, as `ootd eval`) into the summary, eval.json, eval.html "
                                               "and index.html.", rich_help_panel=OUTPUTS,
                                               show_default=False)] = None,
    preservation: Annotated[bool, typer.Option(
        "--preservation/--no-preservation", rich_help_panel=OUTPUTS,
        help="Measure what each pair made changed of its person photo, region by region (face, hands, ...: "
             "docs/preservation.md), into its report line, the summary and the contact sheet (worst first); "
             "needs the pose and parsing models, no network.")] = True,
    review_above: Annotated[float | None, typer.Option(
        "--review-above", metavar="PERCENT", rich_help_panel=OUTPUTS, show_default=False,
        help="Mark for review the pairs where more than PERCENT of a region outside the mask changed (report "
             "line, summary, contact sheet; the exit code is unchanged).")] = None,
    json_out: JsonOpt = False,
    **options: Any,
) -> None:
    """Many pairs with the models loaded once; continues past bad pairs; reruns skip finished pairs.

    OUTPUT/index.html shows every pair's results (people x garments), refreshed as pairs finish; its address is
    the last line printed.

    Exit code 0 only if every pair succeeded (now or in an earlier run).
    """
    from ootd.app.batch.cluster import ClusterOptions
    from ootd.app.batch.engines import make_engine, require_engine
    from ootd.app.batch.index import index_name
    from ootd.app.batch.pairs import Shard, classify_pairs, collect_pairs, select_shard
    from ootd.app.batch.precheck import check_batch_outputs
    from ootd.app.batch.report import PairReport, report_name
    from ootd.app.tryon.loader import models_for
    from ootd.settings import parse_category_word

    config = checked_config({**options, "overwrite": overwrite})
    kept = _preservation(preservation, review_above)
    engine_name = require_engine(engine)
    cluster = ClusterOptions(address=address, workers=workers, gpus_per_worker=gpus_per_worker)
    if engine_name is EngineName.LOCAL and cluster != ClusterOptions():
        raise UsageError("--address, --workers and --gpus-per-worker need --engine ray")
    cluster.validate()
    default_category = parse_category_word(category) if category is not None else None
    sharding = Shard.parse(shard) if shard is not None else None
    pairs = collect_pairs(csv_file, models, cloths, default_category, pairing, masks, output=config.output)
    if sharding is not None:
        pairs = select_shard(pairs, sharding, config)
    models = models_for(config)  # every model of this process (the Ray engine's actors each make their own)
    pairs = classify_pairs(pairs, models, config.category_margin)  # `auto` rows (seconds each)
    report = report if report is not None else config.output / report_name(sharding)
    index = config.output / index_name(sharding)
    check_batch_outputs(pairs, config, report, [csv_file], pages=[index])  # no output replaces an input
    if truth is not None:  # the metrics' packages and weights before hours of try-ons, not after
        from ootd.app.evaluate.run import EvalOptions, check_evaluation

        evaluation = EvalOptions.from_words(device=config.device)
        check_evaluation(truth, evaluation, models)

    plain = not options["quiet"] and not json_out and not sys.stderr.isatty()  # nohup, 2> file: lines to follow
    with Display(show_progress(options["quiet"], json_out)) as display, PairLog(log_file, len(pairs)) as log:
        def on_report(entry: PairReport) -> None:
            display.reset(*PER_PAIR_BARS)
            line = log.write(entry)
            if entry.status == "error":  # as it happens, above the bars: a long batch should not hide failures
                display.print(f"error: {error_text(entry)}")
            elif plain:
                echo_err(line)
            else:
                logger.info("%s: %s", entry.pair.describe(), entry.status)

        quiet = options["quiet"] or json_out
        engine_run = make_engine(engine_name, config, cluster=cluster, report_path=report, progress=display,
                                 on_report=on_report, index_path=index, status=None if quiet else echo_err,
                                 preservation=kept, models=models)
        try:
            summary = engine_run.run(pairs)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM: what is kept, and how to go on (then "interrupted")
            if log.done:
                display.print(escaped(f"stopped after {log.done} of {len(pairs)} pairs; {report} keeps them: "
                                      "rerun the same command to resume (finished pairs are skipped)"))
            raise
        failed = _evaluate(summary, config.output, truth, evaluation, report, index, display,
                           models) if truth is not None else None

    sheet = index.resolve().as_uri() if index.is_file() else None  # a page that could not be written: warned
    if json_out:
        print_json({**summary.to_json(), "index": sheet})
    else:
        for line in summary.summary_lines(config):
            typer.echo(escaped(line))
        if sheet is not None:  # last, where a terminal shows it: a file:// address opens with a click
            typer.echo(escaped(f"contact sheet: {sheet}"))
    if failed is not None:  # the try-ons are done and kept; the measuring failed
        echo_err(f"error: evaluation: {one_line(failed)}")
        raise typer.Exit(failed.exit_code)
    if not summary.ok:
        raise typer.Exit(1)


def _preservation(on: bool, review_above: float | None) -> PreservationChoice:
    from ootd.app.tryon.preservation import PreservationChoice
    from ootd.evaluation.settings import check_review_above

    if review_above is not None and not on:
        raise UsageError("--review-above marks pairs by their preservation figures: leave out --no-preservation")
    return PreservationChoice(on, check_review_above(review_above))


def _evaluate(summary: BatchSummary, output: Path, truth: Path, evaluation: EvalOptions, report: Path, index: Path,
              display: Display, models: Models) -> OotdError | None:
    """The batch's results against the real photos, into its summary; the error when that fails."""
    from ootd.app.evaluate.folder import evaluate_batch
    from ootd.errors import OotdError

    try:
        summary.evaluation = evaluate_batch(output, truth, evaluation, report, index, models, progress=display)
    except OotdError as exc:
        return exc
    return None
