"""`ootd comfyui install|uninstall COMFYUI_DIR`: ootd's nodes in a ComfyUI (the work: ootd/comfyui/install.py;
the nodes: ootd/comfyui/nodes.py, docs/comfyui.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ootd.cli.errors import guarded_command
from ootd.cli.options import LOGGING_OPTIONS, with_options
from ootd.errors import escaped

GROUP_HELP = "ootd's try-on nodes in ComfyUI: install or remove them (docs/comfyui.md)."
EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ~/ComfyUI/venv/bin/python -m pip install -e ~/ootd   (ootd, from its checkout, in ComfyUI's Python)\n\n"
    "  ootd comfyui install ~/ComfyUI\n\n"
    "  ootd comfyui uninstall ~/ComfyUI\n\n"
    "Then restart ComfyUI: the nodes are in the `ootd` category, the example workflows among the templates."
)
ComfyDir = Annotated[Path, typer.Argument(metavar="COMFYUI_DIR", help="The ComfyUI folder (the one with main.py "
                                                                     "and custom_nodes/).", show_default=False)]


@guarded_command
@with_options(LOGGING_OPTIONS)
def install_command(comfyui: ComfyDir) -> None:
    """Put ootd's nodes in COMFYUI_DIR/custom_nodes/ootd (a shim that imports them from the ootd installed in
    ComfyUI's Python, and the example workflows); run it again after upgrading ootd."""
    from ootd.comfyui.install import install

    done = install(comfyui)
    typer.echo(escaped(f"installed ootd's nodes in {done.folder} ({len(done.workflows)} example workflows; "
                       f"{len(done.inputs)} example pictures written into {done.folder.parents[1] / 'input'})"))
    if done.python is None:
        typer.echo(escaped(f"ComfyUI must run with a Python that has ootd, such as this one: {sys.executable} "
                           f"({Path(sys.executable).name} main.py in {comfyui})"))
    elif done.python_has_ootd:
        typer.echo(escaped(f"ComfyUI's Python {done.python} has ootd: restart ComfyUI to load the nodes"))
    else:
        typer.echo(escaped(f"warning: ComfyUI's Python {done.python} cannot import ootd; install it there: "
                           f"{done.python} -m pip install -e {checkout()}"), err=True)


def checkout() -> str:
    """The checkout this ootd runs from (where `pip install -e` points), else a placeholder."""
    import ootd

    root = Path(ootd.__file__).resolve().parents[1]
    return str(root) if (root / "pyproject.toml").is_file() else "PATH_TO_OOTD"


@guarded_command
@with_options(LOGGING_OPTIONS)
def uninstall_command(comfyui: ComfyDir) -> None:
    """Remove ootd's nodes from COMFYUI_DIR/custom_nodes (only the folder `ootd comfyui install` wrote)."""
    from ootd.comfyui.install import uninstall

    removed = uninstall(comfyui)
    if removed is None:
        typer.echo(escaped(f"ootd's nodes are not installed in {comfyui}: nothing to remove"))
    else:
        typer.echo(escaped(f"removed {removed}; restart ComfyUI"))
