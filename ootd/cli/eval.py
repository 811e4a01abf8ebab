"""`ootd eval`: try-on results against the real photos (SSIM, LPIPS, FID, KID); a thin command over
ootd/app/evaluate (matching, the run, the batch folder's files) and ootd/evaluation (the metrics)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ootd.cli.errors import guarded_command
from ootd.cli.options import (
    HARDWARE,
    LOGGING_OPTIONS,
    CheckpointsOpt,
    DeviceOpt,
    JsonOpt,
    ProviderOpt,
    Shared,
    choices,
    with_options,
)
from ootd.errors import UsageError, escaped
from ootd.evaluation.settings import DEFAULT_BATCH, MetricWeights
from ootd.settings import ParsingProvider

if TYPE_CHECKING:
    from ootd.app.evaluate.preservation import PreservationReport
    from ootd.app.evaluate.report import EvalReport
    from ootd.app.evaluate.run import EvalOptions
    from ootd.cli.display import Display

    Measure = Callable[[Path, Path | None, Display], PreservationReport]

EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd eval out/ --truth photos/   (a batch folder: its report says whose photo each result is)\n\n"
    "  ootd eval other_tool/ --truth photos/ --pairs pairs.csv   (rows: result,truth)\n\n"
    "  ootd eval out/ --truth photos/ --unpaired   (FID/KID against a set of real photos)\n\n"
    "  ootd eval out/ --preservation   (what each result changed of its person photo, without real photos)\n\n"
    "Results are measured at their own size; each photo is centre-cropped to the result's aspect and resized to "
    "it (Lanczos). Needs the eval extra; the published weights are fetched on first use (`ootd download --eval`)."
)
BatchSizeOpt = Annotated[int, typer.Option("--batch-size", metavar="N", rich_help_panel=HARDWARE,
                                           help="Images through the networks at once (memory grows with it, "
                                                "never with the number of images).")]
WeightsOpt = Annotated[str, typer.Option(
    "--weights", metavar=choices(MetricWeights),
    help="standard: the published InceptionV3 and LPIPS weights (the numbers papers report). random: randomly "
         "initialised stand-ins, to try the command where the weights cannot be had; their numbers compare to "
         "nothing and every output says so.")]
PRESERVATION = "Preservation (without real photos: docs/preservation.md)"
PreservationOpt = Annotated[bool, typer.Option(
    "--preservation", rich_help_panel=PRESERVATION,
    help="Measure what each result changed of the person photo it was made from, region by region (face, hair, "
         "neck, arms, hands, legs, shoes, background), outside and inside the repainted mask; needs no --truth "
         "and no network, but the pose and parsing models (--checkpoints). Writes RESULTS/preservation.jsonl "
         "and preservation.html.")]
PeopleOpt = Annotated[Path | None, typer.Option(
    "--people", metavar="PHOTOS", rich_help_panel=PRESERVATION, show_default=False,
    help="--preservation: folder of the person photos, found by the name each result records (a batch report's "
         "paths are used first; default: --truth).")]
MasksOpt = Annotated[Path | None, typer.Option(
    "--masks", metavar="MASKS", rich_help_panel=PRESERVATION, show_default=False,
    help="--preservation: folder of the masks given to the try-ons, found by the name each result records.")]
ReviewAboveOpt = Annotated[float | None, typer.Option(
    "--review-above", metavar="PERCENT", rich_help_panel=PRESERVATION, show_default=False,
    help="--preservation: mark the results where more than PERCENT of a region outside the mask changed.")]


@guarded_command
@with_options(LOGGING_OPTIONS)
def eval_command(
    results: Annotated[Path, typer.Argument(help="Folder of try-on results (a batch's output folder, or any "
                                            "folder of images).", show_default=False)],
    truth: Annotated[Path | None, typer.Option("--truth", metavar="PHOTOS", help="Folder of the real photos (the "
                                               "person photos the results should reproduce).",
                                               show_default=False)] = None,
    pairs: Annotated[Path | None, typer.Option("--pairs", metavar="CSV", help="Rows result,truth (names in RESULTS "
                                               "and PHOTOS) instead of matching by report, record or name.",
                                               show_default=False)] = None,
    unpaired: Annotated[bool, typer.Option("--unpaired", help="FID and KID of the results against every photo in "
                                           "PHOTOS, without matching (no SSIM, LPIPS).")] = False,
    weights: WeightsOpt = MetricWeights.STANDARD.value,
    device: DeviceOpt = None,
    batch_size: BatchSizeOpt = DEFAULT_BATCH,
    json_out: JsonOpt = False,
    preservation: PreservationOpt = False,
    people: PeopleOpt = None,
    masks: MasksOpt = None,
    review_above: ReviewAboveOpt = None,
    checkpoints: CheckpointsOpt = None,
    parsing_provider: ProviderOpt = ParsingProvider.CPU.value,
    *,
    shared: Shared,
) -> None:
    """How far try-on results are from the real photos: SSIM and LPIPS per pair, FID and KID of the sets; with
    --preservation, what each result changed of its own person photo, without real photos.

    Prints the counts and what was skipped and why. On a batch's output folder it also writes eval.json and
    eval.html there and adds the numbers to its index.html."""
    from ootd.cli.display import Display, print_json, show_progress

    measure = _preservation_run(preservation, people, masks, review_above, checkpoints, parsing_provider, device)
    if truth is None and not preservation:
        raise UsageError("give --truth PHOTOS (the metrics against real photos), --preservation (what each result "
                         "changed of its own photo), or both")
    chosen = _eval_options(truth, weights, device, batch_size, unpaired, pairs)
    with Display(show_progress(shared.quiet, json_out)) as display:
        report = _evaluate(results, truth, chosen, display) if chosen is not None and truth is not None else None
        kept = measure(results, truth, display) if measure is not None else None
    if json_out:
        answer = {**report.to_json(), "written": [str(p) for p in report.written]} if report is not None else {}
        if kept is not None:
            answer = {**answer, "preservation": kept.to_json()} if report is not None else kept.to_json()
        print_json(answer)
        return
    written = []
    for one in (report, kept):
        if one is not None:
            for line in one.lines():
                typer.echo(escaped(line))
            written += one.written
    if written:
        typer.echo(escaped(f"written: {', '.join(str(p) for p in written)}"))


def _eval_options(truth: Path | None, weights: str, device: str | None, batch_size: int, unpaired: bool,
                  pairs: Path | None) -> EvalOptions | None:
    from ootd.app.evaluate.run import EvalOptions

    if truth is None:
        if unpaired or pairs is not None:
            raise UsageError("--unpaired and --pairs measure against real photos: give --truth PHOTOS")
        return None
    return EvalOptions.from_words(weights, device, batch_size, unpaired, pairs)


def _evaluate(results: Path, truth: Path, chosen: EvalOptions, display: Display) -> EvalReport:
    from ootd.app.evaluate.folder import evaluate_batch, is_batch_folder
    from ootd.app.evaluate.run import evaluate, evaluation_models

    models = evaluation_models(chosen)  # the metric networks, on the chosen device
    if is_batch_folder(results):
        return evaluate_batch(results, truth, chosen, models=models, progress=display)
    return evaluate(results, truth, chosen, progress=display, models=models)


def _preservation_run(on: bool, people: Path | None, masks: Path | None, review_above: float | None,
                      checkpoints: Path | None, parsing_provider: str, device: str | None) -> Measure | None:
    """The preservation measurement `--preservation` asks for, its options checked now (None: not asked)."""
    if not on:
        if people is not None or masks is not None or review_above is not None:
            raise UsageError("--people, --masks and --review-above are --preservation's: add --preservation")
        return None
    from ootd.app.evaluate.preservation import PreservationOptions, measure_folder
    from ootd.app.tryon.config import build_config
    from ootd.app.tryon.preservation import parser_for

    chosen = PreservationOptions.from_words(people, masks, review_above)
    parser = parser_for(build_config(checkpoints=checkpoints, device=device, parsing_provider=parsing_provider))
    return lambda results, truth, display: measure_folder(results, chosen, parser, display, truth)
