"""Every option more than one command takes, declared once, with defaults read from RunConfig/SamplingSettings
and choices from the enums in ootd/settings.py.

`with_options(RUN_OPTIONS, LOGGING_OPTIONS)` adds the declared options to a command's signature (typer reads
`__signature__`), so a command states only its own parameters and receives the shared ones in `**options`;
`config_from(options)` turns them into a validated RunConfig. A new sampling option: a field in SamplingSettings,
its word in `ootd.app.tryon.config.build_config`, and one entry here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ootd.app.console import echo_err
from ootd.app.tryon.config import RunConfig, build_config
from ootd.app.tryon.naming import NAME_FIELDS
from ootd.hardware.spec import ENV_DEVICE
from ootd.settings import (
    AUTO_CATEGORY,
    DEFAULT_FEATHER,
    FEATHER_HEIGHT,
    MAX_FEATHER,
    MAX_THREADS,
    AttentionName,
    Category,
    Choice,
    FitMode,
    ModelType,
    OutputSize,
    ParsingProvider,
    PrecisionName,
    QuantizeName,
    SamplingSettings,
    SchedulerName,
    SpeedPreset,
)
from ootd.speedups.modes import FeatureCache, TokenMerge
from ootd.weights.lora import MAX_LORA_SCALE, LoraChoice, read_choice

SAMPLING = "Sampling"
HARDWARE = "Hardware"
INPUTS = "Inputs"
OUTPUTS = "Outputs"
LOGGING = "Logging"


def choices(words: type[Choice] | tuple[str, ...]) -> str:
    """`[pad|crop|stretch]`: the metavar that shows every valid word."""
    listed = words.words() if isinstance(words, type) else words
    return f"[{'|'.join(listed)}]"


def _opt(*names: str, panel: str, default_shown: bool = True, **kwargs: Any) -> Any:
    return typer.Option(*names, rich_help_panel=panel, show_default=default_shown, **kwargs)


MODEL_TYPES = tuple(m.value for m in ModelType)
CATEGORY_METAVAR = choices((*(c.value for c in Category), AUTO_CATEGORY))  # run's and batch's --category

ModelTypeOpt = Annotated[str | None, _opt(
    "--model-type", metavar=choices(MODEL_TYPES), panel=INPUTS, default_shown=False,
    help="hd (half-body, upper only) or dc (full-body). Default: hd for upper, dc otherwise.")]
CheckpointsOpt = Annotated[Path | None, _opt(
    "--checkpoints", panel=INPUTS, default_shown=False, metavar="DIR",
    help="Checkpoints folder. Default: $OOTD_CHECKPOINTS, else ./checkpoints if it exists, else the per-user "
         "folder `ootd download` fills.")]
FitOpt = Annotated[str, _opt("--fit", metavar=choices(FitMode), panel=INPUTS, help="Framing of non-3:4 photos.")]
MaskGrowOpt = Annotated[int, _opt("--mask-grow", panel=INPUTS, metavar="N",
                                   help="Grow the mask by N pixels (at 512 px height).")]
SamplesOpt = Annotated[int, _opt("--samples", "-n", panel=SAMPLING, metavar="N",
                                  help="Images per pair, each from its own noise.")]
StepsOpt = Annotated[int | None, _opt("--steps", panel=SAMPLING, metavar="N", default_shown=False, help=(
    f"Denoising steps. Default: {SamplingSettings.steps}, or a few-step adapter's own (--lora)."))]
ScaleOpt = Annotated[float | None, _opt("--scale", panel=SAMPLING, default_shown=False, help=(
    f"Image guidance scale (off below 1.0). Default: {SamplingSettings.guidance_scale:g}, or a few-step "
    "adapter's own (guidance off)."))]
SeedOpt = Annotated[int | None, _opt("--seed", panel=SAMPLING, default_shown=False, metavar="N",
                                     help="Random seed; drawn at random (and printed) when absent.")]
ResolutionOpt = Annotated[str, _opt("--resolution", panel=SAMPLING, metavar="WxH",
                                    help="Working resolution, width x height: 384x512 or 768x1024.")]
SchedulerOpt = Annotated[str | None, _opt("--scheduler", metavar=choices(SchedulerName), panel=SAMPLING,
                                          default_shown=False, help=(
    f"Sampler. Default: {SamplingSettings.scheduler.value} (the original's), or a few-step adapter's own (lcm or "
    "tcd: consistency sampling, 1 to 50 steps)."))]
SPEED = "Speed (exact by default; the modes change the images: judge them with `ootd compare`)"
SpeedOpt = Annotated[str | None, _opt(
    "--speed", metavar=choices(SpeedPreset), panel=SPEED, default_shown=False,
    help="exact (default): the method as published. fast: token merging 0.5 and feature caching every 3rd step "
         "(each option below overrides it). Precision is separate: see --precision.")]
CacheIntervalOpt = Annotated[int | None, _opt(
    "--cache-interval", metavar="N", panel=SPEED, default_shown=False,
    help=f"Recompute the try-on UNet's deep levels only every N-th step and reuse them in between (DeepCache-style "
         f"feature caching), 1 to {FeatureCache.MAX}. 1 = exact.")]
TokenMergeOpt = Annotated[float | None, _opt(
    "--token-merge", metavar="RATIO", panel=SPEED, default_shown=False,
    help=f"Merge this fraction of the person tokens in the finest self-attention level (ToMe), 0 to "
         f"{TokenMerge.MAX}; the garment tokens stay whole. 0 = exact.")]
QuantizeOpt = Annotated[str | None, _opt(
    "--quantize", metavar=choices(QuantizeName), panel=SPEED, default_shown=False,
    help="Quantize the UNets' linear layers (needs the `quant` extra): int8-dynamic on CPUs, int8-weight or fp8 "
         "on GPUs that have them. none = exact.")]
PrecisionOpt = Annotated[str, _opt("--precision", metavar=choices(PrecisionName), panel=HARDWARE,
                                   help="auto: fp32 on CPU (bf16 on CPUs with bf16 matrix units: AVX512-BF16, AMX, "
                                        "Arm BF16), the device profile's choice on GPUs.")]
AttentionOpt = Annotated[str, _opt("--attention", metavar=choices(AttentionName), panel=HARDWARE,
                                   help="Attention backend.")]
DeviceOpt = Annotated[str | None, _opt("--device", envvar=ENV_DEVICE, panel=HARDWARE, default_shown=False,
                                       metavar="DEVICE",
                                       help="cpu, cuda, cuda:N (also ROCm) or mps. Default: the best available.")]
MaxMemoryOpt = Annotated[str | None, _opt(
    "--max-memory", panel=HARDWARE, default_shown=False, metavar="SIZE",
    help="Memory a try-on may use, e.g. 20GiB (default: free device memory less a margin).")]
ChannelsLastOpt = Annotated[bool | None, _opt(
    "--channels-last/--no-channels-last", panel=HARDWARE, default_shown=False,
    help="Run the UNets and the VAE in channels_last memory layout: 4-5% faster steps on the CPU, slightly less "
         "precise (default: the device profile's choice, off everywhere).")]
CompileOpt = Annotated[bool | None, _opt(
    "--compile/--no-compile", panel=HARDWARE, default_shown=False,
    help="torch.compile the try-on UNet: the first call compiles for minutes; then each step may be faster "
         "(measure with ootd bench). Default: the device profile's choice, off everywhere.")]
ThreadsOpt = Annotated[int | None, _opt(
    "--threads", metavar="N", panel=HARDWARE, default_shown=False,
    help="CPU threads of torch and ONNX Runtime, 1 to " + str(MAX_THREADS) + ". Default: this machine's as torch "
         "counts them (physical cores, or $OMP_NUM_THREADS), fixed when the command starts and applied by every "
         "engine's processes (Ray workers too), so the same command gives the same bytes on either engine.")]
ProviderOpt = Annotated[str, _opt(
    "--parsing-provider", metavar=choices(ParsingProvider), panel=HARDWARE,
    help="ONNX Runtime provider for human parsing: cpu (as the original) or auto (MIGraphX, ROCm, CUDA, then "
         "CPU).")]
OutputOpt = Annotated[Path, _opt("--output", "-o", panel=OUTPUTS, metavar="DIR",
                                 help="Output folder (created if needed).")]
IntermediatesOpt = Annotated[bool, _opt(
    "--save-intermediates", panel=OUTPUTS,
    help="Also save the pose skeleton, parsing colour map, mask and masked person.")]
NameOpt = Annotated[str, _opt(
    "--name", metavar="TEMPLATE", panel=OUTPUTS,
    help="Output file names (without .png); must hold {i}. Fields: "
         + ", ".join(f"{{{field}}} {meaning}" for field, meaning in NAME_FIELDS.items()) + ".")]
GridOpt = Annotated[bool, _opt("--grid", panel=OUTPUTS, help="Also write a contact sheet: person | garment | mask | "
                               "samples in one PNG ({i} = grid in --name).")]
OverwriteOpt = Annotated[bool, _opt("--overwrite", panel=OUTPUTS, help="Replace existing output files.")]
JsonOpt = Annotated[bool, _opt("--json", panel=OUTPUTS, help="Print a machine-readable JSON summary on stdout.")]
CategoryMarginOpt = Annotated[float, _opt(
    "--category-margin", panel=INPUTS, metavar="P",
    help="--category auto refuses a garment whose likeliest category leads the second by less than this "
         "probability (0 to 1; docs/categories.md).")]
LoraOpt = Annotated[Path | None, _opt(
    "--lora", panel=INPUTS, default_shown=False, metavar="FILE",
    help="A LoRA adapter `ootd train run` wrote (RUN/lora.safetensors), merged into the models.")]
LoraScaleOpt = Annotated[float, _opt("--lora-scale", panel=INPUTS, metavar="S",
                                     help=f"How much of the adapter: 0 (the base model) to {MAX_LORA_SCALE:g}.")]
VerboseOpt = Annotated[bool, _opt("--verbose", "-v", panel=LOGGING, help="Debug logging (also library warnings).")]
QuietOpt = Annotated[bool, _opt("--quiet", "-q", panel=LOGGING, help="No progress display, errors only.")]
DebugOpt = Annotated[bool, _opt("--debug", panel=LOGGING, help="Print tracebacks for errors.")]

OutputSizeOpt = Annotated[str | None, _opt(
    "--output-size", metavar=choices(OutputSize), panel=OUTPUTS, default_shown=False,
    help="working (default): the pictures at --resolution, as the method makes them; photo: the whole generated "
         "picture at the photo's own size and framing.")]
KeepUnmaskedOpt = Annotated[bool, _opt(
    "--keep-unmasked", panel=OUTPUTS,
    help="Give back the photo itself, at its own size, with only the garment's region replaced: every pixel "
         "outside the feathered mask is the photo's (docs/commands.md).")]
FeatherOpt = Annotated[int | None, _opt(
    "--feather", metavar="N", panel=OUTPUTS, default_shown=False,
    help=f"--keep-unmasked: blend over N pixels (of a {FEATHER_HEIGHT} px high picture, scaled to the photo) on each "
         f"side of the mask's edge, 0 to {MAX_FEATHER}. Default {DEFAULT_FEATHER}.")]

# name -> (declaration, default). The names are build_config's keywords.
RUN_OPTIONS: dict[str, tuple[Any, Any]] = {
    "model_type": (ModelTypeOpt, None),
    "fit": (FitOpt, RunConfig.fit.value),
    "mask_grow": (MaskGrowOpt, RunConfig.mask_grow),
    "checkpoints": (CheckpointsOpt, None),
    "samples": (SamplesOpt, SamplingSettings.num_samples),
    "steps": (StepsOpt, None),  # None: SamplingSettings' default or a few-step adapter's (build_config)
    "scale": (ScaleOpt, None),
    "seed": (SeedOpt, SamplingSettings.seed),
    "resolution": (ResolutionOpt, str(SamplingSettings.resolution)),
    "scheduler": (SchedulerOpt, None),
    "speed": (SpeedOpt, None),
    "cache_interval": (CacheIntervalOpt, None),
    "token_merge": (TokenMergeOpt, None),
    "quantize": (QuantizeOpt, None),
    "precision": (PrecisionOpt, RunConfig.precision.value),
    "attention": (AttentionOpt, RunConfig.attention.value),
    "device": (DeviceOpt, RunConfig.device),
    "max_memory": (MaxMemoryOpt, None),
    "channels_last": (ChannelsLastOpt, None),
    "compile": (CompileOpt, None),
    "parsing_provider": (ProviderOpt, RunConfig.parsing_provider.value),
    "threads": (ThreadsOpt, None),
    "output": (OutputOpt, RunConfig.output),
    "save_intermediates": (IntermediatesOpt, RunConfig.save_intermediates),
    "overwrite": (OverwriteOpt, RunConfig.overwrite),
    "name": (NameOpt, RunConfig.name_template),
    "category_margin": (CategoryMarginOpt, RunConfig.category_margin),
    "lora": (LoraOpt, None),
    "lora_scale": (LoraScaleOpt, LoraChoice.scale),
    "output_size": (OutputSizeOpt, None),
    "keep_unmasked": (KeepUnmaskedOpt, False),
    "feather": (FeatherOpt, None),
}
LOGGING_OPTIONS: dict[str, tuple[Any, Any]] = {
    "verbose": (VerboseOpt, False), "quiet": (QuietOpt, False), "debug": (DebugOpt, False),
}


def with_options(*groups: dict[str, tuple[Any, Any]], **defaults: Any) -> Callable[[Callable], Callable]:
    """Add the options of `groups` to a command (after its own parameters, which win on a name clash);
    `defaults` overrides a shared option's default for this command."""

    def decorate(fn: Callable) -> Callable:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values()
               if p.kind is not inspect.Parameter.VAR_KEYWORD]
        taken = {p.name for p in own}
        shared = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                              default=defaults.get(name, default))
            for group in groups for name, (annotation, default) in group.items() if name not in taken
        ]
        fn.__signature__ = inspect.Signature([*own, *shared])
        return fn

    return decorate


def config_from(options: dict[str, Any]) -> RunConfig:
    """The RunConfig from a command's shared options (the other entries are left alone); says in one line when a
    few-step adapter's own sampling applies."""
    config = build_config(**{name: options[name] for name in RUN_OPTIONS if name in options})
    notice = config.lora_notice()
    if notice is not None:
        read_choice(config.lora, config.checkpoints)  # refused in one line first, on other base weights
        if not options.get("quiet"):
            echo_err(notice)
    return config


def option_source(name: str) -> str | None:
    """Where an option's value came from when it was not typed: the environment variable's name, else None."""
    try:
        from typer._click.core import ParameterSource
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover - older typer on top of click
        from click import get_current_context
        from click.core import ParameterSource
    ctx = get_current_context(silent=True)
    if ctx is None or ctx.get_parameter_source(name) is not ParameterSource.ENVIRONMENT:
        return None
    param = next((p for p in ctx.command.params if p.name == name), None)
    envvar = getattr(param, "envvar", None)
    return envvar if isinstance(envvar, str) else ENV_DEVICE if name == "device" else None


def checked_config(options: dict[str, Any]) -> RunConfig:
    """`config_from` plus the device and precision checked against this machine (usage errors, exit 2)."""
    from ootd.app.tryon.loader import check_hardware

    config = config_from(options)
    check_hardware(config, option_source("device"))
    return config


ModelsOpt = Annotated[str, typer.Option("--models", metavar="hd,dc", help="Model types: hd, dc or hd,dc.")]
ALL_MODELS = ",".join(MODEL_TYPES)


def parse_model_list(models: str) -> list[ModelType]:
    """'hd,dc' -> [ModelType.HD, ModelType.DC] (the --models option of download, verify and doctor)."""
    from ootd.weights.download import parse_models

    return parse_models([m for m in models.split(",") if m.strip()])
