"""`ootd batch`: many pairs (a CSV, or two folders) with the models loaded once; the engine is ootd/app/batch.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from ootd.app.batch import REPORT_NAME
from ootd.cli.display import Display, print_json, show_progress
from ootd.cli.errors import echo_err, guarded_command
from ootd.cli.options import (
    HARDWARE,
    INPUTS,
    LOGGING_OPTIONS,
    OUTPUTS,
    RUN_OPTIONS,
    JsonOpt,
    choices,
    config_from,
    with_options,
)
from ootd.config import EngineName, Pairing
from ootd.errors import UsageError

logger = logging.getLogger("ootd.cli")

EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd batch pairs.csv -o results   (rows: person,garment,category,mask; header optional)\n\n"
    "  ootd batch --models people/ --cloths shirts/ --category upper --pairing product\n\n"
    "  ootd batch pairs.csv --shard 0/2 --device cuda:0   (one of two processes; see scripts/multi_gpu.sh)\n\n"
    "  ootd batch pairs.csv --engine ray --address auto   (on the GPUs of a Ray cluster)"
)
PER_PAIR_BARS = ("person", "garment", "denoise", "decode")


def parse_shard(value: str | None) -> tuple[int, int] | None:
    """'K/N' -> (K, N)."""
    if value is None:
        return None
    try:
        index, count = (int(x) for x in value.split("/"))
    except ValueError:
        raise UsageError(f"bad shard {value!r}: use K/N, e.g. 0/4 for the first of four") from None
    if count < 1 or not 0 <= index < count:
        raise UsageError(f"bad shard {value!r}: need 0 <= K < N")
    return index, count


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
    category: Annotated[str | None, typer.Option("--category", "-k", help="Category for folder mode (and for CSV "
                                                 "rows without one).", rich_help_panel=INPUTS,
                                                 show_default=False)] = None,
    pairing: Annotated[str, typer.Option("--pairing", metavar=choices(Pairing), help="Folder mode: product "
                                         "(everyone x everything) or zip (i-th with i-th).",
                                         rich_help_panel=INPUTS)] = Pairing.PRODUCT.value,
    shard: Annotated[str | None, typer.Option("--shard", help="Run only shard K of N (K/N, from 0), e.g. one per "
                                              "GPU.", rich_help_panel=HARDWARE, show_default=False)] = None,
    report: Annotated[Path | None, typer.Option("--report", help=f"JSON-lines report. Default: OUTPUT/{REPORT_NAME}"
                                                " (one per shard).", rich_help_panel=OUTPUTS,
                                                show_default=False)] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Redo pairs whose outputs exist (default: skip "
                                            "those made with these settings, so a rerun resumes; refuse to start "
                                            "when some were made with others).", rich_help_panel=OUTPUTS)] = False,
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
    json_out: JsonOpt = False,
    **options: Any,
) -> None:
    """Many pairs with the models loaded once; continues past bad pairs; reruns skip finished pairs.

    OUTPUT/index.html shows every pair's results (people x garments), refreshed as pairs finish.

    Exit code 0 only if every pair succeeded (now or in an earlier run).
    """
    from ootd.app.batch import PairReport, report_name
    from ootd.app.contact import index_name
    from ootd.app.engines import ClusterOptions, make_engine, require_engine
    from ootd.app.pairs import collect_pairs, select_shard
    from ootd.app.safety import check_batch_outputs
    from ootd.app.tempfiles import clean_stale_temps
    from ootd.config import Category
    from ootd.images import check_output_dir

    config = config_from({**options, "overwrite": overwrite})
    engine_name = require_engine(engine)
    cluster = ClusterOptions(address=address, workers=workers, gpus_per_worker=gpus_per_worker)
    if engine_name is EngineName.LOCAL and cluster != ClusterOptions():
        raise UsageError("--address, --workers and --gpus-per-worker need --engine ray")
    default_category = Category.parse(category) if category is not None else None
    sharding = parse_shard(shard)
    pairs = collect_pairs(csv_file, models, cloths, default_category, pairing, masks, output=config.output)
    if sharding is not None:
        pairs = select_shard(pairs, sharding[0], sharding[1], config)
    report = report if report is not None else config.output / report_name(sharding)
    check_batch_outputs(pairs, config, report, [csv_file],  # no output replaces an input or a file not ours
                        pages=[config.output / index_name(sharding)])
    check_output_dir(config.output)
    clean_stale_temps(config.output)

    with Display(show_progress(options["quiet"], json_out)) as display:
        def on_report(entry: PairReport) -> None:
            display.reset(*PER_PAIR_BARS)
            if entry.status == "error":  # as it happens: a long batch should not hide its failures
                echo_err(f"error: {entry.pair.source} ({entry.pair.describe()}): {entry.error}")
            else:
                logger.info("%s: %s", entry.pair.describe(), entry.status)

        quiet = options["quiet"] or json_out
        summary = make_engine(engine_name, config, cluster=cluster, report_path=report, progress=display,
                              on_report=on_report, index_path=config.output / index_name(sharding),
                              status=None if quiet else echo_err).run(pairs)

    if json_out:
        print_json(summary.to_json())
    else:
        for line in summary.summary_lines(config):
            typer.echo(line)
    if not summary.ok:
        raise typer.Exit(1)
