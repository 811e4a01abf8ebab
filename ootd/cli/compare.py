"""`ootd compare`: a thin command over ootd/tools/compare.py (PSNR, SSIM, pixel differences of same-named images)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from ootd.cli.errors import guarded_command
from ootd.cli.options import LOGGING_OPTIONS, JsonOpt, Shared, with_options
from ootd.errors import escaped
from ootd.evaluation.preservation import percent

EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd run ... -o exact  &&  ootd run ... --cache-interval 3 -o fast  &&  ootd compare exact fast\n\n"
    "Pairs images by file name; compares results only, unless --include-intermediates (what was skipped is "
    "listed). Higher PSNR/SSIM = closer (PSNR inf and SSIM 1 = identical). Against real photos (LPIPS, FID, "
    "KID): ootd eval. Each side's preservation figures are shown where they were measured (a batch's report, "
    "`ootd eval DIR --preservation`)."
)


def _psnr_text(value: float | str | None) -> str:
    if value is None:
        return "-"
    if value == "inf" or (isinstance(value, float) and math.isinf(value)):
        return "inf (identical)"
    return f"{value:.2f} dB"


@guarded_command
@with_options(LOGGING_OPTIONS)
def compare_command(
    a_dir: Annotated[Path, typer.Argument(help="Folder of reference images (e.g. the exact mode's outputs).",
                                          show_default=False)],
    b_dir: Annotated[Path, typer.Argument(help="Folder of images to judge against them, same file names.",
                                          show_default=False)],
    include_intermediates: Annotated[bool, typer.Option(
        "--include-intermediates", help="Also compare the pictures ootd writes beside its results (pose, parsing, "
        "mask, masked person, contact sheets), which are skipped by default.")] = False,
    json_out: JsonOpt = False,
    *,
    shared: Shared,
) -> None:
    """How far two folders of try-on results differ: PSNR, SSIM, max/mean absolute pixel difference per image and
    overall (how many are identical, the mean over the others). Images missing on one side, of different sizes or
    unreadable are reported, not compared."""
    from ootd.cli.display import print_json
    from ootd.tools.compare import compare_folders

    result = compare_folders(a_dir, b_dir, include_intermediates=include_intermediates)
    if json_out:
        print_json(result.to_dict())
        return
    for item in result.images:
        if item.problem is not None:
            typer.echo(escaped(f"{item.name}: {item.problem}") + _kept_text(item.kept))
        else:
            made = "; ".join(f"{k} {a} vs {b}" for k, (a, b) in item.settings.items())
            typer.echo(f"{escaped(item.name)}: PSNR {_psnr_text(item.psnr)}  SSIM {item.ssim:.4f}  "
                       f"max |diff| {item.max_abs}  mean |diff| {item.mean_abs:.3f}" + (f"  ({made})" if made else "")
                       + _kept_text(item.kept))
    if result.skipped:
        shown = ", ".join(result.skipped[:3]) + (f" and {len(result.skipped) - 3} more" if len(result.skipped) > 3
                                                 else "")
        typer.echo(escaped(f"skipped {len(result.skipped)} intermediate(s) and contact sheet(s), not results "
                           f"({shown}); --include-intermediates compares them too"))
    overall = result.summary()
    typer.echo(overall_line(overall))
    kept = overall.get("preservation")
    if isinstance(kept, dict):
        typer.echo(f"preservation ({kept['measured']} measured on both sides): the worst region outside the mask "
                   f"changed {percent(kept['score_a'])} in A, {percent(kept['score_b'])} in B (mean); B changed "
                   f"more in {kept['b_changed_more']} of {kept['measured']}")


def _kept_text(kept: tuple[Any, Any]) -> str:
    """`  preservation A: face 0.2% changed | B: hands 6.1% changed` (`-`: not measured on that side)."""
    if kept == (None, None):
        return ""
    a, b = (p.summary() if p is not None else "-" for p in kept)
    return escaped(f"  preservation A: {a} | B: {b}")


def overall_line(overall: dict[str, Any]) -> str:
    """`overall (3 compared, 0 problem(s)): 1 of 3 identical; the other 2: PSNR ...`: the identical pairs counted,
    the means taken over the others (an identical pair's infinite PSNR would make any mean infinite)."""
    compared, identical = overall["compared"], overall.get("identical", 0)
    head = f"overall ({compared} compared, {overall['problems']} problem(s))"
    if not compared:
        return f"overall: nothing compared ({overall['problems']} problem(s))"
    if identical == compared:
        return f"{head}: all {compared} identical (PSNR inf, SSIM 1.0000, max |diff| 0)"
    others = compared - identical
    which = "mean" if not identical else "the other" if others == 1 else f"the other {others} (mean)"
    return (f"{head}: {identical} of {compared} identical; {which}: PSNR {_psnr_text(overall['psnr_mean'])}  "
            f"SSIM {overall['ssim_mean']:.4f}  max |diff| {overall['max_abs']}  mean |diff| "
            f"{overall['mean_abs']:.3f}")
