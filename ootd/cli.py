"""The `ootd` command: parse options, build a config, call the library, map errors to exit codes.

Exit codes: 0 success, 1 failure (missing checkpoints, no person found, outputs exist, ...), 2 usage error (bad
option, unusable input image), 130 interrupted. Every failure is one line on stderr; --debug adds the traceback.
Heavy modules (torch, diffusers) are imported only by the commands that need them, so --help is instant.
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

try:  # typer >= 0.2x carries its own copy of click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover - older typer on top of click
    from click.exceptions import ClickException, NoArgsIsHelpError

from ootd import __version__
from ootd.batch import (
    FIT_MODES,
    PAIRINGS,
    REPORT_NAME,
    BatchRunner,
    BatchSummary,
    PairReport,
    PipelineLoader,
    RunConfig,
    check_checkpoints_present,
    describe_pipeline,
    no_person_error,
    pairs_from_folders,
    peak_memory,
    read_pairs_csv,
    save_result,
    select_shard,
    targets_for,
)
from ootd.config import (
    Category,
    ModelType,
    SamplingSettings,
    SchedulerName,
    parse_resolution,
)
from ootd.errors import CheckpointError, NoPersonError, OotdError, OutputError, UsageError

logger = logging.getLogger(__name__)

# Mirrors ootd.attention.ATTENTION_NAMES (kept here so validating an option does not import torch).
ATTENTION_CHOICES = ("auto", "flash", "sdpa", "chunked", "math")
PRECISION_CHOICES = ("auto", "fp32", "fp16", "bf16")
PARSING_PROVIDERS = ("auto", "cpu", "migraphx", "rocm", "cuda")
LIBRARY_LOGGERS = ("diffusers", "transformers", "huggingface_hub", "onnxruntime", "PIL", "urllib3", "httpx")
EXIT_INTERRUPTED = 130


# ---------------------------------------------------------------------------------------------- errors


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


def _echo_err(message: str) -> None:
    typer.echo(message, err=True)


def _is_out_of_memory(exc: BaseException) -> bool:
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def guarded(fn: Callable[[], Any], *, debug: bool = False) -> int:
    """Run `fn` and turn every way it can fail into one stderr line and an exit code.

    OotdError: its message and its exit code (2 usage, 1 otherwise). KeyboardInterrupt: 130 (the library writes
    outputs atomically, so nothing half-written stays behind). Anything else: "internal error" and 1.
    """
    try:
        fn()
    except typer.Exit as exc:  # a command's own typer.Exit(code)
        return exc.exit_code
    except (ClickException, typer.Abort):
        raise
    except OotdError as exc:
        if debug:
            traceback.print_exc()
        _echo_err(f"error: {_one_line(exc)}")
        return exc.exit_code
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        _echo_err("interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:
        if debug:
            traceback.print_exc()
        if _is_out_of_memory(exc):
            _echo_err(
                f"error: out of memory ({_one_line(exc)[:200]}); try --resolution 384x512, fewer --samples, "
                "--precision fp16 or --attention chunked"
                + ("" if debug else " (rerun with --debug for the traceback)")
            )
            return 1
        hint = "" if debug else " (rerun with --debug for the traceback)"
        _echo_err(f"internal error: {type(exc).__name__}: {_one_line(exc)}{hint}")
        return 1
    return 0


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (the test runner swaps it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))

    @property
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # noqa: ANN001
        pass

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace(record.levelname, record.levelname.lower(), 1)


@contextmanager
def cli_logging(verbose: bool, quiet: bool) -> Iterator[None]:
    """-v: the ootd logger at DEBUG and library chatter at WARNING; default: ootd warnings only; -q: errors.

    Levels and handlers are restored afterwards (commands also run in-process, e.g. under tests).
    """
    ootd_logger = logging.getLogger("ootd")
    saved = {name: logging.getLogger(name).level for name in ("ootd", *LIBRARY_LOGGERS)}
    saved_propagate = ootd_logger.propagate
    handler = _StderrHandler()
    ootd_logger.addHandler(handler)
    ootd_logger.propagate = False
    ootd_logger.setLevel(logging.DEBUG if verbose else logging.ERROR if quiet else logging.WARNING)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING if verbose else logging.ERROR)
    try:
        with warnings.catch_warnings():
            if not verbose:
                warnings.simplefilter("ignore")
            yield
    finally:
        ootd_logger.removeHandler(handler)
        ootd_logger.propagate = saved_propagate
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def _command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a command: logging per -v/-q, errors per `guarded` (needs `verbose`, `quiet`, `debug` params)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        with cli_logging(kwargs.get("verbose", False), kwargs.get("quiet", False)):
            code = guarded(lambda: fn(*args, **kwargs), debug=kwargs.get("debug", False))
        if code:
            raise typer.Exit(code)

    return wrapper


class _OotdGroup(TyperGroup):
    """Click's own usage errors (unknown option, missing value, not a number) as one line, exit code 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # noqa: ANN001, ANN201
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                              **extra)
            code = rv if isinstance(rv, int) else 0
        except NoArgsIsHelpError as exc:
            typer.echo(exc.ctx.get_help())
            code = 0
        except ClickException as exc:
            where = getattr(getattr(exc, "ctx", None), "command_path", None) or "ootd"
            _echo_err(f"error: {_one_line(exc.format_message())} (see `{where} --help`)")
            code = exc.exit_code
        except typer.Abort:
            _echo_err("interrupted")
            code = EXIT_INTERRUPTED
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    cls=_OotdGroup,
    name="ootd",
    help="Virtual try-on (OOTDiffusion) on ROCm, CUDA, Apple MPS and the CPU: person photo + garment photo -> "
         "photos of that person wearing that garment.",
    epilog="Start with `ootd download`, then `ootd doctor`, then `ootd run --help`. Exit codes: 0 ok, 1 failure, "
           "2 usage error, 130 interrupted.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
checkpoints_app = typer.Typer(
    help="Inspect the checkpoints folder.", no_args_is_help=True, rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(checkpoints_app, name="checkpoints")


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


# ---------------------------------------------------------------------------------------------- options

_SAMPLING = "Sampling"
_HARDWARE = "Hardware"
_INPUTS = "Inputs"
_OUTPUTS = "Outputs"
_LOGGING = "Logging"

ModelTypeOpt = Annotated[str | None, typer.Option(
    "--model-type", help="hd (half-body, upper only) or dc (full-body). Default: hd for upper, dc otherwise.",
    rich_help_panel=_INPUTS, show_default=False)]
SamplesOpt = Annotated[int, typer.Option("--samples", "-n", help="Images per pair, each from its own noise.",
                                         rich_help_panel=_SAMPLING)]
StepsOpt = Annotated[int, typer.Option("--steps", help="Denoising steps.", rich_help_panel=_SAMPLING)]
ScaleOpt = Annotated[float, typer.Option("--scale", help="Image guidance scale (off below 1.0).",
                                         rich_help_panel=_SAMPLING)]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Random seed; drawn at random (and printed) when absent.",
                                             rich_help_panel=_SAMPLING, show_default=False)]
ResolutionOpt = Annotated[str, typer.Option("--resolution", help="Working resolution, width x height: 384x512 or "
                                            "768x1024.", rich_help_panel=_SAMPLING)]
SchedulerOpt = Annotated[str, typer.Option("--scheduler", help="unipc (the original's), dpmpp, ddim or euler.",
                                           rich_help_panel=_SAMPLING)]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="auto, fp32, fp16 or bf16 (auto: fp32 on CPU, the "
                                           "device profile's choice on GPUs).", rich_help_panel=_HARDWARE)]
AttentionOpt = Annotated[str, typer.Option("--attention", help="auto, flash, sdpa, chunked or math.",
                                           rich_help_panel=_HARDWARE)]
DeviceOpt = Annotated[str | None, typer.Option("--device", envvar="OOTD_DEVICE", help="cpu, cuda, cuda:N (also "
                                               "ROCm) or mps. Default: the best available.",
                                               rich_help_panel=_HARDWARE, show_default=False)]
MaxMemoryOpt = Annotated[str | None, typer.Option("--max-memory", help="Memory a try-on may use, e.g. 20GiB "
                                                  "(default: free device memory less a margin).",
                                                  rich_help_panel=_HARDWARE, show_default=False)]
ChannelsLastOpt = Annotated[bool | None, typer.Option("--channels-last/--no-channels-last", help="Run the UNets and "
                                                     "the VAE in channels_last memory layout: 4-5% faster steps on "
                                                     "the CPU, slightly less precise (default: the device profile's "
                                                     "choice, off everywhere).",
                                                     rich_help_panel=_HARDWARE, show_default=False)]
CompileOpt = Annotated[bool | None, typer.Option("--compile/--no-compile", help="torch.compile the try-on UNet: the "
                                                 "first call compiles for minutes; then each step may be faster "
                                                 "(measure with ootd bench). Default: the device profile's choice, "
                                                 "off everywhere.", rich_help_panel=_HARDWARE, show_default=False)]
ProviderOpt = Annotated[str, typer.Option("--parsing-provider", help="ONNX Runtime provider for human parsing: "
                                          "cpu (default, as the original), auto (MIGraphX, ROCm, CUDA, then CPU), "
                                          "migraphx, rocm or cuda.", rich_help_panel=_HARDWARE)]
CheckpointsOpt = Annotated[Path | None, typer.Option("--checkpoints", help="Checkpoints folder. Default: "
                                                     "$OOTD_CHECKPOINTS or ./checkpoints.", rich_help_panel=_INPUTS,
                                                     show_default=False)]
FitOpt = Annotated[str, typer.Option("--fit", help="Framing of non-3:4 photos: pad, crop or stretch.",
                                     rich_help_panel=_INPUTS)]
MaskGrowOpt = Annotated[int, typer.Option("--mask-grow", help="Grow the mask by N pixels (at 512 px height).",
                                          rich_help_panel=_INPUTS)]
OutputOpt = Annotated[Path, typer.Option("--output", "-o", help="Output folder (created if needed).",
                                         rich_help_panel=_OUTPUTS)]
IntermediatesOpt = Annotated[bool, typer.Option("--save-intermediates", help="Also save the pose skeleton, "
                                                "parsing colour map, mask and masked person.",
                                                rich_help_panel=_OUTPUTS)]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace existing output files.",
                                            rich_help_panel=_OUTPUTS)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print a machine-readable JSON summary on stdout.",
                                       rich_help_panel=_OUTPUTS)]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging (also library warnings).",
                                          rich_help_panel=_LOGGING)]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress display, errors only.",
                                        rich_help_panel=_LOGGING)]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Print tracebacks for errors.", rich_help_panel=_LOGGING)]


def _choice(value: str, choices: tuple[str, ...], what: str) -> str:
    key = str(value).strip().lower()
    if key not in choices:
        raise UsageError(f"unknown {what} {value!r}: use one of {', '.join(choices)}")
    return key


def parse_size(value: str | None) -> int | None:
    """'20GiB', '20GB', '512MiB', '2e10' -> bytes (GB and GiB both mean 2**30: what users mean)."""
    if value is None:
        return None
    text = value.strip().lower().replace(" ", "").removesuffix("b").removesuffix("i")
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    scale = units.get(text[-1:], 1) if text else 1
    number = text[:-1] if text[-1:] in units else text
    try:
        size = int(float(number) * scale)
    except ValueError:
        raise UsageError(f"bad memory size {value!r}: use e.g. 20GiB or 512MiB") from None
    if size <= 0:
        raise UsageError(f"memory size must be positive, got {value!r}")
    return size


def build_config(
    *, checkpoints: Path | None, output: Path, model_type: str | None, samples: int, steps: int, scale: float,
    seed: int | None, resolution: str, scheduler: str, precision: str, attention: str, device: str | None,
    parsing_provider: str, max_memory: str | None, fit: str, mask_grow: int, save_intermediates: bool,
    overwrite: bool, channels_last: bool | None = None, compile: bool | None = None,
) -> RunConfig:
    """Validate every option (cheap, before anything is loaded) into one RunConfig; a random seed is drawn here."""
    from ootd.checkpoints import default_checkpoints_dir

    forced = None
    if model_type is not None:
        try:
            forced = ModelType(model_type.strip().lower())
        except ValueError:
            raise UsageError(f"unknown model type {model_type!r}: use hd or dc") from None
    sampling = SamplingSettings(
        num_samples=samples, steps=steps, guidance_scale=scale,
        seed=seed if seed is not None else secrets.randbelow(2**32),
        resolution=parse_resolution(resolution), scheduler=SchedulerName.parse(scheduler),
    )
    sampling.validate()
    if mask_grow < 0:
        raise UsageError(f"--mask-grow must be >= 0 pixels, got {mask_grow}")
    return RunConfig(
        checkpoints=Path(checkpoints) if checkpoints is not None else default_checkpoints_dir(),
        output=Path(output), sampling=sampling, model_type=forced,
        device=None if device in (None, "", "auto") else device.strip(),
        precision=_choice(precision, PRECISION_CHOICES, "precision"),
        attention=_choice(attention, ATTENTION_CHOICES, "attention backend"),
        parsing_provider=_choice(parsing_provider, PARSING_PROVIDERS, "parsing provider"),
        max_memory=parse_size(max_memory), fit=_choice(fit, FIT_MODES, "fit mode"), mask_grow=mask_grow,
        save_intermediates=save_intermediates, overwrite=overwrite, channels_last=channels_last, compile=compile,
    )


# ---------------------------------------------------------------------------------------------- loading


def load_pipeline(config: RunConfig, model_type: ModelType) -> Any:
    """The one place the CLI builds a pipeline (tests swap it for a preloaded one)."""
    from ootd.pipeline import TryOnPipeline

    if not logging.getLogger("ootd").isEnabledFor(logging.DEBUG):
        for name in LIBRARY_LOGGERS:  # importing transformers/diffusers may have reset their levels
            logging.getLogger(name).setLevel(logging.ERROR)
    return TryOnPipeline.from_pretrained(
        config.checkpoints, model_type=model_type.value, device=config.device,
        dtype=None if config.precision == "auto" else config.precision, attention=config.attention,
        parsing_provider=config.parsing_provider, max_memory=config.max_memory,
        channels_last=config.channels_last, compile=config.compile,
    )


# ---------------------------------------------------------------------------------------------- display


class Display:
    """Progress bars on stderr (load, preprocess, denoising steps, decode); nothing when disabled."""

    LABELS = {
        "load": "loading models", "preprocess": "preparing inputs", "person": "preparing person",
        "garment": "preparing garment", "denoise": "denoising", "decode": "decoding", "pairs": "pairs",
    }

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._progress = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> Display:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description:<18}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=Console(stderr=True), transient=True,
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        """The pipeline's progress callback: (stage, done, total)."""
        if self._progress is None:
            return
        task = self._tasks.get(stage)
        if task is None:
            self._tasks[stage] = self._progress.add_task(self.LABELS.get(stage, stage), total=total,
                                                         completed=done)
        else:
            self._progress.update(task, completed=done, total=total)

    def start(self, stage: str) -> None:
        self(stage, 0, 1)

    def finish(self, stage: str) -> None:
        self(stage, 1, 1)

    def reset(self, *stages: str) -> None:
        """Remove per-pair bars so the next pair starts fresh."""
        if self._progress is None:
            return
        for stage in stages:
            task = self._tasks.pop(stage, None)
            if task is not None:
                self._progress.remove_task(task)


def _show_progress(quiet: bool, json_out: bool) -> bool:
    """Progress only for a person at a terminal: not with -q, not with --json, not when piped."""
    return not quiet and not json_out and sys.stdout.isatty() and sys.stderr.isatty()


def _fmt_seconds(value: float) -> str:
    return f"{value:.1f} s" if value >= 1 else f"{value * 1000:.0f} ms"


def _plan_lines(plan: Any) -> list[str]:
    if isinstance(plan, dict):
        return [f"  {key}: {value}" for key, value in plan.items()]
    if isinstance(plan, list | tuple):
        return [f"  {item}" for item in plan]
    return [f"  {line}" for line in str(plan).splitlines()]


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if callable(getattr(value, "to_dict", None)):
        return value.to_dict()
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(value)
    return str(value)


def _print_json(data: dict[str, Any]) -> None:
    typer.echo(json.dumps(data, indent=2, default=_json_default))


# ---------------------------------------------------------------------------------------------- run


def _existing_outputs(paths: list[Path]) -> None:
    existing = [p for p in paths if p.exists()]
    if existing:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise OutputError(
            f"{existing[0]} already exists{more}; use --overwrite to replace, or --output for another folder"
        )


_RUN_EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd run --model person.jpg --cloth shirt.jpg --category upper\n\n"
    "  ootd run -m person.jpg -c skirt.png --category lower --samples 4 --steps 30 --seed 42 -o results\n\n"
    "  ootd run -m person.jpg -c shirt.jpg --category upper --mask mask.png --resolution 384x512 --json"
)


@app.command("run", epilog=_RUN_EPILOG)
@_command
def run_command(
    model: Annotated[Path, typer.Option("--model", "--person", "-m", help="Person photo.", metavar="PERSON",
                                        rich_help_panel=_INPUTS, show_default=False)],
    cloth: Annotated[Path, typer.Option("--cloth", "--garment", "-c", help="Garment photo.", metavar="GARMENT",
                                        rich_help_panel=_INPUTS, show_default=False)],
    category: Annotated[str, typer.Option("--category", "-k", help="upper, lower or dress (also upperbody, "
                                          "lowerbody, dresses, 0, 1, 2).", rich_help_panel=_INPUTS,
                                          show_default=False)],
    model_type: ModelTypeOpt = None,
    mask: Annotated[Path | None, typer.Option("--mask", help="Mask image (white = repaint); skips pose and "
                                              "parsing.", rich_help_panel=_INPUTS, show_default=False)] = None,
    fit: FitOpt = "pad",
    mask_grow: MaskGrowOpt = 0,
    checkpoints: CheckpointsOpt = None,
    samples: SamplesOpt = 1,
    steps: StepsOpt = 20,
    scale: ScaleOpt = 2.0,
    seed: SeedOpt = None,
    resolution: ResolutionOpt = "768x1024",
    scheduler: SchedulerOpt = "unipc",
    precision: PrecisionOpt = "auto",
    attention: AttentionOpt = "auto",
    device: DeviceOpt = None,
    max_memory: MaxMemoryOpt = None,
    channels_last: ChannelsLastOpt = None,
    compile: CompileOpt = None,
    parsing_provider: ProviderOpt = "cpu",
    output: OutputOpt = Path("outputs"),
    save_intermediates: IntermediatesOpt = False,
    overwrite: OverwriteOpt = False,
    json_out: JsonOpt = False,
    explain: Annotated[bool, typer.Option("--explain", help="Print the device, precision, attention and memory "
                                          "plan before running.", rich_help_panel=_OUTPUTS)] = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Dress one person in one garment: writes [bold]<person>__<garment>__<i>.png[/bold] per sample."""
    from ootd.batch import Pair
    from ootd.images import check_output_dir, load_image

    started = time.perf_counter()
    # 1. everything cheap first: options, input images, checkpoints folder, output folder and names
    config = build_config(
        checkpoints=checkpoints, output=output, model_type=model_type, samples=samples, steps=steps, scale=scale,
        seed=seed, resolution=resolution, scheduler=scheduler, precision=precision, attention=attention,
        device=device, parsing_provider=parsing_provider, max_memory=max_memory, fit=fit, mask_grow=mask_grow,
        save_intermediates=save_intermediates, overwrite=overwrite, channels_last=channels_last, compile=compile,
    )
    cat = Category.parse(category)
    chosen_model = config.model_type_for(cat)
    person_image = load_image(model, "person")
    garment_image = load_image(cloth, "garment")
    mask_image = load_image(mask, "mask") if mask is not None else None
    check_checkpoints_present(config.checkpoints, [chosen_model], need_preprocess=mask is None)
    check_output_dir(config.output)
    pair = Pair(person=Path(model), garment=Path(cloth), category=cat, mask=Path(mask) if mask else None,
                source="command line")
    targets = targets_for(pair, config)
    if not config.overwrite:
        _existing_outputs(targets.all())
    random_seed = seed is None
    if not json_out:
        note = f" (random; pass --seed {config.sampling.seed} to reproduce)" if random_seed else ""
        logger.info("seed %d%s", config.sampling.seed, note)

    # 2. the heavy part
    timings: dict[str, Any] = {}
    with Display(_show_progress(quiet, json_out)) as display:
        display.start("load")
        t = time.perf_counter()
        pipe = load_pipeline(config, chosen_model)
        timings["load"] = time.perf_counter() - t
        display.finish("load")
        if explain and not json_out:
            _explain(pipe, describe_pipeline(pipe, config), config)
        display.start("preprocess")
        resolution_ = config.sampling.resolution
        try:
            person_inputs = pipe.prepare_person(person_image, cat, mask=mask_image, resolution=resolution_,
                                                fit=config.fit, mask_grow=config.mask_grow)
        except NoPersonError as exc:
            raise no_person_error(pair.person, exc) from None
        garment_inputs = pipe.prepare_garment(garment_image, cat, resolution=resolution_, fit=config.fit)
        display.finish("preprocess")
        result = pipe.generate(person_inputs, garment_inputs, config.sampling, progress=display)
        info = describe_pipeline(pipe, config)  # after the call: the plan used and the backends that served
        t = time.perf_counter()
        images, intermediates = save_result(result, pair, config, targets, info)
        timings["save"] = time.perf_counter() - t

    timings.update({k: v for k, v in (result.timings or {}).items() if k != "total"})
    timings["total"] = time.perf_counter() - started
    memory = peak_memory(pipe)
    if json_out:
        summary = {
            "outputs": [str(p) for p in images],
            "intermediates": {k: str(p) for k, p in intermediates.items()},
            "seed": result.seed, "seed_random": random_seed,
            "person": str(pair.person), "garment": str(pair.garment), "mask": str(pair.mask) if pair.mask else None,
            "category": cat.value, "model_type": chosen_model.value,
            "device": info.get("device"), "precision": info.get("precision"), "attention": info.get("attention"),
            "timings": timings, "peak_memory": memory, "settings": dict(result.settings or {}),
        }
        if explain:
            summary["describe"] = info
        _print_json(summary)
        return
    for path in images:
        typer.echo(str(path))
    for path in intermediates.values():
        typer.echo(str(path))
    note = f" (random; pass --seed {result.seed} to reproduce)" if random_seed else ""
    typer.echo(f"seed: {result.seed}{note}")
    stages = ", ".join(
        f"{name} {_fmt_seconds(timings[name])}" for name in ("load", "preprocess", "garment_unet", "denoise", "decode")
        if isinstance(timings.get(name), float)
    )
    typer.echo(
        f"time: {_fmt_seconds(timings['total'])} ({stages}) on {info.get('device')}, {info.get('precision')}, "
        f"attention {info.get('attention')}"
    )


def _explain(pipe: Any, info: dict[str, Any], config: RunConfig) -> None:
    """--explain: what was chosen, and the memory plan for this call when the pipeline makes one."""
    for key in ("device", "arch", "precision", "attention"):
        if info.get(key):
            typer.echo(f"{key}: {info[key]}")
    plan = info.get("plan")
    make_plan = getattr(pipe, "make_plan", None)
    if callable(make_plan):
        sampling = config.sampling
        try:
            plan = make_plan(sampling.resolution, sampling.num_samples, sampling.guidance_scale >= 1.0)
        except Exception as exc:  # explaining must not stop the run
            logger.debug("make_plan failed: %s", exc)
    if callable(getattr(plan, "explain", None)):  # a memory Plan explains itself, headline included
        typer.echo(plan.explain())
    elif plan:
        typer.echo("memory plan:")
        for line in _plan_lines(plan):
            typer.echo(line)
    else:
        typer.echo("memory plan: not available (this build's pipeline does not describe one)")


# ---------------------------------------------------------------------------------------------- batch

_BATCH_EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd batch pairs.csv -o results   (rows: person,garment,category,mask; header optional)\n\n"
    "  ootd batch --models people/ --cloths shirts/ --category upper --pairing product\n\n"
    "  ootd batch pairs.csv --shard 0/2 --device cuda:0   (one of two processes; see scripts/multi_gpu.sh)"
)


def _parse_shard(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        index, count = (int(x) for x in value.split("/"))
    except ValueError:
        raise UsageError(f"bad shard {value!r}: use K/N, e.g. 0/4 for the first of four") from None
    if count < 1 or not 0 <= index < count:
        raise UsageError(f"bad shard {value!r}: need 0 <= K < N")
    return index, count


@app.command("batch", epilog=_BATCH_EPILOG)
@_command
def batch_command(
    csv_file: Annotated[Path | None, typer.Argument(help="CSV of person,garment,category[,mask] rows (paths "
                                                    "relative to the CSV).", metavar="[PAIRS.CSV]",
                                                    show_default=False)] = None,
    models: Annotated[Path | None, typer.Option("--models", "--people", help="Folder of person photos.",
                                                rich_help_panel=_INPUTS, show_default=False)] = None,
    cloths: Annotated[Path | None, typer.Option("--cloths", "--garments", help="Folder of garment photos.",
                                                rich_help_panel=_INPUTS, show_default=False)] = None,
    masks: Annotated[Path | None, typer.Option("--masks", help="Folder of masks named like the person photos "
                                               "(folder mode).", rich_help_panel=_INPUTS,
                                               show_default=False)] = None,
    category: Annotated[str | None, typer.Option("--category", "-k", help="Category for folder mode (and for CSV "
                                                 "rows without one).", rich_help_panel=_INPUTS,
                                                 show_default=False)] = None,
    pairing: Annotated[str, typer.Option("--pairing", help="Folder mode: product (everyone x everything) or zip "
                                         "(i-th with i-th).", rich_help_panel=_INPUTS)] = "product",
    model_type: ModelTypeOpt = None,
    fit: FitOpt = "pad",
    mask_grow: MaskGrowOpt = 0,
    checkpoints: CheckpointsOpt = None,
    samples: SamplesOpt = 1,
    steps: StepsOpt = 20,
    scale: ScaleOpt = 2.0,
    seed: SeedOpt = None,
    resolution: ResolutionOpt = "768x1024",
    scheduler: SchedulerOpt = "unipc",
    precision: PrecisionOpt = "auto",
    attention: AttentionOpt = "auto",
    device: DeviceOpt = None,
    max_memory: MaxMemoryOpt = None,
    channels_last: ChannelsLastOpt = None,
    compile: CompileOpt = None,
    parsing_provider: ProviderOpt = "cpu",
    shard: Annotated[str | None, typer.Option("--shard", help="Run only shard K of N (K/N, from 0), e.g. one per "
                                              "GPU.", rich_help_panel=_HARDWARE, show_default=False)] = None,
    output: OutputOpt = Path("outputs"),
    report: Annotated[Path | None, typer.Option("--report", help=f"JSON-lines report. Default: OUTPUT/{REPORT_NAME}"
                                                " (one per shard).", rich_help_panel=_OUTPUTS,
                                                show_default=False)] = None,
    save_intermediates: IntermediatesOpt = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Redo pairs whose outputs exist (default: skip "
                                            "them, so a rerun resumes).", rich_help_panel=_OUTPUTS)] = False,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Many pairs with the models loaded once; continues past bad pairs; reruns skip finished pairs.

    Exit code 0 only if every pair succeeded (now or in an earlier run).
    """
    from ootd.images import check_output_dir

    config = build_config(
        checkpoints=checkpoints, output=output, model_type=model_type, samples=samples, steps=steps, scale=scale,
        seed=seed, resolution=resolution, scheduler=scheduler, precision=precision, attention=attention,
        device=device, parsing_provider=parsing_provider, max_memory=max_memory, fit=fit, mask_grow=mask_grow,
        save_intermediates=save_intermediates, overwrite=overwrite, channels_last=channels_last, compile=compile,
    )
    default_category = Category.parse(category) if category is not None else None
    sharding = _parse_shard(shard)
    folder_mode = models is not None or cloths is not None
    if csv_file is not None and folder_mode:
        raise UsageError("give either a pairs CSV or --models/--cloths folders, not both")
    if csv_file is not None:
        pairs = read_pairs_csv(csv_file, default_category)
    elif folder_mode:
        if models is None or cloths is None:
            raise UsageError("folder mode needs both --models DIR and --cloths DIR")
        if default_category is None:
            raise UsageError("folder mode needs --category upper|lower|dress")
        pairs = pairs_from_folders(models, cloths, default_category, _choice(pairing, PAIRINGS, "pairing"), masks)
    else:
        raise UsageError("nothing to do: give a pairs CSV or --models DIR --cloths DIR --category C")
    if sharding is not None:
        pairs = select_shard(pairs, sharding[0], sharding[1], config)
    check_output_dir(config.output)
    if report is None:
        name = REPORT_NAME if sharding is None else f"batch_report.shard{sharding[0]}of{sharding[1]}.jsonl"
        report = config.output / name

    with Display(_show_progress(quiet, json_out)) as display:
        def on_report(entry: PairReport) -> None:
            display.reset("person", "garment", "denoise", "decode")
            if entry.status == "error":  # as it happens: a long batch should not hide its failures
                _echo_err(f"error: {entry.pair.source} ({entry.pair.describe()}): {entry.error}")
            else:
                logger.info("%s: %s", entry.pair.describe(), entry.status)

        runner = BatchRunner(config, PipelineLoader(lambda m: load_pipeline(config, m)), report_path=report,
                             progress=display, on_report=on_report)
        summary = runner.run(pairs)

    if json_out:
        _print_json(summary.to_json())
    else:
        _print_batch_summary(summary, config)
    if not summary.ok:
        raise typer.Exit(1)


def _print_batch_summary(summary: BatchSummary, config: RunConfig) -> None:
    counts = f"{summary.count('ok')} ok, {summary.count('skipped')} skipped, {summary.count('error')} error"
    people, garments = summary.prepared["person"], summary.prepared["garment"]
    typer.echo(
        f"{len(summary.reports)} pairs: {counts} in {_fmt_seconds(summary.seconds)} "
        f"(model loading {_fmt_seconds(summary.load_seconds)}; prepared {people} "
        f"{'person' if people == 1 else 'people'}, {garments} garment{'' if garments == 1 else 's'})"
    )
    typer.echo(f"seed: {config.sampling.seed}")
    typer.echo(f"outputs: {config.output}")
    typer.echo(f"report: {summary.report_path}")
    if not summary.ok:
        typer.echo(f"{summary.count('error')} pair(s) failed (listed above and in the report); fix them and rerun "
                   "the same command: finished pairs are skipped")


# ---------------------------------------------------------------------------------------------- download


@app.command("download", epilog="[bold]Example[/bold]\n\n  ootd download --dest checkpoints --models hd,dc")
@_command
def download_command(
    dest: Annotated[Path | None, typer.Option("--dest", help="Checkpoints folder. Default: $OOTD_CHECKPOINTS or "
                                              "./checkpoints.", show_default=False)] = None,
    models: Annotated[str, typer.Option("--models", help="Model types to fetch: hd, dc or hd,dc.")] = "hd,dc",
    revision: Annotated[str | None, typer.Option("--revision", help="Commit or tag of levihsu/OOTDiffusion "
                                                 "(pin it for reproducible runs).", show_default=False)] = None,
    clip_revision: Annotated[str | None, typer.Option("--clip-revision", help="Commit of "
                                                      "openai/clip-vit-large-patch14.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Fetch again even when files are present.")] = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Fetch exactly the released files ootd needs from the Hugging Face hub (resumable)."""
    from ootd.checkpoints import default_checkpoints_dir
    from ootd.download import download_checkpoints, parse_models

    target = dest if dest is not None else default_checkpoints_dir()
    chosen = parse_models([m for m in models.split(",") if m.strip()])
    files = download_checkpoints(target, chosen, revision, progress=not quiet, clip_revision=clip_revision,
                                 force=force)
    typer.echo(f"{len(files)} checkpoint files in {target} (models: {', '.join(m.value for m in chosen)})")
    typer.echo(f"next: ootd checkpoints verify {target}")


# ---------------------------------------------------------------------------------------------- checkpoints


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def _console(stderr: bool = False) -> Any:
    """A rich console that does not wrap long paths when output is piped."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, width=None if stream.isatty() else 200, soft_wrap=not stream.isatty())


@checkpoints_app.command("verify", epilog="[bold]Example[/bold]\n\n  ootd checkpoints verify checkpoints --models hd")
@_command
def verify_command(
    folder: Annotated[Path | None, typer.Argument(help="Checkpoints folder. Default: $OOTD_CHECKPOINTS or "
                                                  "./checkpoints.", metavar="[DIR]", show_default=False)] = None,
    models: Annotated[str, typer.Option("--models", help="Model types to check: hd, dc or hd,dc.")] = "hd,dc",
    quick: Annotated[bool, typer.Option("--quick", help="Presence and size only (no load checks).")] = False,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Check every expected checkpoint file: present, size, loadable, and the fix. Exit 1 on any problem."""
    from ootd.checkpoints import default_checkpoints_dir
    from ootd.download import parse_models
    from ootd.verify import verify_checkpoints

    root = folder if folder is not None else default_checkpoints_dir()
    chosen = parse_models([m for m in models.split(",") if m.strip()])
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise CheckpointError(f"checkpoints folder {root} {what}; run `ootd download --dest {root}`")
    checks = verify_checkpoints(root, chosen, load=not quick)
    bad = [c for c in checks if not c.ok]
    if json_out:
        _print_json({
            "root": str(root), "ok": not bad,
            "files": [
                {"component": c.component, "path": str(c.path), "present": c.present, "size": c.size, "ok": c.ok,
                 "problem": c.problem, "fix": c.fix}
                for c in checks
            ],
        })
    else:
        from rich.table import Table

        table = Table(title=f"checkpoints in {root}", show_lines=False)
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
                loadable = f"[red]no[/red]: {c.problem}"
            table.add_row(c.component, shown, "[green]yes[/green]" if c.present else "[red]no[/red]",
                          _size(c.size), loadable, c.fix or "")
        _console().print(table)
        if bad:
            typer.echo(f"{len(bad)} of {len(checks)} files have problems; fix them (or run "
                       f"`ootd download --dest {root}`) and verify again")
        else:
            typer.echo(f"all {len(checks)} files ok")
    if bad:
        raise typer.Exit(1)


# ---------------------------------------------------------------------------------------------- doctor


@app.command("doctor", epilog="[bold]Example[/bold]\n\n  ootd doctor --checkpoints /data/ootd-checkpoints")
@_command
def doctor_command(
    checkpoints: CheckpointsOpt = None,
    models: Annotated[str, typer.Option("--models", help="Model types to check: hd, dc or hd,dc.")] = "hd,dc",
    quick: Annotated[bool, typer.Option("--quick", help="Check checkpoint files by presence and size only.")] = False,
    no_kernels: Annotated[bool, typer.Option("--no-kernels", help="Skip the tiny GPU kernel test runs.")] = False,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Everything that decides whether (and how fast) a try-on can run here, with the fix for each problem.

    Exit 1 when no try-on can run (e.g. checkpoints missing).
    """
    from ootd.checkpoints import default_checkpoints_dir
    from ootd.doctor import collect_report
    from ootd.download import parse_models

    root = checkpoints if checkpoints is not None else default_checkpoints_dir()
    chosen = [m.value for m in parse_models([m for m in models.split(",") if m.strip()])]
    report = collect_report(root, models=chosen, load_checkpoints=not quick, run_kernels=not no_kernels)
    if json_out:
        _print_json({
            "can_run": report.can_run, "worst": report.worst, "models_available": report.models_available,
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
            table.add_row(item.section, escape(item.item), marks.get(item.status, item.status), escape(item.detail),
                          escape(item.fix or ""))
        _console().print(table)
        models_text = ", ".join(report.models_available) or "none"
        verdict = "try-ons can run" if report.can_run else "try-ons cannot run until the FAIL items are fixed"
        typer.echo(f"{verdict} (models available: {models_text})")
    if not report.can_run:
        raise typer.Exit(1)


# ---------------------------------------------------------------------------------------------- bench
# `ootd bench` is a thin front end: the benchmark itself is ootd/bench.py's `run_bench` / `run_matrix` (owned
# with that module). Options are passed through by name; ones that module does not (yet) take are dropped.

_BENCH_EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd bench --checkpoints checkpoints --resolution 768x1024 --samples 4 --compare-original\n\n"
    "  ootd bench --random-weights full --matrix --json > bench.json"
)


def _call_with_known(fn: Callable[..., Any], **kwargs: Any) -> Any:
    import inspect

    params = inspect.signature(fn).parameters
    dropped = [k for k in kwargs if k not in params]
    if dropped:
        logger.warning("this ootd.bench does not take %s; ignored", ", ".join(dropped))
    return fn(**{k: v for k, v in kwargs.items() if k in params})


@app.command("bench", epilog=_BENCH_EPILOG)
@_command
def bench_command(
    checkpoints: CheckpointsOpt = None,
    random_weights: Annotated[str | None, typer.Option("--random-weights", help="Benchmark in-memory random "
                                                       "weights instead: full (released sizes) or tiny.",
                                                       rich_help_panel=_INPUTS, show_default=False)] = None,
    model_type: Annotated[str, typer.Option("--model-type", help="hd or dc.", rich_help_panel=_INPUTS)] = "hd",
    samples: SamplesOpt = 1,
    steps: Annotated[int, typer.Option("--steps", help="Denoising steps.", rich_help_panel=_SAMPLING)] = 2,
    scale: ScaleOpt = 2.0,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.", rich_help_panel=_SAMPLING)] = 0,
    resolution: ResolutionOpt = "768x1024",
    scheduler: SchedulerOpt = "unipc",
    precision: PrecisionOpt = "auto",
    attention: Annotated[str, typer.Option("--attention", help="auto, flash, sdpa, chunked or math.",
                                           rich_help_panel=_HARDWARE)] = "sdpa",
    device: DeviceOpt = None,
    max_memory: MaxMemoryOpt = None,
    channels_last: ChannelsLastOpt = None,
    compile: CompileOpt = None,
    compare_original: Annotated[bool, typer.Option("--compare-original", help="Also time the original "
                                                   "formulation on the same weights.")] = False,
    flops: Annotated[bool, typer.Option("--flops", help="Count FLOPs per denoising step.")] = False,
    profile: Annotated[bool, typer.Option("--profile", help="Add a torch profiler table of one step.")] = False,
    matrix: Annotated[bool, typer.Option("--matrix", help="Every precision x attention backend on random "
                                         "weights.")] = False,
    save: Annotated[Path | None, typer.Option("--save", help="Also write the JSON report to this file.",
                                              rich_help_panel=_OUTPUTS, show_default=False)] = None,
    json_out: JsonOpt = False,
    verbose: VerboseOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Per-stage time and peak memory next to the memory plan's estimate (optionally vs the original)."""
    from ootd import bench

    _choice(precision, PRECISION_CHOICES, "precision")
    _choice(attention, ATTENTION_CHOICES, "attention backend")
    if random_weights is not None:
        _choice(random_weights, ("full", "tiny"), "random weights kind")
    say: Callable[[str], None] = (lambda line: None) if quiet else (lambda line: _echo_err(line) if json_out
                                                                     else typer.echo(line))
    if matrix:
        report = _call_with_known(bench.run_matrix, random_weights=random_weights or "full", device=device,
                                  resolution=resolution, num_samples=samples, steps=steps,
                                  original=compare_original, count_flops=flops, log=say)
    else:
        source = {"random_weights": random_weights} if random_weights else {
            "checkpoints": checkpoints if checkpoints is not None else _default_checkpoints()}
        report = _call_with_known(
            bench.run_bench, **source, model_type=model_type, device=device, dtype=precision, attention=attention,
            resolution=resolution, num_samples=samples, steps=steps, guidance_scale=scale, seed=seed,
            scheduler=scheduler, max_memory=parse_size(max_memory), channels_last=channels_last, compile=compile,
            compare_original=compare_original,
            count_flops=flops, profile=profile, log=say,
        )
    if save is not None:
        save.write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
    if json_out:
        _print_json(report)


def _default_checkpoints() -> Path:
    from ootd.checkpoints import default_checkpoints_dir

    return default_checkpoints_dir()


# ---------------------------------------------------------------------------------------------- entry


def main(argv: list[str] | None = None) -> None:
    """Console entry point (`ootd`, `python -m ootd`)."""
    app(args=argv, prog_name="ootd")
