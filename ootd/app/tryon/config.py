"""RunConfig: everything a try-on needs besides its inputs, and build_config: user words -> a validated config.

Every setting is declared once, in ootd/app/tryon/settings.py (its default, bounds, help, flag, field, record);
`build_config` and `update_config` are derived from those declarations: each word is parsed once, by the owner of
its setting (a group's owner checks its settings together: SamplingSettings, the speed modes, PhotoOutput, the
LoRA choice), and travels down typed. Validation is cheap and runs before anything is loaded, so a bad option
fails in one line at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.app.tryon.settings import GROUPS, SETTINGS
from ootd.app.tryon.sizes import ByteSize, parse_size
from ootd.errors import Namer, library_name
from ootd.settings import (
    AttentionName,
    Category,
    FitMode,
    ModelType,
    ParsingProvider,
    PhotoOutput,
    PrecisionName,
    SamplingSettings,
    check_model_category,
    default_model_type,
)
from ootd.speedups.modes import SpeedModes, resolve_speed
from ootd.weights.fewstep import SAMPLING_WORDS, fill_sampling, notice
from ootd.weights.lora import LoraChoice

if TYPE_CHECKING:
    from ootd.runtime import RuntimeRequest

__all__ = ["ByteSize", "RunConfig", "build_config", "parse_size", "update_config"]


def _default(name: str) -> Any:
    """A setting's declared default, parsed by its owner: RunConfig's defaults are the declarations'."""
    one = SETTINGS[name]
    return one.parse(one.default) if one.parse is not None else one.default


@dataclass(frozen=True)
class RunConfig:
    """Everything a try-on needs besides its inputs (the defaults here are the defaults of every front end)."""

    checkpoints: Path  # the released layout (docs/upstream.md §1)
    output: Path = _default("output")  # folder for results, created if needed
    sampling: SamplingSettings = field(default_factory=SamplingSettings)  # seed drawn before the work starts
    speed: SpeedModes = field(default_factory=SpeedModes)  # exact unless asked (ootd/speedups/modes.py)
    model_type: ModelType | None = None  # None: hd for upper-body garments, dc otherwise
    device: str | None = None  # None: the best available
    precision: PrecisionName = _default("precision")  # auto follows the device profile
    attention: AttentionName = _default("attention")
    parsing_provider: ParsingProvider = _default("parsing_provider")  # ONNX Runtime provider for human parsing
    max_memory: ByteSize | None = None  # bytes the memory plan may use; None: free device memory less a margin
    fit: FitMode = _default("fit")  # how non-3:4 inputs are framed
    mask_grow: int = _default("mask_grow")  # extra pixels (at 512 px height) added around the mask
    save_intermediates: bool = _default("save_intermediates")  # pose, parsing, mask, masked person beside them
    overwrite: bool = _default("overwrite")  # replace existing outputs (else: run refuses, batch skips/keeps them)
    name_template: str = _default("name")  # output names (fields: ootd.app.tryon.naming.NAME_FIELDS)
    grid: bool = _default("grid")  # also write a contact sheet (person | garment | mask | samples) per try-on
    category_margin: float = _default("category_margin")  # `auto`: the lead over the 2nd category it needs
    preservation: bool = _default("preservation")  # measure what each try-on changed of its photo (after the job)
    seed_random: bool = False  # the seed was drawn, not given: a resumed batch keeps the seed its files record
    lora: LoraChoice | None = None  # an adapter `ootd train` wrote, merged at its scale when the models load
    # -- few-step adapters (`ootd train distill`): the sampling settings taken from the adapter, not given ------
    lora_sampling: tuple[str, ...] = ()
    photo: PhotoOutput = field(default_factory=PhotoOutput)  # working-size pictures, or the photo's (--keep-unmasked)
    # CPU threads of torch and ONNX Runtime. build_config fixes the number where the command starts, and every
    # engine's processes apply it, so a Ray worker sums floats in the same order as a local run (same bytes).
    # None: leave the process as it is (library use).
    threads: int | None = None
    # the values of declared settings that have no typed home of their own (a setting declared with `home=None`),
    # by name: the code that implements such a setting reads `extra(name)`
    extras: tuple[tuple[str, Any], ...] = ()

    @property
    def runtime_request(self) -> RuntimeRequest:
        """Where and how to run, as this config asks it (resolved by ootd/runtime.py, once per model owner)."""
        from ootd.runtime import RuntimeRequest  # imports torch: not at --help time

        speed = self.speed
        return RuntimeRequest(device=self.device, precision=self.precision, attention=self.attention,
                              quantize=speed.quantize, channels_last=speed.channels_last, compile=speed.compile,
                              threads=self.threads)

    def extra(self, name: str) -> Any:
        """The value of a declared setting kept in `extras` (None: not given)."""
        return dict(self.extras).get(name)

    def lora_notice(self, name: Namer = library_name) -> str | None:
        """The one line a front end says when a few-step adapter's own sampling applies (None otherwise), the
        settings given instead worded by `name`."""
        if self.lora is None or self.lora.few_step is None:
            return None
        return notice(self.lora.path.name, self.lora.few_step, self.lora_sampling, name)

    def model_type_for(self, category: Category) -> ModelType:
        """The model for a category: the forced one (if compatible) or the default (hd upper, dc otherwise)."""
        model_type = self.model_type or default_model_type(category)
        check_model_category(model_type, category)
        return model_type


# how each group's settings become its value: made from words (build_config) or updated by some (update_config);
# the sampling group is made last, from its words and the adapter's (`_sampling`)
_MADE: dict[str, Callable[..., Any]] = {"speed": resolve_speed, "photo": PhotoOutput.from_words,
                                        "lora": LoraChoice.parse}


def _sampling(lora: LoraChoice | None, words: Mapping[str, Any]) -> tuple[SamplingSettings, tuple[str, ...]]:
    """The sampling settings of `words` (by SamplingSettings' keywords; steps, scale and scheduler None: not
    given), those not given taken from a few-step adapter's own (ootd/weights/fewstep.py) or the defaults; and the
    names of the settings taken from the adapter."""
    named = {name: words.get(key) for name, key in SAMPLING_WORDS.items()}
    filled, taken = fill_sampling(lora.few_step if lora is not None else None, named)
    rest = {key: word for key, word in words.items() if key not in SAMPLING_WORDS.values()}
    return SamplingSettings.from_words(**rest, **{SAMPLING_WORDS[name]: word for name, word in filled.items()}), taken


def _speed_updated(current: SpeedModes, **words: Any) -> SpeedModes:
    given = {key: word for key, word in words.items() if word is not None}
    return resolve_speed(**given) if given else current


def _lora_updated(current: LoraChoice | None, path: Any = None, scale: Any = None) -> LoraChoice | None:
    if path is None and scale is None:
        return current
    return LoraChoice.parse(path, scale if scale is not None else LoraChoice.scale)


_UPDATED: dict[str, Callable[..., Any]] = {"sampling": lambda current, **words: current.updated(**words),
                                           "speed": _speed_updated, "photo": PhotoOutput.updated,
                                           "lora": _lora_updated}


def _sorted(words: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Words by where they go: each group's (by its owner's keyword), RunConfig's fields (parsed by their owners),
    and `extras` (checked against their declarations)."""
    groups: dict[str, dict[str, Any]] = {}
    fields: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for name, word in words.items():
        one = SETTINGS[name]
        if one.group is not None:
            groups.setdefault(one.group, {})[one.key] = word
        elif one.home is None:
            extras[name] = one.check(word)
        else:
            fields[one.home] = one.parse(word) if one.parse is not None else word
    return groups, fields, extras


def build_config(*, checkpoints: Path | str | None = None, **words: Any) -> RunConfig:
    """Validate every setting (cheap, before anything is loaded) into one RunConfig; a random seed is drawn here.

    Takes the words a user typed (as front ends receive them), by setting name (ootd/app/tryon/settings.py; an
    unknown name is a TypeError); a setting left out takes its declared default. Each bad word is a one-line
    UsageError naming its setting. The speed options left as None follow the `speed` preset (None: exact).
    `steps`, `scale` and `scheduler` None: a few-step adapter's own (ootd/weights/fewstep.py), else the defaults.
    `threads` None: the CPU threads torch uses in this process now (its physical cores, or $OMP_NUM_THREADS),
    fixed here so that the processes of every engine apply the same number.
    """
    SETTINGS.check_words(words)
    given = {**{one.name: one.default for one in SETTINGS}, **words, "checkpoints": checkpoints}
    groups, fields, extras = _sorted(given)
    made = {group: _MADE[group](**groups.get(group, {})) for group in GROUPS if group in _MADE}
    made["sampling"], taken = _sampling(made["lora"], groups.get("sampling", {}))
    return RunConfig(**fields, **made, lora_sampling=taken, extras=tuple(sorted(extras.items())),
                     seed_random=given["seed"] is None)


def update_config(base: RunConfig, words: Mapping[str, Any]) -> RunConfig:
    """`base` with the settings `words` gives on top (a request's, over a server's config): a None word keeps the
    base's value, except within a group, whose owner decides (a seed left out is drawn afresh; pictures at the
    photo's size keep the base's unless the request says otherwise). Checked as build_config checks."""
    SETTINGS.check_words(dict(words))
    groups, fields, extras = _sorted({name: word for name, word in words.items()
                                      if word is not None or SETTINGS[name].group is not None})
    made = {group: _UPDATED[group](getattr(base, group), **given) for group, given in groups.items()}
    return replace(base, **fields, **made, extras=tuple(sorted({**dict(base.extras), **extras}.items())))
