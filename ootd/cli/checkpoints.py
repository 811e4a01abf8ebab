"""`ootd checkpoints verify`: every expected checkpoint file, present, sized, loadable, with its fix
(the checks are ootd/weights/verify.py's)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ootd.cli.display import console, print_json, size_cell
from ootd.cli.errors import guarded_command
from ootd.cli.options import ALL_MODELS, LOGGING_OPTIONS, JsonOpt, ModelsOpt, parse_model_list, with_options
from ootd.errors import CheckpointError, escaped

VERIFY_EPILOG = "[bold]Example[/bold]\n\n  ootd checkpoints verify checkpoints --models hd"
GROUP_EPILOG = "[bold]Example[/bold]\n\n  ootd checkpoints verify checkpoints --models hd --json"


@guarded_command
@with_options(LOGGING_OPTIONS)
def verify_command(
    folder: Annotated[Path | None, typer.Argument(help="Checkpoints folder. Default: $OOTD_CHECKPOINTS, "
                                                  "else ./checkpoints if it exists, else the per-user folder.",
                                                  metavar="[DIR]", show_default=False)] = None,
    models: ModelsOpt = ALL_MODELS,
    quick: Annotated[bool, typer.Option("--quick", help="Presence and size only (no load checks).")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Check every expected checkpoint file: present, size, loadable, and the fix; then whether the tree is the
    released models (config dimensions, parameter counts: a warning otherwise). Exit 1 on any file problem."""
    from ootd.weights.architecture import compare_to_released, summary
    from ootd.weights.layout import default_checkpoints_dir
    from ootd.weights.verify import verify_checkpoints

    root = folder if folder is not None else default_checkpoints_dir()
    chosen = parse_model_list(models)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise CheckpointError(f"checkpoints folder {root} {what}; run `ootd download --dest {root}`")
    checks = verify_checkpoints(root, chosen, load=not quick)
    bad = [c for c in checks if not c.ok]
    diffs = compare_to_released(root, chosen, count_params=not quick) if any(c.present for c in checks) else []
    if json_out:
        print_json({
            "root": str(root), "ok": not bad, "released": not diffs and not bad,
            "architecture": [str(d) for d in diffs],
            "files": [
                {"component": c.component, "path": str(c.path), "present": c.present, "size": c.size, "ok": c.ok,
                 "problem": c.problem, "fix": c.fix}
                for c in checks
            ],
        })
    else:
        _print_table(root, checks, quick)
        if bad:
            typer.echo(escaped(f"{len(bad)} of {len(checks)} files have problems; fix them (or run "
                               f"`ootd download --dest {root}`) and verify again"))
        elif diffs:
            typer.echo(escaped(f"all {len(checks)} files ok, but warning: {summary(diffs)}; try-ons run, but their "
                               f"pictures are noise (`ootd download --dest {root}` fetches the released weights)"))
        else:
            typer.echo(f"all {len(checks)} files ok: the released OOTDiffusion models")
    if bad:
        raise typer.Exit(1)


def _print_table(root: Path, checks: list[Any], quick: bool) -> None:
    from rich.markup import escape
    from rich.table import Table

    def text(value: object) -> str:  # a name or message in a cell: no markup, no control characters
        return escape(escaped(str(value)))

    table = Table(title=f"checkpoints in {text(root)}", show_lines=False)
    for column in ("component", "file", "present", "size", "loadable", "fix"):
        table.add_column(column, overflow="fold")
    for c in checks:
        try:
            shown = str(c.path.relative_to(root))
        except ValueError:
            shown = str(c.path)
        if not c.present:
            loadable = "-"
        elif c.ok:
            loadable = "[green]yes[/green]" if not quick else "not checked"
        else:
            loadable = f"[red]no[/red]: {text(c.problem)}"
        table.add_row(c.component, text(shown), "[green]yes[/green]" if c.present else "[red]no[/red]",
                      size_cell(c.size), loadable, text(c.fix or ""))
    console().print(table)
