"""`ootd batch`: many pairs (a CSV, or two folders) with the models loaded once; the engines are in
ootd/app/batch/."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ootd.app.batch.report import REPORT_NAME
from ootd.cli.display import Display, print_json, show_progress
from ootd.cli.errors import FlagNames, echo_err, guarded_command, one_line
from ootd.cli.options import (
    CATEGORY_METAVAR,
    HARDWARE,
    INPUTS,
    LOGGING_OPTIONS,
    OUTPUTS,
    RUN_OPTIONS,
    JsonOpt,
    Shared,
    choices,
    with_options,
)
from ootd.errors import UsageError, escaped, worded
from ootd.settings import EngineName, Pairing

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ootd.app.batch.cluster import ClusterOptions
    from ootd.app.batch.pair import Pair
    from ootd.app.batch.report import BatchSummary, PairReport
    from ootd.app.evaluate.run import EvalOptions
    from ootd.app.tryon.config import RunConfig
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


def _batch_opt(*names: str, panel: str, **kwargs: Any) -> Any:
    return typer.Option(*names, rich_help_panel=panel, **kwargs)


PairsArg = Annotated[Path | None, typer.Argument(help="CSV of person,garment,category[,mask] rows (paths relative "
                                                      "to the CSV).", metavar="[PAIRS.CSV]", show_default=False)]
PeopleOpt = Annotated[Path | None, _batch_opt("--models", "--people", help="Folder of person photos.", panel=INPUTS,
                                              show_default=False)]
GarmentsOpt = Annotated[Path | None, _batch_opt("--cloths", "--garments", help="Folder of garment photos.",
                                                panel=INPUTS, show_default=False)]
MasksOpt = Annotated[Path | None, _batch_opt("--masks", help="Folder of masks named like the person photos (folder "
                                             "mode).", panel=INPUTS, show_default=False)]
CategoryOpt = Annotated[str | None, _batch_opt(
    "--category", "-k", metavar=CATEGORY_METAVAR, panel=INPUTS, show_default=False,
    help="Category for folder mode (and for CSV rows without one); auto: classified from each garment (CSV rows "
         "without a category are auto unless this is given).")]
PairingOpt = Annotated[str, _batch_opt("--pairing", metavar=choices(Pairing), panel=INPUTS,
                                       help="Folder mode: product (everyone x everything) or zip (i-th with i-th).")]
ShardOpt = Annotated[str | None, _batch_opt("--shard", metavar="K/N", panel=HARDWARE, show_default=False,
                                            help="Run only shard K of N (K/N, from 0), e.g. one per GPU.")]
ReportOpt = Annotated[Path | None, _batch_opt("--report", panel=OUTPUTS, show_default=False,
                                              help=f"JSON-lines report. Default: OUTPUT/{REPORT_NAME} (one per "
                                                   "shard).")]
OverwriteOpt = Annotated[bool, _batch_opt(
    "--overwrite", panel=OUTPUTS, help="Redo pairs whose outputs exist (default: skip those made with these "
                                       "settings, so a rerun resumes; refuse to start when some were made with "
                                       "others).")]
LogFileOpt = Annotated[Path | None, _batch_opt("--log-file", panel=OUTPUTS, show_default=False,
                                               help="Also append one line per finished pair (time, status, "
                                                    "seconds, outputs) to this file.")]
EngineOpt = Annotated[str, _batch_opt("--engine", metavar=choices(EngineName), panel=HARDWARE,
                                      help="Where the pairs run: in this process, or on a Ray cluster (needs the "
                                           "ray extra).")]
AddressOpt = Annotated[str | None, _batch_opt("--address", metavar="auto|HOST:PORT", panel=HARDWARE,
                                              show_default=False, help="--engine ray: join this Ray cluster "
                                                                       "(default: start one on this machine).")]
WorkersOpt = Annotated[int | None, _batch_opt("--workers", panel=HARDWARE, show_default=False,
                                              help="--engine ray: workers, each holding one pipeline (default: one "
                                                   "per GPU; 1 without GPUs).")]
GpusOpt = Annotated[float | None, _batch_opt("--gpus-per-worker", panel=HARDWARE, show_default=False,
                                             help="--engine ray: GPUs per worker (default: 1 if the cluster has "
                                                  "GPUs, else 0).")]
PreservationOpt = Annotated[bool, _batch_opt(
    "--preservation/--no-preservation", panel=OUTPUTS,
    help="Measure what each pair made changed of its person photo, region by region (face, hands, ...: "
         "docs/preservation.md), into its report line, the summary and the contact sheet (worst first); needs the "
         "pose and parsing models, no network.")]
ReviewAboveOpt = Annotated[float | None, _batch_opt(
    "--review-above", metavar="PERCENT", panel=OUTPUTS, show_default=False,
    help="Mark for review the pairs where more than PERCENT of a region outside the mask changed (report line, "
         "summary, contact sheet; the exit code is unchanged).")]
TruthOpt = Annotated[Path | None, _batch_opt(
    "--truth", metavar="PHOTOS", panel=OUTPUTS, show_default=False,
    help="Folder of the real photos: when the batch ends, measure its results against them (SSIM, LPIPS, FID, "
         "KID, as `ootd eval`) into the summary, eval.json, eval.html and index.html.")]


@guarded_command
@with_options(RUN_OPTIONS, LOGGING_OPTIONS)
def batch_command(
    csv_file: PairsArg = None,
    models: PeopleOpt = None,
    cloths: GarmentsOpt = None,
    masks: MasksOpt = None,
    category: CategoryOpt = None,
    pairing: PairingOpt = Pairing.PRODUCT.value,
    shard: ShardOpt = None,
    report: ReportOpt = None,
    overwrite: OverwriteOpt = False,
    log_file: LogFileOpt = None,
    engine: EngineOpt = EngineName.LOCAL.value,
    address: AddressOpt = None,
    workers: WorkersOpt = None,
    gpus_per_worker: GpusOpt = None,
    truth: TruthOpt = None,
    preservation: PreservationOpt = True,
    review_above: ReviewAboveOpt = None,
    json_out: JsonOpt = False,
    *,
    shared: Shared,
) -> None:
    """Many pairs with the models loaded once; continues past bad pairs; reruns skip finished pairs.

    OUTPUT/index.html shows every pair's results (people x garments), refreshed as pairs finish; its address is
    the last line printed.

    Exit code 0 only if every pair succeeded (now or in an earlier run).
    """
    from ootd.app.batch.cluster import ClusterOptions

    config = shared.config(overwrite=overwrite)
    kept = _preservation(preservation, review_above)
    given = _Given(csv_file, models, cloths, masks, category, pairing, shard)
    cluster = ClusterOptions(address=address, workers=workers, gpus_per_worker=gpus_per_worker)
    plan = _plan(config, given, engine, cluster, report, truth, kept)
    plain = not shared.quiet and not json_out and not sys.stderr.isatty()  # nohup, 2> file: lines to follow
    with Display(show_progress(shared.quiet, json_out)) as display, PairLog(log_file, len(plan.pairs)) as log:
        summary = _run(plan, display, log, plain=plain, quiet=shared.quiet or json_out)
        failed = _evaluate(summary, plan, display) if plan.evaluation is not None else None
    _finish(summary, plan, json_out)
    if failed is not None:  # the try-ons are done and kept; the measuring failed
        echo_err(f"error: evaluation: {one_line(worded(failed, FlagNames.of(batch_command)))}")
        raise typer.Exit(failed.exit_code)
    if not summary.ok:
        raise typer.Exit(1)


@dataclass(frozen=True)
class _Given:
    """Where the pairs come from, as the options give it: a CSV, or folders with a category and a pairing."""

    csv_file: Path | None
    models: Path | None
    cloths: Path | None
    masks: Path | None
    category: str | None
    pairing: str
    shard: str | None


@dataclass(frozen=True)
class _Plan:
    """A checked batch: its config, its pairs (this shard's, `auto` rows classified), the engine, the report and
    contact sheet it writes, and the evaluation it ends with (None: none)."""

    config: RunConfig
    pairs: Sequence[Pair]
    engine: EngineName
    cluster: ClusterOptions
    report: Path
    index: Path
    models: Models  # every model of this process (the Ray engine's actors each make their own)
    preservation: PreservationChoice | None = None  # whether each pair made is measured, and the review mark
    truth: Path | None = None
    evaluation: EvalOptions | None = None


def _plan(config: RunConfig, given: _Given, engine: str, cluster: ClusterOptions, report: Path | None,
          truth: Path | None, preservation: PreservationChoice) -> _Plan:
    """Every check before the first try-on: the engine's options, the pairs, their outputs (no output replaces an
    input), and the metrics' packages and weights (before hours of try-ons, not after)."""
    from ootd.app.batch.cluster import ClusterOptions
    from ootd.app.batch.engines import require_engine
    from ootd.app.batch.index import index_name
    from ootd.app.batch.pairs import Shard, classify_pairs, collect_pairs, select_shard
    from ootd.app.batch.precheck import check_batch_outputs
    from ootd.app.batch.report import report_name
    from ootd.app.tryon.loader import models_for
    from ootd.settings import parse_category_word

    engine_name = require_engine(engine)
    if engine_name is EngineName.LOCAL and cluster != ClusterOptions():
        raise UsageError("--address, --workers and --gpus-per-worker need --engine ray")
    cluster.validate()
    default_category = parse_category_word(given.category) if given.category is not None else None
    sharding = Shard.parse(given.shard) if given.shard is not None else None
    pairs = collect_pairs(given.csv_file, given.models, given.cloths, default_category, given.pairing, given.masks,
                          output=config.output)
    if sharding is not None:
        pairs = select_shard(pairs, sharding, config)
    models = models_for(config)  # every model of this process (the Ray engine's actors each make their own)
    # `auto` rows (seconds each); their errors in this command's words
    pairs = classify_pairs(pairs, models, config.category_margin, FlagNames.of(batch_command))
    report = report if report is not None else config.output / report_name(sharding)
    index = config.output / index_name(sharding)
    check_batch_outputs(pairs, config, report, [given.csv_file], pages=[index])
    evaluation = None
    if truth is not None:
        from ootd.app.evaluate.run import EvalOptions, check_evaluation

        evaluation = EvalOptions.from_words(device=config.device)
        check_evaluation(truth, evaluation, models)
    return _Plan(config, pairs, engine_name, cluster, report, index, models, preservation, truth, evaluation)


def _run(plan: _Plan, display: Display, log: PairLog, *, plain: bool, quiet: bool) -> BatchSummary:
    """The pairs on the plan's engine, each finished pair a line (the log file's; an error above the bars)."""
    from ootd.app.batch.engines import make_engine

    def on_report(entry: PairReport) -> None:
        display.reset(*PER_PAIR_BARS)
        line = log.write(entry)
        if entry.status == "error":  # as it happens, above the bars: a long batch should not hide failures
            display.print(f"error: {error_text(entry)}")
        elif plain:
            echo_err(line)
        else:
            logger.info("%s: %s", entry.pair.describe(), entry.status)

    engine_run = make_engine(plan.engine, plan.config, cluster=plan.cluster, report_path=plan.report,
                             progress=display, on_report=on_report, index_path=plan.index,
                             status=None if quiet else echo_err, preservation=plan.preservation,
                             words=FlagNames.of(batch_command), models=plan.models)
    try:
        return engine_run.run(plan.pairs)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: what is kept, and how to go on (then "interrupted")
        if log.done:
            display.print(escaped(f"stopped after {log.done} of {len(plan.pairs)} pairs; {plan.report} keeps them: "
                                  "rerun the same command to resume (finished pairs are skipped)"))
        raise


def _finish(summary: BatchSummary, plan: _Plan, json_out: bool) -> None:
    """The summary (JSON, or lines), then the contact sheet's address, last, where a terminal shows it (a
    file:// address opens with a click)."""
    index = plan.index
    sheet = index.resolve().as_uri() if index.is_file() else None  # a page that could not be written: warned
    if json_out:
        print_json({**summary.to_json(), "index": sheet})
        return
    for line in summary.summary_lines(plan.config):
        typer.echo(escaped(line))
    if sheet is not None:
        typer.echo(escaped(f"contact sheet: {sheet}"))


def _preservation(on: bool, review_above: float | None) -> PreservationChoice:
    from ootd.app.tryon.preservation import PreservationChoice
    from ootd.evaluation.settings import check_review_above

    if review_above is not None and not on:
        raise UsageError("--review-above marks pairs by their preservation figures: leave out --no-preservation")
    return PreservationChoice(on, check_review_above(review_above))


def _evaluate(summary: BatchSummary, plan: _Plan, display: Display) -> OotdError | None:
    """The batch's results against the real photos, into its summary; the error when that fails."""
    from ootd.app.evaluate.folder import evaluate_batch
    from ootd.errors import OotdError

    try:
        summary.evaluation = evaluate_batch(plan.config.output, plan.truth, plan.evaluation, plan.report, plan.index,
                                            plan.models, progress=display)
    except OotdError as exc:
        return exc
    return None
