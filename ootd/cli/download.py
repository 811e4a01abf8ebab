"""`ootd download`: the released checkpoint files from the Hugging Face hub (the work is in ootd/download.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ootd.cli.errors import guarded_command
from ootd.cli.options import ALL_MODELS, LOGGING_OPTIONS, ModelsOpt, parse_model_list, with_options

EPILOG = "[bold]Example[/bold]\n\n  ootd download --dest checkpoints --models hd,dc"


@with_options(LOGGING_OPTIONS)
@guarded_command
def download_command(
    dest: Annotated[Path | None, typer.Option("--dest", help="Checkpoints folder. Default: $OOTD_CHECKPOINTS or "
                                              "./checkpoints.", show_default=False)] = None,
    models: ModelsOpt = ALL_MODELS,
    revision: Annotated[str | None, typer.Option("--revision", help="Commit or tag of levihsu/OOTDiffusion "
                                                 "(pin it for reproducible runs).", show_default=False)] = None,
    clip_revision: Annotated[str | None, typer.Option("--clip-revision", help="Commit of "
                                                      "openai/clip-vit-large-patch14.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Fetch again even when files are present.")] = False,
    **logging: Any,
) -> None:
    """Fetch exactly the released files ootd needs from the Hugging Face hub (resumable)."""
    from ootd.checkpoints import default_checkpoints_dir
    from ootd.download import download_checkpoints

    target = dest if dest is not None else default_checkpoints_dir()
    chosen = parse_model_list(models)
    files = download_checkpoints(target, chosen, revision, progress=not logging["quiet"],
                                 clip_revision=clip_revision, force=force)
    typer.echo(f"{len(files)} checkpoint files in {target} (models: {', '.join(m.value for m in chosen)})")
    typer.echo(f"next: ootd checkpoints verify {target}")
