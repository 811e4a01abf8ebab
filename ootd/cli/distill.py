"""`ootd train distill`: a few-step adapter from the model as loaded (docs/training.md, "Few-step adapters").

Thin, as `ootd train run` (ootd/cli/train.py), whose options it shares: they are read from that command's signature
(declared once there), with the distillation's own defaults; its own options are declared here.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from ootd.cli import train
from ootd.cli.errors import guarded_command
from ootd.cli.options import LOGGING_OPTIONS, choices, with_options
from ootd.errors import UsageError
from ootd.training.settings import DISTILL_SAMPLERS, DistillSettings
from ootd.weights.fewstep import MAX_FEW_STEPS
from ootd.weights.lora import MAX_LORA_SCALE

D = DistillSettings  # the defaults
DISTILL = "Distillation"
# `ootd train run`'s options a distillation takes as they are (not --dropout: the student always sees its garment;
# not --validation-steps: the sheets show the student at 1, 2, 4 and 8 steps beside the teacher at 20)
SHARED = ("steps", "epochs", "batch_size", "accumulation", "lr", "schedule", "warmup", "rank", "alpha",
          "train_garment", "seed", "mixed_precision", "gradient_checkpointing", "checkpoint_every", "validate_every",
          "validation_pairs", "resume", "explain", "engine", "workers", "gpus", "checkpoints", "device", "attention",
          "json_out")
_RUN = inspect.signature(train.run_command, eval_str=True).parameters
TRAIN_OPTIONS = {name: (_RUN[name].annotation, _RUN[name].default) for name in SHARED}

EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd train distill cache -o fast --steps 2000 --explain\n\n"
    "  ootd train distill cache -o fast --teacher-lora run/lora.safetensors   [dim]# your fine-tune[/dim]\n\n"
    "  ootd train distill cache -o fast --engine ray --workers 4\n\n"
    "  ootd run -m person.jpg -c shirt.jpg -k upper --lora fast/lora.safetensors   [dim]# 4 steps, its own[/dim]"
)


def _opt(*names: str, **kwargs: Any) -> Any:
    return typer.Option(*names, rich_help_panel=DISTILL, **kwargs)


@with_options(TRAIN_OPTIONS, LOGGING_OPTIONS, rank=D.rank, alpha=D.alpha)
@guarded_command
def distill_command(
    cache: Annotated[Path, typer.Argument(help="A cache made by `ootd train prepare`.", metavar="CACHE",
                                          show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", metavar="RUN", show_default=False,
                                         rich_help_panel=train.RUNS, help="The run folder: checkpoints, "
                                         "lora.safetensors (the few-step adapter), loss log, validation.")],
    guidance: Annotated[float, _opt("--guidance", metavar="W", help="The teacher's image guidance scale, which the "
                                    "student learns to give without a guidance pass.")] = D.guidance,
    ema_decay: Annotated[float, _opt("--ema-decay", metavar="D", help="The target network's EMA decay (0: the "
                                     "student itself, as LCM-LoRA).")] = D.ema_decay,
    huber_c: Annotated[float, _opt("--huber-c", metavar="C", help="The pseudo-Huber loss's c.")] = D.huber_c,
    sample_steps: Annotated[int, _opt("--sample-steps", metavar="N", help=f"The step count the adapter records "
                                      f"for try-ons (1 to {MAX_FEW_STEPS}).")] = D.sample_steps,
    sampler: Annotated[str, _opt("--sampler", metavar=choices(tuple(s.value for s in DISTILL_SAMPLERS)),
                                 help="The scheduler the adapter records and the sheets use.")] = D.sampler.value,
    teacher_lora: Annotated[Path | None, _opt("--teacher-lora", metavar="FILE", show_default=False,
                                              help="An `ootd train run` adapter merged into the teacher; "
                                              "RUN/lora.safetensors then holds it too.")] = None,
    teacher_lora_scale: Annotated[float, _opt("--teacher-lora-scale", metavar="S", help=f"How much of it, 0 to "
                                              f"{MAX_LORA_SCALE:g}.")] = 1.0,
    **options: Any,
) -> None:
    """Distil the model as loaded into a few-step adapter (latent consistency distillation, LoRA); the adapter is
    RUN/lora.safetensors, and `--lora` then samples with its own steps and scheduler."""
    from ootd.app.train.distill import DistillOptions
    from ootd.app.train.loop import check_mixed_precision
    from ootd.hardware.spec import check_device_spec
    from ootd.settings import AttentionName
    from ootd.weights.layout import default_checkpoints_dir
    from ootd.weights.lora import LoraChoice

    o = options
    settings = DistillSettings.from_words(
        steps=o["steps"], epochs=o["epochs"], batch_size=o["batch_size"], accumulation=o["accumulation"],
        learning_rate=o["lr"], schedule=o["schedule"], warmup=o["warmup"], rank=o["rank"], alpha=o["alpha"],
        train_garment=o["train_garment"], seed=o["seed"], mixed_precision=o["mixed_precision"],
        gradient_checkpointing=o["gradient_checkpointing"], checkpoint_every=o["checkpoint_every"],
        validate_every=o["validate_every"], validation_pairs=o["validation_pairs"], guidance=guidance,
        ema_decay=ema_decay, huber_c=huber_c, sample_steps=sample_steps, sampler=sampler)
    check_mixed_precision(settings.mixed_precision, o["device"])
    try:
        teacher = LoraChoice.parse(teacher_lora, teacher_lora_scale)
    except UsageError as exc:  # worded for --lora: the flags here are --teacher-lora and --teacher-lora-scale
        raise UsageError(str(exc).replace("--lora", "--teacher-lora")) from None
    chosen = DistillOptions(cache, output, o["checkpoints"] or default_checkpoints_dir(), settings,
                            check_device_spec(o["device"]), AttentionName.parse(o["attention"], "attention backend"),
                            o["resume"], teacher)
    train.run_training(chosen, o["engine"], o["workers"], o["gpus"], explain=o["explain"], json_out=o["json_out"],
                       quiet=o["quiet"])
