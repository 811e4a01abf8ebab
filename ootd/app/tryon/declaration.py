"""How a setting is declared (`Setting`, with what pictures record of it: `Recorded`), the registry of them in
order (`Settings`), and the names of the front ends that may offer one. The declarations themselves are in
settings.py.

No torch here: the CLI reads this at `--help` time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ootd.errors import Namer, UsageError, fill

# The front ends that may offer a setting: the CLI's commands, the HTTP API's form, ComfyUI's nodes (the try-on, the
# loader, the mask and the garment category nodes)
RUN, BATCH, SERVE, MASK, BENCH, CLASSIFY = "run", "batch", "serve", "mask", "bench", "classify"
API, NODE, LOADER_NODE, MASK_NODE, CLASSIFY_NODE = "api", "node", "loader_node", "mask_node", "classify_node"
NODES = (NODE, LOADER_NODE, MASK_NODE, CLASSIFY_NODE)
FRONT_ENDS = (RUN, BATCH, SERVE, MASK, BENCH, CLASSIFY, API, *NODES)
# `--help`'s panels
SAMPLING, HARDWARE, INPUTS, OUTPUTS = "Sampling", "Hardware", "Inputs", "Outputs"
SPEED = "Speed (exact by default; the modes change the images: judge them with `ootd compare`)"
# where the values of a group of settings live in a RunConfig (each group's owner checks its settings together)
GROUPS = ("sampling", "speed", "photo", "lora")


@dataclass(frozen=True)
class Recorded:
    """One key a picture's record holds of a setting: its PNG word and its JSON value, each from the value where
    the setting lives in the pass's RunConfig (its group's value: SamplingSettings, SpeedModes, PhotoOutput, the
    LoraChoice; or the setting's own); None: not written (then `absent` is what the record means)."""

    key: str
    text: Callable[[Any], str | None]
    json: Callable[[Any], Any] | None = None  # None: not among the JSON settings
    absent: str | None = None  # what a record without this key means (older files; keys written only sometimes)
    pixels: bool = False  # the key records what determines the pixels: resume and `ootd compare` compare it
    compared: bool = False  # compared too (by `ootd compare` and resume's report), though not the pixels'
    per_pass: bool = False  # each pass of an outfit may differ in it (an outfit shares the others)


def recorded(key: str, *, pixels: bool = False, absent: str | None = None) -> tuple[Recorded, ...]:
    """The record of a setting whose value is a plain word or number: written as `str(value)`, in JSON as it
    is (a declaration's `record=recorded("eta", pixels=True)`)."""
    return (Recorded(key, lambda value: None if value is None else str(value), lambda value: value, absent=absent,
                     pixels=pixels),)


@dataclass(frozen=True)
class Setting:
    """One setting, declared once. `name` is build_config's keyword, the API's form field, a node's input and
    what errors call it (`{@name}`)."""

    name: str
    kind: type  # the type of the word a front end receives: int, float, str (with `choices`), bool, Path
    default: Any  # the word a front end starts from; None: left out (then `omitted` applies, or `default_text`)
    help: str  # one line; names other settings as `{@name}` (each front end words them)
    label: str = ""  # the setting in a sentence ("fit mode"); default: the name with spaces
    minimum: float | None = None
    maximum: float | None = None
    below_maximum: bool = False  # `maximum` itself is not allowed
    choices: tuple[str, ...] = ()  # the words it takes (a closed set)
    flags: tuple[str, ...] = ()  # the CLI's: the long one first ("--samples", "-n"; a switch "--x/--no-x")
    metavar: str | None = None
    panel: str = ""
    envvar: str | None = None
    offered: frozenset[str] = frozenset()  # FRONT_ENDS that offer it
    home: str | None = None  # where the value lives in a RunConfig: "fit", "sampling.steps"; None: `extras`
    parse: Callable[[Any], Any] | None = None  # the owner's check, word -> value (settings outside GROUPS)
    record: tuple[Recorded, ...] = ()
    omitted: Any = None  # the value that applies when the setting is left out, where that is one value
    default_text: str | None = None  # the default in words, where it is not a value (docs, help)
    range_text: str | None = None  # the bounds in words, where `minimum to maximum` would not read well

    @property
    def group(self) -> str | None:
        """The group whose owner checks this setting with the others (GROUPS), None for one on its own."""
        return self.home.split(".")[0] if self.home and "." in self.home else None

    @property
    def key(self) -> str:
        """Its keyword in its group's owner (`num_samples` of SamplingSettings), else its RunConfig field."""
        return self.home.rsplit(".", 1)[-1] if self.home else self.name

    @property
    def shown_label(self) -> str:
        return self.label or self.name.replace("_", " ")

    @property
    def flag(self) -> str | None:
        """The long CLI flag (`--channels-last` of `--channels-last/--no-channels-last`), None if there is none."""
        long = next((f for f in self.flags if f.startswith("--")), None)
        return long.split("/")[0] if long else None

    def help_in(self, name: Namer) -> str:
        """The help, each setting it names worded by a front end's `name`."""
        return fill(self.help, name)

    def default_words(self) -> str:
        """The default as docs and help tell it: `default_text`, else the default itself (`off` for a switch)."""
        if self.default_text is not None:
            return self.default_text
        if self.kind is bool:
            return "on" if self.default else "off"
        return str(self.default)

    def bounds(self) -> str | None:
        """`0 to 512`, `0 up to (not including) 1`; None without bounds."""
        if self.range_text is not None:
            return self.range_text
        if self.minimum is None or self.maximum is None:
            return None
        if self.below_maximum:
            return f"{self.minimum:g} up to (not including) {self.maximum:g}"
        return f"{self.minimum:g} to {self.maximum:g}"

    def check(self, word: Any) -> Any:
        """A word of a setting without an owner of its own (`extras`): of its kind, within its bounds and
        choices; None stays None."""
        if word is None:
            return None
        try:
            value = self.kind(word) if self.kind is not bool or isinstance(word, bool) else _flag(word)
        except (TypeError, ValueError):
            raise UsageError.about(self.name, "{@" + self.name + "} must be " + _kind_words(self.kind) +
                                   ", got {value}", value=word) from None
        low, high = self.minimum, self.maximum
        if (low is not None and value < low) or (high is not None and (value >= high if self.below_maximum
                                                                         else value > high)):
            raise UsageError.about(self.name, "{@" + self.name + "} must be {bounds}, got {value}", value=word,
                                   bounds=self.bounds())
        if self.choices and str(value) not in self.choices:
            raise UsageError.about(self.name, "unknown {label} {value!r}: use one of {words}", value=word,
                                   label=self.shown_label, words=", ".join(self.choices))
        return value

    def describe(self, name: Namer | None = None) -> dict[str, Any]:
        """What a front end builds an input from (a ComfyUI node, a form, docs): machine-readable facts, the help
        worded by `name` (default: the API's field names, which a node's inputs take)."""
        return {"name": self.name, "type": _TYPES[self.kind], "default": self.default, "omitted": self.omitted,
                "minimum": self.minimum, "maximum": self.maximum, "exclusive_maximum": self.below_maximum,
                "choices": list(self.choices), "help": self.help_in(name or _field_name),
                "label": self.shown_label, "flag": self.flag, "record": [r.key for r in self.record],
                "pixels": any(r.pixels for r in self.record), "offered": sorted(self.offered)}

    def json_schema(self, name: Namer | None = None) -> dict[str, Any]:
        """This setting as a JSON Schema property (an OpenAPI form field): type, description, bounds, choices."""
        schema: dict[str, Any] = {"type": _TYPES[self.kind] if self.kind is not Path else "string",
                                  "description": self.help_in(name or _field_name)}
        if self.choices:
            schema["enum"] = list(self.choices)
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["exclusiveMaximum" if self.below_maximum else "maximum"] = self.maximum
        return schema


_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", Path: "path"}
# the words a switch takes as a word (`check`; the HTTP API's form fields)
FLAG_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
              "off": False}


def _flag(word: Any) -> bool:
    key = str(word).strip().lower()
    if key not in FLAG_WORDS:
        raise ValueError(word)
    return FLAG_WORDS[key]


def _kind_words(kind: type) -> str:
    return {int: "a whole number", float: "a number", bool: "true or false"}.get(kind, "a word")


def _field_name(name: str) -> str:
    return name


class Settings:
    """The declarations in order (the order of `--help`, of a record's keys and of the docs' tables)."""

    def __init__(self, *settings: Setting) -> None:
        self._settings = {one.name: one for one in settings}

    def __iter__(self) -> Iterator[Setting]:
        return iter(list(self._settings.values()))

    def __getitem__(self, name: str) -> Setting:
        return self._settings[name]

    def __contains__(self, name: object) -> bool:
        return name in self._settings

    def add(self, setting: Setting) -> None:
        """Declare one more setting (what every front end built afterwards offers); a name is declared once."""
        if setting.name in self._settings:
            raise ValueError(f"setting {setting.name!r} is declared already")
        self._settings[setting.name] = setting

    def offered_by(self, front_end: str) -> list[Setting]:
        return [one for one in self if front_end in one.offered]

    def recorded(self) -> Iterator[tuple[Setting, Recorded]]:
        """Every record key, with its setting, in the order pictures record them."""
        return ((one, kept) for one in self for kept in one.record)

    def flag(self, name: str) -> str | None:
        """The CLI's word for a setting (`--mask-grow`), None if it has no flag or is not declared."""
        return self._settings[name].flag if name in self._settings else None

    def check_words(self, words: dict[str, Any]) -> None:
        """A TypeError for a keyword that names no setting (as a function's own keywords would)."""
        unknown = sorted(set(words) - set(self._settings))
        if unknown:
            raise TypeError(f"no setting named {unknown[0]!r}")


def value_of(setting: Setting, config: Any) -> Any:
    """Where `setting`'s value lives in `config` (a RunConfig): its group's value or its own (None: a group that
    is not there, as a config without an adapter)."""
    if setting.home is None:
        return dict(config.extras).get(setting.name)
    return getattr(config, setting.home.split(".")[0])
