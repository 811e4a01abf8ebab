"""The `ootd` command: a thin front end over ootd/app (options -> RunConfig -> pipeline -> try-on -> files).

    errors.py       one-line errors and exit codes, logging per -v/-q, the click group
    options.py      the settings' options (derived from ootd/app/tryon/settings.py) and the logging ones
    display.py      progress bars, JSON, tables
    run.py, batch.py, mask.py, classify.py, download.py, checkpoints.py, doctor.py, bench.py, serve.py, compare.py,
    eval.py, train.py, distill.py (`ootd train distill`), comfyui.py: one module per command

Heavy modules (torch, diffusers) are imported only inside the commands that need them, so --help is instant.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ootd import __version__
from ootd.cli import (
    batch,
    bench,
    checkpoints,
    classify,
    comfyui,
    compare,
    distill,
    doctor,
    download,
    eval,
    mask,
    run,
    serve,
    train,
)
from ootd.cli.errors import OotdGroup

HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    cls=OotdGroup,
    name="ootd",
    help="Virtual try-on (OOTDiffusion) on ROCm, CUDA, Apple MPS and the CPU: person photo + garment photo -> "
         "photos of that person wearing that garment.",
    epilog="Start with `ootd download`, then `ootd doctor`, then `ootd run --help`. Exit codes: 0 ok, 1 failure, "
           "2 usage error, 3 a setting this machine cannot run, 130 interrupted, 143 terminated.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings=HELP_OPTIONS,
)
checkpoints_app = typer.Typer(help="Inspect the checkpoints folder.", no_args_is_help=True, rich_markup_mode="rich",
                              context_settings=HELP_OPTIONS, epilog=checkpoints.GROUP_EPILOG)
app.add_typer(checkpoints_app, name="checkpoints")
train_app = typer.Typer(help="Fine-tune the try-on model on your own pairs (LoRA): prepare, run, bench; distil it "
                        "into a few-step adapter.",
                        no_args_is_help=True, rich_markup_mode="rich", context_settings=HELP_OPTIONS)
app.add_typer(train_app, name="train")
comfyui_app = typer.Typer(help=comfyui.GROUP_HELP, no_args_is_help=True, rich_markup_mode="rich",
                          context_settings=HELP_OPTIONS)
app.add_typer(comfyui_app, name="comfyui")

app.command("run", epilog=run.EPILOG)(run.run_command)
app.command("batch", epilog=batch.EPILOG)(batch.batch_command)
app.command("mask", epilog=mask.EPILOG)(mask.mask_command)
app.command("classify", epilog=classify.EPILOG)(classify.classify_command)
app.command("download", epilog=download.EPILOG)(download.download_command)
checkpoints_app.command("verify", epilog=checkpoints.VERIFY_EPILOG)(checkpoints.verify_command)
app.command("doctor", epilog=doctor.EPILOG)(doctor.doctor_command)
app.command("bench", epilog=bench.EPILOG)(bench.bench_command)
app.command("serve", epilog=serve.EPILOG)(serve.serve_command)
app.command("compare", epilog=compare.EPILOG)(compare.compare_command)
app.command("eval", epilog=eval.EPILOG)(eval.eval_command)
train_app.command("prepare", epilog=train.PREPARE_EPILOG)(train.prepare_command)
train_app.command("run", epilog=train.RUN_EPILOG)(train.run_command)
train_app.command("bench")(train.bench_command)
train_app.command("distill", epilog=distill.EPILOG)(distill.distill_command)
comfyui_app.command("install", epilog=comfyui.EPILOG)(comfyui.install_command)
comfyui_app.command("uninstall", epilog=comfyui.EPILOG)(comfyui.uninstall_command)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"ootd {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.",
                                          callback=_version_callback, is_eager=True)] = False,
) -> None:
    """Virtual try-on (OOTDiffusion): person photo + garment photo -> try-on photos."""


def main(argv: list[str] | None = None) -> None:
    """Console entry point (`ootd`, `python -m ootd`)."""
    app(args=argv, prog_name="ootd")
