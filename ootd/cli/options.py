"""The CLI's options: every setting of a try-on a command offers, derived from its declaration
(ootd/app/tryon/settings.py: flag, metavar, panel, default, help, environment variable), plus the logging options
every command takes.

`with_options(RUN_OPTIONS, LOGGING_OPTIONS)` adds the declared options to a command's signature (typer reads
`__signature__`), so a command states only its own parameters; it receives the shared ones typed, as one `Shared`
(the settings' words and the logging flags), whose `config()` is the validated RunConfig. Adding a setting to the
declarations adds its option to every command that offers it; nothing here changes.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ootd.app.console import echo_err
from ootd.app.tryon.config import RunConfig, build_config
from ootd.app.tryon.settings import (
    BATCH,
    BENCH,
    CLASSIFY,
    HARDWARE,
    INPUTS,
    MASK,
    OUTPUTS,
    RUN,
    SAMPLING,
    SERVE,
    SETTINGS,
    Setting,
)
from ootd.errors import UsageError
from ootd.hardware.spec import ENV_DEVICE
from ootd.settings import AUTO_CATEGORY, Category, Choice, ModelType
from ootd.weights.lora import read_choice

if TYPE_CHECKING:
    from ootd.app.tryon.preservation import PreservationChoice

LOGGING = "Logging"
# what the commands read from here: the panels and front-end names of the declarations, with the options
__all__ = ["BATCH", "BENCH", "CLASSIFY", "HARDWARE", "INPUTS", "MASK", "OUTPUTS", "RUN", "SAMPLING", "SERVE",
           "LOGGING_OPTIONS", "RUN_OPTIONS", "Shared", "choices", "options_of", "with_options", "checked_config",
           "config_from", "PreservationOpt", "ReviewAboveOpt", "preservation_choice"]


def choices(words: type[Choice] | tuple[str, ...]) -> str:
    """`[pad|crop|stretch]`: the metavar that shows every valid word."""
    listed = words.words() if isinstance(words, type) else words
    return f"[{'|'.join(listed)}]"


def _opt(*names: str, panel: str, default_shown: bool = True, **kwargs: Any) -> Any:
    return typer.Option(*names, rich_help_panel=panel, show_default=default_shown, **kwargs)


# the inputs the try-on commands name (their flags are their own parameters), and the things the library's
# messages point to, in the CLI's words
INPUT_FLAGS = {"person": "--model", "garment": "--cloth", "mask": "--mask", "category": "--category",
               "automatic_mask": "the mask `ootd mask` makes"}


def cli_name(name: str) -> str:
    """The CLI's word for a setting or an input: a declared setting's flag (`--mask-grow`), an input's, else the
    option its name makes (`batch_size` -> `--batch-size`, as every command names its options)."""
    return SETTINGS.flag(name) or INPUT_FLAGS.get(name) or "--" + name.replace("_", "-")


def option_of(setting: Setting) -> Any:
    """A setting's typer option, from its declaration: the type of its word (optional when it has no default),
    its flags, a metavar listing its choices, its panel and its help in the CLI's words."""
    kind = setting.kind | None if setting.default is None else setting.kind
    extra = {"envvar": setting.envvar} if setting.envvar else {}
    metavar = setting.metavar or (choices(setting.choices) if setting.choices else None)
    return Annotated[kind, _opt(*setting.flags, panel=setting.panel, default_shown=setting.default is not None,
                                metavar=metavar, help=setting.help_in(cli_name), **extra)]


def options_of(front_end: str) -> dict[str, tuple[Any, Any]]:
    """name -> (option, default) of every setting `front_end` (a command: RUN, BATCH, ...) offers, in order."""
    return {one.name: (option_of(one), one.default) for one in SETTINGS.offered_by(front_end)}


MODEL_TYPES = ModelType.words()
CATEGORY_METAVAR = choices((*(c.value for c in Category), AUTO_CATEGORY))  # run's and batch's --category

# the declared options other commands take one by one (`ootd train`, `ootd eval`)
ModelTypeOpt = option_of(SETTINGS["model_type"])
CheckpointsOpt = option_of(SETTINGS["checkpoints"])
FitOpt = option_of(SETTINGS["fit"])
ResolutionOpt = option_of(SETTINGS["resolution"])
AttentionOpt = option_of(SETTINGS["attention"])
DeviceOpt = option_of(SETTINGS["device"])
ProviderOpt = option_of(SETTINGS["parsing_provider"])
JsonOpt = Annotated[bool, _opt("--json", panel=OUTPUTS, help="Print a machine-readable JSON summary on stdout.")]
VerboseOpt = Annotated[bool, _opt("--verbose", "-v", panel=LOGGING, help="Debug logging (also library warnings).")]
QuietOpt = Annotated[bool, _opt("--quiet", "-q", panel=LOGGING, help="No progress display, errors only.")]
DebugOpt = Annotated[bool, _opt("--debug", panel=LOGGING, help="Print tracebacks for errors.")]
# what `ootd run` and `ootd batch` measure of each try-on (docs/preservation.md); `preservation_choice` checks them
PreservationOpt = option_of(SETTINGS["preservation"])
ReviewAboveOpt = Annotated[float | None, _opt(
    "--review-above", metavar="PERCENT", panel=OUTPUTS, default_shown=False,
    help="Mark for review the try-ons where more than PERCENT of a region outside the mask changed (the "
         "preservation line and JSON; a batch's summary and contact sheet too; the exit code is unchanged).")]

# name -> (declaration, default). The names are build_config's keywords.
RUN_OPTIONS = options_of(RUN)
LOGGING_OPTIONS: dict[str, tuple[Any, Any]] = {
    "verbose": (VerboseOpt, False), "quiet": (QuietOpt, False), "debug": (DebugOpt, False),
}


@dataclass(frozen=True)
class Shared:
    """A command's shared options, typed: the words of the settings it offers, by setting name, as typed (or
    their defaults), and the logging flags."""

    words: Mapping[str, Any] = field(default_factory=dict)
    verbose: bool = False
    quiet: bool = False
    debug: bool = False

    @property
    def random_seed(self) -> bool:
        """No seed was given: one is drawn (and reported)."""
        return self.words.get("seed") is None

    def config(self, *, check: bool = True, **words: Any) -> RunConfig:
        """The validated RunConfig of these words, with the command's own settings `words` on top (`--overwrite`
        of batch); `check`: also the device and precision against this machine (usage errors, exit 2)."""
        chosen = {**self.words, **words}
        return checked_config(chosen, quiet=self.quiet) if check else config_from(chosen, quiet=self.quiet)


def with_options(*groups: dict[str, tuple[Any, Any]], **defaults: Any) -> Callable[[Callable], Callable]:
    """Add the options of `groups` to a command (after its own parameters, which win on a name clash);
    `defaults` overrides a shared option's default for this command. A command that takes a `shared`
    parameter receives them as one `Shared`; one that does not, only its own. Put `guarded_command` above it."""

    def decorate(fn: Callable) -> Callable:
        parameters = inspect.signature(fn, eval_str=True).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            raise TypeError(f"{fn.__name__}: take the shared options as `shared: Shared`, not **kwargs")
        own = [p for p in parameters.values() if p.name != "shared"]
        taken = {p.name for p in own}
        added = {name: (annotation, defaults.get(name, default)) for group in groups
                 for name, (annotation, default) in group.items() if name not in taken}
        wants = "shared" in parameters

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in list(kwargs) if name in added}
            if wants:
                flags = {name: given.pop(name) for name in LOGGING_OPTIONS if name in given}
                kwargs["shared"] = Shared(given, **flags)
            return fn(*args, **kwargs)

        command.__signature__ = inspect.Signature([*own, *(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
            for name, (annotation, default) in added.items())])
        return command

    return decorate


def preservation_choice(on: bool, review_above: float | None) -> PreservationChoice:
    """`--preservation/--no-preservation` and `--review-above PERCENT`, checked once (usage errors, exit 2)."""
    from ootd.app.tryon.preservation import PreservationChoice
    from ootd.evaluation.settings import check_review_above

    if review_above is not None and not on:
        raise UsageError("--review-above marks try-ons by their preservation figures: leave out --no-preservation")
    return PreservationChoice(on, check_review_above(review_above))


def config_from(options: Mapping[str, Any], *, quiet: bool = False) -> RunConfig:
    """The RunConfig from a command's settings (other entries are left alone); says in one line when a few-step
    adapter's own sampling applies (unless `quiet`), after refusing one distilled from other base weights."""
    config = build_config(**{name: word for name, word in options.items() if name in SETTINGS})
    notice = config.lora_notice(cli_name)
    if notice is not None:
        read_choice(config.lora, config.checkpoints)  # refused in one line first, on other base weights
        if not quiet:
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


def checked_config(options: Mapping[str, Any], *, quiet: bool = False) -> RunConfig:
    """`config_from` plus the device and precision checked against this machine (usage errors, exit 2)."""
    from ootd.app.tryon.loader import check_hardware

    config = config_from(options, quiet=quiet)
    check_hardware(config, option_source("device"))
    return config


ModelsOpt = Annotated[str, typer.Option("--models", metavar="hd,dc", help="Model types: hd, dc or hd,dc.")]
ALL_MODELS = ",".join(MODEL_TYPES)


def parse_model_list(models: str) -> list[ModelType]:
    """'hd,dc' -> [ModelType.HD, ModelType.DC] (the --models option of download, verify and doctor)."""
    from ootd.weights.download import parse_models

    return parse_models([m for m in models.split(",") if m.strip()])
