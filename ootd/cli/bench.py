"""`ootd bench`: a thin command over `run_bench` and `run_matrix` (the benchmark code, ootd/tools/bench/)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Annotated, Any

import typer

from ootd.cli.errors import echo_err, guarded_command
from ootd.cli.options import (
    BENCH,
    INPUTS,
    LOGGING_OPTIONS,
    MODEL_TYPES,
    OUTPUTS,
    SAMPLING,
    JsonOpt,
    Shared,
    choices,
    options_of,
    with_options,
)
from ootd.errors import UsageError
from ootd.tools.bench.architectures import ARCHITECTURES

RANDOM_WEIGHTS = tuple(ARCHITECTURES)  # full (the released sizes) or tiny
PRECISIONS = ("fp32", "bf16", "fp16")

EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd bench --checkpoints checkpoints --resolution 768x1024 --samples 4 --compare-original\n\n"
    "  ootd bench --random-weights full --matrix --json > bench.json"
)
BENCH_OPTIONS = options_of(BENCH)


@guarded_command
@with_options(BENCH_OPTIONS, LOGGING_OPTIONS, steps=2, attention="sdpa")
def bench_command(
    random_weights: Annotated[str | None, typer.Option("--random-weights", metavar=choices(RANDOM_WEIGHTS),
                                                       help="Benchmark in-memory random weights instead: full "
                                                       "(released sizes) or tiny.", rich_help_panel=INPUTS,
                                                       show_default=False)] = None,
    model_type: Annotated[str, typer.Option("--model-type", metavar=choices(MODEL_TYPES), help="hd or dc.",
                                            rich_help_panel=INPUTS)] = "hd",
    seed: Annotated[int, typer.Option("--seed", help="Random seed.", rich_help_panel=SAMPLING)] = 0,
    compare_original: Annotated[bool, typer.Option("--compare-original", help="Also time the original "
                                                   "formulation on the same weights.")] = False,
    original_precision: Annotated[str | None, typer.Option("--original-precision", metavar=choices(PRECISIONS),
                                                           help="Run the original formulation in this precision "
                                                           "(e.g. fp32 against ours in bf16; default: ours).",
                                                           show_default=False)] = None,
    flops: Annotated[bool, typer.Option("--flops", help="Count FLOPs per denoising step.")] = False,
    profile: Annotated[bool, typer.Option("--profile", help="Add a torch profiler table of one step.")] = False,
    matrix: Annotated[bool, typer.Option("--matrix", help="Every precision x attention backend on random "
                                         "weights (or only the --precision / --attention given), then a table."
                                         )] = False,
    save: Annotated[Path | None, typer.Option("--save", help="Also write the JSON report to this file.",
                                              rich_help_panel=OUTPUTS, show_default=False)] = None,
    save_images: Annotated[Path | None, typer.Option("--save-images", metavar="DIR", help="Also write our call's "
                                                     "images there (sample_<i>.png), e.g. for `ootd compare`.",
                                                     rich_help_panel=OUTPUTS, show_default=False)] = None,
    json_out: JsonOpt = False,
    *,
    shared: Shared,
) -> None:
    """Per-stage time and peak memory next to the memory plan's estimate (optionally vs the original)."""
    from dataclasses import replace

    from ootd.cli.display import print_json, to_json

    if random_weights is not None and random_weights not in RANDOM_WEIGHTS:
        raise UsageError(f"unknown random weights kind {random_weights!r}: use one of {', '.join(RANDOM_WEIGHTS)}")
    if original_precision is not None and original_precision not in PRECISIONS:
        raise UsageError(f"unknown original precision {original_precision!r}: use one of {', '.join(PRECISIONS)}")
    config = shared.config()  # the options of `ootd run`, turned into a config the same way
    config = replace(config, sampling=replace(config.sampling, seed=seed))
    say = _log_to(shared.quiet, json_out)
    if matrix:
        report = _matrix(config, random_weights, compare_original, flops, say)
    else:
        report = _single(config, model_type, random_weights, compare_original, original_precision, flops, profile,
                         save_images, say)
    if save is not None:
        save.write_text(to_json(report) + "\n")
    if json_out:
        print_json(report)
    elif matrix:
        for line in matrix_table(report):
            typer.echo(line)
    elif not shared.quiet:
        for line in stage_table(report):
            typer.echo(line)


def _matrix(config: Any, random_weights: str | None, original: bool, flops: bool, say: Any) -> dict[str, Any]:
    """--matrix: every precision x attention backend on random weights (or the ones given)."""
    from ootd.settings import AttentionName, PrecisionName
    from ootd.tools.bench.matrix import run_matrix

    return run_matrix(config, random_weights=random_weights or "full", original=original, count_flops=flops,
                      dtypes=_matrix_words(PrecisionName, "precision", config.precision.value),
                      attentions=_matrix_words(AttentionName, "attention", config.attention.value), log=say)


def _single(config: Any, model_type: str, random_weights: str | None, original: bool,
            original_precision: str | None, flops: bool, profile: bool, save_images: Path | None,
            say: Any) -> dict[str, Any]:
    """One configuration (the options'), optionally against the original formulation."""
    from ootd.settings import ModelType, PrecisionName
    from ootd.tools.bench.drivers import BenchOptions, run_bench

    other = PrecisionName.parse(original_precision) if original_precision is not None else None
    return run_bench(config, model_type=ModelType.parse(model_type), random_weights=random_weights, log=say,
                     options=BenchOptions(compare_original=original, count_flops=flops, profile=profile,
                                          save_images=save_images, original_precision=other))


def _matrix_words(kind: Any, name: str, chosen: str) -> tuple[str, ...]:
    """The matrix axis: the word typed on the command line, else every word but auto."""
    if given(name) and chosen != "auto":
        return (chosen,)
    return tuple(w for w in kind.words() if w != "auto")


def given(name: str) -> bool:
    """Whether an option was typed (or came from the environment), rather than left at its default."""
    try:
        from typer._click.core import ParameterSource
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover - older typer on top of click
        from click import get_current_context
        from click.core import ParameterSource
    ctx = get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source is not None and source is not ParameterSource.DEFAULT


def matrix_table(report: dict[str, Any]) -> list[str]:
    """The matrix as a plain table: one row per run (s/it, whole call, peak against the estimate), then what
    was skipped and why."""
    rows = [("precision", "attention", "options", "s/it", "call s", "peak GiB", "estimate GiB")]
    for run in report.get("runs", []):
        ours, memory = run.get("ours", {}), run.get("memory", {})
        options = ",".join(k for k in ("channels_last", "compile") if run.get(k)) or "-"
        rows.append((str(run.get("dtype")), str(run.get("attention")), options, _num(ours.get("s_per_it"), 3),
                     _num(ours.get("wall"), 2), _num(_gib(memory.get("measured_peak")), 2),
                     _num(_gib(memory.get("estimated_peak")), 2)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    for skip in report.get("skipped", []):
        what = " ".join(str(skip[k]) for k in ("dtype", "attention") if skip.get(k))
        lines.append(f"skipped {what}: {skip.get('reason')}")
    return lines


STAGE_ROWS = (("conditioning", "conditioning"), ("encode", "VAE encodes"), ("garment_unet", "garment UNet"),
              ("step", "denoising step (median)"), ("decode", "VAE decode"), ("call", "whole call"))


def stage_table(report: dict[str, Any]) -> list[str]:
    """Per stage: ours and (with --compare-original) the original's wall and process-CPU seconds, and the
    original / ours ratio: where a speed-up comes from, on this machine."""
    runs = {label: report[label] for label in ("ours", "original") if label in report}
    if not runs:
        return []
    header = ["stage", *(_run_label(report, label) for label in runs)]
    if len(runs) == 2:
        header.append("original / ours")
    rows = [header]
    for key, name in STAGE_ROWS:
        cells = [_stage_figures(run, key) for run in runs.values()]
        row = [name, *(_seconds(wall, cpu) for wall, cpu in cells)]
        if len(runs) == 2:
            (ours, ours_cpu), (orig, orig_cpu) = cells
            ratio = f"{orig / ours:.2f}x" if ours and orig else "-"
            row.append(ratio + (f" ({orig_cpu / ours_cpu:.2f}x CPU)" if ours and orig and ours_cpu and orig_cpu
                                else ""))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _seconds(wall: float | None, cpu: float | None) -> str:
    if wall is None:
        return "-"
    return f"{wall:.2f} s" + (f" ({cpu:.2f} s CPU)" if cpu is not None else "")


def _run_label(report: dict[str, Any], label: str) -> str:
    config = report.get("config", {})
    dtype = config.get("original_dtype" if label == "original" else "dtype", "")
    return f"{label} ({str(dtype).removeprefix('torch.')})"


def _stage_figures(run: dict[str, Any], key: str) -> tuple[float | None, float | None]:
    """(wall, CPU) seconds of a stage; for a step the medians of the try-on UNet's calls after the first."""
    stages = run.get("stages", {})
    if key == "call":
        return run.get("wall"), run.get("cpu")
    if key == "step":
        cpu = stages.get("cpu", {}).get("denoise", [])
        timed = cpu[1:] if len(cpu) > 2 else cpu
        return run.get("s_per_it"), (statistics.median(timed) if timed else None)
    module = {"conditioning": "conditioning", "encode": "encode", "garment_unet": "garment_unet",
              "decode": "decode"}[key]
    return run.get(key), run.get("stage_cpu", {}).get(module)


def _gib(value: Any) -> float | None:
    return value / 2**30 if isinstance(value, int | float) else None


def _num(value: Any, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) else "-"


def _log_to(quiet: bool, json_out: bool) -> Any:
    """Progress lines: none with -q, on stderr with --json (stdout is the report), else stdout."""
    if quiet:
        return lambda line: None
    return echo_err if json_out else typer.echo
