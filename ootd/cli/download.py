"""`ootd download`: the released checkpoint files from the Hugging Face hub (the work: ootd/weights/download.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ootd.cli.display import size_cell
from ootd.cli.errors import guarded_command
from ootd.cli.options import ALL_MODELS, LOGGING_OPTIONS, ModelsOpt, Shared, parse_model_list, with_options
from ootd.errors import escaped

EPILOG = ("[bold]Examples[/bold]\n\n  ootd download   (into ./checkpoints if that folder exists, else the per-user "
          "folder)\n\n  ootd download --dest checkpoints --models hd\n\n  ootd download --list   (the files and "
          "where they go, to fetch them by hand)\n\n  ootd download --eval   (the weights of `ootd eval`'s networks)")


@guarded_command
@with_options(LOGGING_OPTIONS)
def download_command(
    dest: Annotated[Path | None, typer.Option("--dest", metavar="DIR", help="Checkpoints folder. Default: "
                                              "$OOTD_CHECKPOINTS, else ./checkpoints if it exists, else the "
                                              "per-user folder.", show_default=False)] = None,
    models: ModelsOpt = ALL_MODELS,
    revision: Annotated[str | None, typer.Option("--revision", help="Commit or tag of levihsu/OOTDiffusion "
                                                 "(pin it for reproducible runs).", show_default=False)] = None,
    clip_revision: Annotated[str | None, typer.Option("--clip-revision", help="Commit of "
                                                      "openai/clip-vit-large-patch14.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Fetch again even when files are present.")] = False,
    list_files: Annotated[bool, typer.Option("--list", help="Print each file's hub URL and where it goes, and "
                                             "download nothing.")] = False,
    eval_weights: Annotated[bool, typer.Option("--eval", help="Instead: the published weights of the networks "
                                               "`ootd eval` measures with (InceptionV3, AlexNet), into torch's hub "
                                               "cache ($TORCH_HOME/hub/checkpoints). Needs the eval extra.")] = False,
    *,
    shared: Shared,
) -> None:
    """Fetch exactly the released files ootd needs from the Hugging Face hub (resumable; the size is shown and
    the free disk space checked first)."""
    if eval_weights:
        _download_eval(force, list_files, shared.quiet)
        return
    from ootd.weights.download import download_checkpoints, file_list
    from ootd.weights.layout import default_checkpoints_dir

    target = dest if dest is not None else default_checkpoints_dir()
    chosen = parse_model_list(models)
    if list_files:
        for url, path in file_list(target, chosen):
            typer.echo(escaped(f"{url} -> {path}"))
        return

    def on_size(repo: str, need: int | None, free: int) -> None:
        if not shared.quiet:
            what = size_cell(need) if need is not None else "size unknown"
            typer.echo(escaped(f"{repo}: {what} to fetch into {target} ({size_cell(free)} free)"), err=True)

    files = download_checkpoints(target, chosen, revision, progress=not shared.quiet,
                                 clip_revision=clip_revision, force=force, on_size=on_size)
    typer.echo(escaped(f"{len(files)} checkpoint files in {target} (models: {', '.join(m.value for m in chosen)})"))
    typer.echo(escaped(f"next: ootd checkpoints verify {target}"))


def _download_eval(force: bool, list_files: bool, quiet: bool) -> None:
    from ootd.evaluation.networks import require_stack
    from ootd.evaluation.weights import download_weights, standard_weights, weights_dir

    require_stack()  # the addresses are the eval extra's packages'
    if list_files:
        for item in standard_weights():
            typer.echo(escaped(f"{item.url} -> {weights_dir() / item.file}"))
        return

    def on_file(item: Any, path: Path) -> None:
        if not quiet:
            typer.echo(escaped(f"fetching {item.what} into {path}"), err=True)

    folder, fetched = download_weights(force, on_file)
    typer.echo(escaped(f"the metric weights are in {folder} ({len(fetched)} file(s) fetched now)"))
