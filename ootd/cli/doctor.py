"""`ootd doctor`: everything that decides whether (and how fast) a try-on can run here (the checks are
ootd/tools/doctor/'s)."""

from __future__ import annotations

from typing import Annotated

import typer

from ootd.cli.display import console, print_json
from ootd.cli.errors import guarded_command
from ootd.cli.options import (
    ALL_MODELS,
    LOGGING_OPTIONS,
    CheckpointsOpt,
    JsonOpt,
    ModelsOpt,
    parse_model_list,
    with_options,
)
from ootd.errors import escaped

EPILOG = "[bold]Example[/bold]\n\n  ootd doctor --checkpoints /data/ootd-checkpoints"


@guarded_command
@with_options(LOGGING_OPTIONS)
def doctor_command(
    checkpoints: CheckpointsOpt = None,
    models: ModelsOpt = ALL_MODELS,
    quick: Annotated[bool, typer.Option("--quick", help="Check checkpoint files by presence and size only.")] = False,
    no_kernels: Annotated[bool, typer.Option("--no-kernels", help="Skip the tiny GPU kernel test runs.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Everything that decides whether (and how fast) a try-on can run here, with the fix for each problem.

    Exit 1 when no try-on can run (e.g. checkpoints missing).
    """
    from ootd.tools.doctor import collect_report
    from ootd.weights.layout import default_checkpoints_dir

    root = checkpoints if checkpoints is not None else default_checkpoints_dir()
    chosen = [m.value for m in parse_model_list(models)]
    report = collect_report(root, models=chosen, load_checkpoints=not quick, run_kernels=not no_kernels)
    if json_out:
        print_json({
            "can_run": report.can_run, "worst": report.worst, "models_available": report.models_available,
            "released": not any(i.item == "architecture" and i.status == "warn" for i in report.items),
            "items": [
                {"section": i.section, "item": i.item, "status": i.status, "detail": i.detail, "fix": i.fix,
                 "blocking": i.blocking}
                for i in report.items
            ],
        })
    else:
        from rich.markup import escape
        from rich.table import Table

        marks = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]FAIL[/red]"}
        table = Table(title="ootd doctor")
        for column in ("section", "item", "status", "detail", "fix"):
            table.add_column(column, overflow="fold")
        for item in report.items:
            table.add_row(item.section, escape(escaped(item.item)), marks.get(item.status, item.status),
                          escape(escaped(item.detail)), escape(escaped(item.fix or "")))
        console().print(table)
        models_text = ", ".join(report.models_available) or "none"
        released = not any(i.item == "architecture" and i.status == "warn" for i in report.items)
        verdict = ("try-ons can run" if released else "try-ons can run, but not with the released models (their "
                   "pictures are noise)") if report.can_run else "try-ons cannot run until the FAIL items are fixed"
        typer.echo(f"{verdict} (models available: {models_text})")
    if not report.can_run:
        raise typer.Exit(1)
