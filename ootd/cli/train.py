"""`ootd train prepare | run | bench`: fine-tune the try-on model on your own pairs with LoRA (docs/training.md).

Thin: the options, declared once here with their defaults from ootd/training/settings.py, become checked option
objects; ootd/app/train does the work; this prints the summary. `ootd train distill` (distill.py) takes the
run's options from here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any

import typer

from ootd.cli.display import Display, print_json, show_progress
from ootd.cli.errors import guarded_command
from ootd.cli.options import (
    LOGGING_OPTIONS,
    AttentionOpt,
    CheckpointsOpt,
    DeviceOpt,
    FitOpt,
    JsonOpt,
    ModelTypeOpt,
    ProviderOpt,
    ResolutionOpt,
    Shared,
    choices,
    with_options,
)
from ootd.settings import EngineName, FitMode
from ootd.training.settings import LrSchedule, MixedPrecision, TrainSettings

D = TrainSettings  # the defaults
TRAIN, RUNS, DATA = "Training", "Checkpoints and validation", "Data"

PREPARE_EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd train prepare VITON-HD/train -o cache --split 0.05\n\n"
    "  ootd train prepare DressCode -o cache-dc --resolution 384x512\n\n"
    "  ootd train prepare pairs.csv -o cache --split 0.1   [dim]# person,garment,category[,mask][/dim]"
)
RUN_EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd train run cache -o run --steps 2000 --explain\n\n"
    "  ootd train run cache -o run --resume\n\n"
    "  ootd train run cache -o run --engine ray --workers 4 --batch-size 4\n\n"
    "  ootd run -m person.jpg -c shirt.jpg -k upper --lora run/lora.safetensors --lora-scale 0.8"
)


def _opt(*names: str, panel: str, **kwargs: Any) -> Any:
    return typer.Option(*names, rich_help_panel=panel, **kwargs)


@guarded_command
@with_options(LOGGING_OPTIONS)
def prepare_command(
    data: Annotated[Path, typer.Argument(help="A VITON-HD-style folder, a Dress Code-style folder or a pairs CSV.",
                                         metavar="DATA", show_default=False)],
    output: Annotated[Path, _opt("--output", "-o", panel=DATA, metavar="CACHE", show_default=False,
                                 help="The cache folder (created; a rerun resumes it).")],
    checkpoints: CheckpointsOpt = None,
    model_type: ModelTypeOpt = None,
    resolution: ResolutionOpt = "768x1024",
    fit: FitOpt = FitMode.PAD.value,
    split: Annotated[float, _opt("--split", panel=DATA, metavar="FRACTION",
                                 help="Hold out this fraction of the people for validation (0: none).")] = 0.0,
    seed: Annotated[int, _opt("--seed", panel=DATA, metavar="N", help="Which people are held out.")] = 0,
    pairs: Annotated[Path | None, _opt("--pairs", panel=DATA, metavar="FILE", show_default=False,
                                       help="A VITON-HD folder's pairs list (default: train_pairs.txt).")] = None,
    device: DeviceOpt = None,
    parsing_provider: ProviderOpt = "cpu",
    json_out: JsonOpt = False,
    *,
    shared: Shared,
) -> None:
    """Prepare training pairs once: masks, latents and prompt embeddings into a cache every epoch reads."""
    from ootd.app.train.prepare import PrepareOptions, prepare, prepare_models
    from ootd.settings import ModelType, parse_resolution
    from ootd.weights.layout import default_checkpoints_dir

    chosen = PrepareOptions(data, output, checkpoints or default_checkpoints_dir(),
                            ModelType.parse(model_type) if model_type else None, parse_resolution(resolution),
                            FitMode.parse(fit, "fit mode"), split, seed, pairs, device, parsing_provider)
    with Display(show_progress(shared.quiet, json_out)) as display:
        report = prepare(chosen, progress=display, models=prepare_models(chosen))
        for problem in report.problems:
            display.print(f"skipped {problem}")
        for duplicate in report.duplicates:
            display.print(f"duplicate {duplicate}")
    index = report.index
    summary = {"cache": str(output), "layout": report.layout, "model_type": index.model_type,
               "resolution": index.resolution, "prepared": report.prepared, "reused": report.reused,
               "train": len(index.split("train")), "val": len(index.split("val")), "skipped": report.problems,
               "duplicates": report.duplicates}
    if json_out:
        print_json(summary)
        return
    duplicates = f", duplicates {len(report.duplicates)}" if report.duplicates else ""
    typer.echo(f"{output}: {summary['train']} training and {summary['val']} held-out pairs ({report.layout}, "
               f"{index.model_type}, {index.resolution}); prepared {report.prepared}, already there "
               f"{report.reused}{duplicates}, skipped {len(report.problems)}")


def _train_opt(flag: str, default: Any, help: str, *, kind: Any = int, panel: str = TRAIN,
               **kwargs: Any) -> tuple[Any, Any]:
    return Annotated[kind, _opt(flag, panel=panel, help=help, **kwargs)], default


# TrainSettings' fields as `ootd train run` takes them (named as the fields, so `TrainSettings.from_words` takes
# them as they are and its errors name the flags here), defaults from TrainSettings
TRAIN_OPTIONS: dict[str, tuple[Any, Any]] = {
    "steps": _train_opt("--steps", D.steps, "Optimizer steps.", metavar="N"),
    "epochs": _train_opt("--epochs", None, "Passes over the training pairs instead of --steps.", kind=int | None,
                         metavar="N", show_default=False),
    "batch_size": _train_opt("--batch-size", D.batch_size, "Pairs per forward pass (per worker).", metavar="N"),
    "accumulation": _train_opt("--accumulation", D.accumulation, "Forward passes per optimizer step.",
                               metavar="N"),
    "learning_rate": _train_opt("--lr", D.learning_rate, "Learning rate (AdamW).", kind=float),
    "schedule": _train_opt("--schedule", D.schedule.value, "Learning-rate schedule after the warm-up.", kind=str,
                           metavar=choices(LrSchedule)),
    "warmup": _train_opt("--warmup", D.warmup, "Warm-up steps.", metavar="N"),
    "rank": _train_opt("--rank", D.rank, "LoRA rank.", metavar="R"),
    "alpha": _train_opt("--alpha", D.alpha, "LoRA alpha (scale alpha/rank).", kind=float),
    "train_garment": _train_opt("--train-garment/--no-train-garment", D.train_garment,
                                "Also adapt the garment UNet.", kind=bool),
    "dropout": _train_opt("--dropout", D.dropout, "Outfitting dropout (the paper's 0.1).", kind=float,
                          metavar="P"),
    "seed": _train_opt("--seed", D.seed, "Seed of the adapter, order, noise.", metavar="N"),
    "mixed_precision": _train_opt("--mixed-precision", D.mixed_precision.value, "bf16/fp16 where the device "
                                  "profile allows.", kind=str, metavar=choices(MixedPrecision)),
    "gradient_checkpointing": _train_opt("--gradient-checkpointing", D.gradient_checkpointing, "Recompute "
                                         "activations in the backward: less memory, slower steps.", kind=bool),
    "checkpoint_every": _train_opt("--checkpoint-every", D.checkpoint_every, "Steps between checkpoints.",
                                   panel=RUNS, metavar="N"),
    "validate_every": _train_opt("--validate-every", D.validate_every, "Steps between validation sheets (0: at "
                                 "the end).", panel=RUNS, metavar="N"),
    "validation_steps": _train_opt("--validation-steps", D.validation_steps, "Denoising steps of a validation "
                                   "try-on.", panel=RUNS, metavar="N"),
    "validation_pairs": _train_opt("--validation-pairs", D.validation_pairs, "Held-out pairs per sheet.",
                                   panel=RUNS, metavar="N"),
}


@dataclass(frozen=True)
class RunChoices:
    """The options of a run that are not its settings, as typed (their defaults are RUN_CHOICES'): `split` takes
    them out of a command's shared options and leaves the settings' words."""

    resume: bool = False
    explain: bool = False
    engine: str = "local"
    workers: int = 2
    gpus: bool = False
    checkpoints: Path | None = None
    device: str | None = None
    attention: str = "auto"
    json_out: bool = False

    @classmethod
    def split(cls, shared: Shared) -> tuple[RunChoices, dict[str, Any]]:
        """(these options, the settings' words) of `shared`."""
        names = {one.name for one in fields(cls)}
        return (cls(**{name: word for name, word in shared.words.items() if name in names}),
                {name: word for name, word in shared.words.items() if name not in names})


R = RunChoices()  # the defaults
CacheArg = Annotated[Path, typer.Argument(help="A cache made by `ootd train prepare`.", metavar="CACHE",
                                          show_default=False)]
# the options of a run that are not its settings, as `ootd train run` and `ootd train distill` take them (after
# their own parameters, before the settings)
RUN_CHOICES: dict[str, tuple[Any, Any]] = {
    "resume": (Annotated[bool, _opt("--resume", panel=RUNS, help="Continue RUN from its latest checkpoint.")],
               R.resume),
    "explain": (Annotated[bool, _opt("--explain", panel=RUNS, help="Print the device and memory estimate first.")],
                R.explain),
    "engine": (Annotated[str, _opt("--engine", panel=TRAIN, metavar=choices(EngineName),
                                   help="local, or ray: data-parallel over Ray Train (the ray-train extra).")],
               R.engine),
    "workers": (Annotated[int, _opt("--workers", panel=TRAIN, metavar="N", help="Ray Train workers.")], R.workers),
    "gpus": (Annotated[bool, _opt("--gpus/--no-gpus", panel=TRAIN, help="A GPU per Ray worker.")], R.gpus),
    "checkpoints": (CheckpointsOpt, R.checkpoints),
    "device": (DeviceOpt, R.device),
    "attention": (AttentionOpt, R.attention),
    "json_out": (JsonOpt, R.json_out),
}


@guarded_command
@with_options(RUN_CHOICES, TRAIN_OPTIONS, LOGGING_OPTIONS)
def run_command(
    cache: CacheArg,
    output: Annotated[Path, _opt("--output", "-o", panel=RUNS, metavar="RUN", show_default=False,
                                 help="The run folder: checkpoints, lora.safetensors, loss log, validation.")],
    *,
    shared: Shared,
) -> None:
    """Fine-tune LoRA adapters on a prepared cache; the adapter is RUN/lora.safetensors (use it with --lora)."""
    from ootd.app.train.loop import TrainOptions, check_mixed_precision
    from ootd.hardware.spec import check_device_spec
    from ootd.settings import AttentionName
    from ootd.weights.layout import default_checkpoints_dir

    run, words = RunChoices.split(shared)
    settings = TrainSettings.from_words(**words)
    chosen_engine = EngineName.parse(run.engine, "engine")
    check_mixed_precision(settings.mixed_precision, run.device)
    train = TrainOptions(cache, output, run.checkpoints or default_checkpoints_dir(), settings,
                         check_device_spec(run.device), AttentionName.parse(run.attention, "attention backend"),
                         run.resume)
    run_training(train, chosen_engine, run, quiet=shared.quiet)


def run_training(train: Any, engine: EngineName, run: RunChoices, *, quiet: bool) -> None:
    """A fine-tune's or a distillation's run (`train`: its checked options) on the engine asked for, and its
    summary: one line, or --json."""
    explain = run.explain and not run.json_out
    with Display(show_progress(quiet, run.json_out)) as display:
        if engine is EngineName.RAY:
            from ootd.app.train.ray_engine import train_ray

            report = train_ray(train, run.workers, run.gpus, explain=explain, echo=display.print)
        else:
            report = _train_local(train, explain, display)
    _run_summary(report, train.output, run.json_out)


def _run_summary(report: Any, output: Path, json_out: bool) -> None:
    """What a run ends with: the adapter, the steps, the loss, the last validation, and why there is no
    loss.png where there is none."""
    from ootd.app.train.logs import plot_unavailable

    plot = output / "loss.png"
    summary = {"run": str(output), "adapter": str(report.adapter), "steps": report.steps,
               "from_step": report.first_step, "loss_first": report.losses[0] if report.losses else None,
               "loss_last": report.losses[-1] if report.losses else None, "validation": report.validation,
               "loss_plot": str(plot) if plot.is_file() else None, "no_loss_plot": plot_unavailable(),
               "seconds": round(report.seconds, 2)}
    if json_out:
        print_json(summary)
        return
    typer.echo(f"{report.adapter}: {report.steps} steps (from {report.first_step}) in {report.seconds:.1f} s"
               + (f", loss {report.losses[0]:.4f} -> {report.losses[-1]:.4f}" if report.losses else ""))
    if summary["no_loss_plot"]:
        typer.echo(summary["no_loss_plot"])
    if report.validation:
        last = report.validation[-1]
        scores = (f"SSIM to the teacher at 20 steps, by student steps: {last['ssim_to_teacher']}"
                  if "ssim_to_teacher" in last else f"SSIM {last['ssim_mean']}")
        typer.echo(f"validation at step {last['step']}: {scores} ({output}/validation/{last['sheet']})")


def _train_local(train: Any, explain: bool, display: Display) -> Any:
    from ootd.app.train.loop import load_trainable, train_local, training_models
    from ootd.app.train.plan import explain_lines
    from ootd.settings import parse_resolution
    from ootd.training.cache import read_index

    index = read_index(train.cache)
    models = load_trainable(train, index, training_models(train))  # this process's model owner
    if explain:
        for line in explain_lines(models, parse_resolution(index.resolution), train.settings):
            display.print(line)
    return train_local(train, progress=display, models=models, index=index)


@guarded_command
@with_options(LOGGING_OPTIONS)
def bench_command(
    random_weights: Annotated[str, _opt("--random-weights", panel=TRAIN, metavar="[full|tiny]",
                                        help="The released architectures (full) or the test ones (tiny).")] = "full",
    resolution: ResolutionOpt = "384x512",
    batch_size: Annotated[int, _opt("--batch-size", panel=TRAIN, metavar="N", help="Pairs per step.")] = 1,
    gradient_checkpointing: Annotated[bool, _opt("--gradient-checkpointing", panel=TRAIN,
                                                 help="Recompute activations in the backward.")] = False,
    train_garment: Annotated[bool, _opt("--train-garment", panel=TRAIN, help="Also adapt the garment UNet.")
                             ] = False,
    steps: Annotated[int, _opt("--steps", panel=TRAIN, metavar="N", help="Steps to time.")] = 3,
    distill: Annotated[bool, _opt("--distill", panel=TRAIN, help="Time `ootd train distill`'s step instead (its "
                                  "defaults: rank 64, a target network).")] = False,
    *,
    shared: Shared,
) -> None:
    """Seconds per training step and peak memory on this CPU, random weights, one configuration per run."""
    from ootd.settings import parse_resolution
    from ootd.tools.bench.training import bench_training
    from ootd.training.settings import DistillSettings

    kind = DistillSettings if distill else TrainSettings
    settings = kind.from_words(batch_size=batch_size, gradient_checkpointing=gradient_checkpointing,
                               train_garment=train_garment)
    print_json(bench_training(random_weights, parse_resolution(resolution), settings, steps).to_json())
