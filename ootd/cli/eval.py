"""`ootd eval`: try-on results against the real photos (SSIM, LPIPS, FID, KID); a thin command over
ootd/app/evaluate (matching, the run, the batch folder's files) and ootd/evaluation (the metrics)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ootd.cli.errors import guarded_command
from ootd.cli.options import HARDWARE, LOGGING_OPTIONS, DeviceOpt, JsonOpt, Shared, choices, with_options
from ootd.evaluation.settings import DEFAULT_BATCH, MetricWeights

EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd eval out/ --truth photos/   (a batch folder: its report says whose photo each result is)\n\n"
    "  ootd eval other_tool/ --truth photos/ --pairs pairs.csv   (rows: result,truth)\n\n"
    "  ootd eval out/ --truth photos/ --unpaired   (FID/KID against a set of real photos)\n\n"
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


@guarded_command
@with_options(LOGGING_OPTIONS)
def eval_command(
    results: Annotated[Path, typer.Argument(help="Folder of try-on results (a batch's output folder, or any "
                                            "folder of images).", show_default=False)],
    truth: Annotated[Path, typer.Option("--truth", metavar="PHOTOS", help="Folder of the real photos (the "
                                        "person photos the results should reproduce).", show_default=False)],
    pairs: Annotated[Path | None, typer.Option("--pairs", metavar="CSV", help="Rows result,truth (names in RESULTS "
                                               "and PHOTOS) instead of matching by report, record or name.",
                                               show_default=False)] = None,
    unpaired: Annotated[bool, typer.Option("--unpaired", help="FID and KID of the results against every photo in "
                                           "PHOTOS, without matching (no SSIM, LPIPS).")] = False,
    weights: WeightsOpt = MetricWeights.STANDARD.value,
    device: DeviceOpt = None,
    batch_size: BatchSizeOpt = DEFAULT_BATCH,
    json_out: JsonOpt = False,
    *,
    shared: Shared,
) -> None:
    """How far try-on results are from the real photos: SSIM and LPIPS per pair, FID and KID of the sets.

    Prints the counts and what was skipped and why. On a batch's output folder it also writes eval.json and
    eval.html there and adds the numbers to its index.html."""
    from ootd.app.evaluate.folder import evaluate_batch, is_batch_folder
    from ootd.app.evaluate.run import EvalOptions, evaluate
    from ootd.cli.display import Display, print_json, show_progress

    chosen = EvalOptions.from_words(weights, device, batch_size, unpaired, pairs)
    with Display(show_progress(shared.quiet, json_out)) as display:
        if is_batch_folder(results):
            report = evaluate_batch(results, truth, chosen, progress=display)
        else:
            report = evaluate(results, truth, chosen, progress=display)
    if json_out:
        print_json({**report.to_json(), "written": [str(p) for p in report.written]})
        return
    for line in report.lines():
        typer.echo(line)
    if report.written:
        typer.echo(f"written: {', '.join(str(p) for p in report.written)}")
