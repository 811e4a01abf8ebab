"""`ootd train distill`: a few-step adapter from the model as loaded (docs/training.md, "Few-step adapters").

Thin, as `ootd train run` (ootd/cli/train.py), whose options it shares: its settings are that command's
(`train.TRAIN_OPTIONS`, with the distillation's defaults) and the distillation's own, declared here, each named as
its DistillSettings field, so `DistillSettings.from_words` takes them as they are and its errors name the flags
here; the run's other options are `ootd train run`'s (`train.RUN_CHOICES`), taken apart as `train.RunChoices`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ootd.cli import train
from ootd.cli.errors import guarded_command
from ootd.cli.options import (
    LOGGING_OPTIONS,
    Shared,
    choices,
    with_options,
)
from ootd.settings import EngineName
from ootd.training.settings import DISTILL_SAMPLERS, DistillSettings
from ootd.weights.fewstep import MAX_FEW_STEPS
from ootd.weights.lora import MAX_LORA_SCALE

D = DistillSettings  # the defaults
DISTILL = "Distillation"
# `ootd train run`'s settings a distillation takes as they are (not dropout: the student always sees its garment;
# not validation_steps: the sheets show the student at 1, 2, 4 and 8 steps beside the teacher at 20), with the
# distillation's defaults
RUN_SETTINGS = {name: (option, getattr(D, name, default)) for name, (option, default) in train.TRAIN_OPTIONS.items()
                if name not in ("dropout", "validation_steps")}


def _setting(flag: str, default: Any, help: str, *, kind: Any = float, **kwargs: Any) -> tuple[Any, Any]:
    return Annotated[kind, typer.Option(flag, rich_help_panel=DISTILL, help=help, **kwargs)], default


# the distillation's own settings: DistillSettings' fields
DISTILL_OPTIONS: dict[str, tuple[Any, Any]] = {
    "guidance": _setting("--guidance", D.guidance, "The teacher's image guidance scale, which the student learns "
                         "to give without a guidance pass.", metavar="W"),
    "ema_decay": _setting("--ema-decay", D.ema_decay, "The target network's EMA decay (0: the student itself, as "
                          "LCM-LoRA).", metavar="D"),
    "huber_c": _setting("--huber-c", D.huber_c, "The pseudo-Huber loss's c.", metavar="C"),
    "sample_steps": _setting("--sample-steps", D.sample_steps, f"The step count the adapter records for try-ons "
                             f"(1 to {MAX_FEW_STEPS}).", kind=int, metavar="N"),
    "sampler": _setting("--sampler", D.sampler.value, "The scheduler the adapter records and the sheets use.",
                        kind=str, metavar=choices(tuple(s.value for s in DISTILL_SAMPLERS))),
}

EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd train distill cache -o fast --steps 2000 --explain\n\n"
    "  ootd train distill cache -o fast --teacher-lora run/lora.safetensors   [dim]# your fine-tune[/dim]\n\n"
    "  ootd train distill cache -o fast --engine ray --workers 4\n\n"
    "  ootd run -m person.jpg -c shirt.jpg -k upper --lora fast/lora.safetensors   [dim]# 4 steps, its own[/dim]"
)


def _opt(*names: str, **kwargs: Any) -> Any:
    return typer.Option(*names, rich_help_panel=DISTILL, **kwargs)


@guarded_command
@with_options(train.RUN_CHOICES, RUN_SETTINGS, DISTILL_OPTIONS, LOGGING_OPTIONS)
def distill_command(
    cache: train.CacheArg,
    output: Annotated[Path, typer.Option("--output", "-o", metavar="RUN", show_default=False,
                                         rich_help_panel=train.RUNS, help="The run folder: checkpoints, "
                                         "lora.safetensors (the few-step adapter), loss log, validation.")],
    teacher_lora: Annotated[Path | None, _opt("--teacher-lora", metavar="FILE", show_default=False,
                                              help="An `ootd train run` adapter merged into the teacher; "
                                              "RUN/lora.safetensors then holds it too.")] = None,
    teacher_lora_scale: Annotated[float, _opt("--teacher-lora-scale", metavar="S", help=f"How much of it, 0 to "
                                              f"{MAX_LORA_SCALE:g}.")] = 1.0,
    *,
    shared: Shared,
) -> None:
    """Distil the model as loaded into a few-step adapter (latent consistency distillation, LoRA); the adapter is
    RUN/lora.safetensors, and `--lora` then samples with its own steps and scheduler."""
    from ootd.app.train.distill import DistillOptions
    from ootd.app.train.loop import check_mixed_precision
    from ootd.hardware.spec import check_device_spec
    from ootd.settings import AttentionName
    from ootd.weights.layout import default_checkpoints_dir
    from ootd.weights.lora import LoraChoice

    run, words = train.RunChoices.split(shared)
    settings = DistillSettings.from_words(**words)
    chosen_engine = EngineName.parse(run.engine, "engine")
    check_mixed_precision(settings.mixed_precision, run.device)
    teacher = LoraChoice.parse(teacher_lora, teacher_lora_scale, names=("teacher_lora", "teacher_lora_scale"))
    chosen = DistillOptions(cache, output, run.checkpoints or default_checkpoints_dir(), settings,
                            check_device_spec(run.device), AttentionName.parse(run.attention, "attention backend"),
                            run.resume, teacher)
    train.run_training(chosen, chosen_engine, run, quiet=shared.quiet)
