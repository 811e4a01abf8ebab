"""The nodes' setting inputs, derived from the declarations (ootd/app/tryon/settings.py), and the nodes' words for
the library's messages. Nothing here imports ComfyUI: nodes.py turns each `Widget` into a V3 input, and tests read
the widgets without ComfyUI.

A node offers the settings declared as offered by it (`NODE`: the try-on, `LOADER_NODE`, `MASK_NODE`,
`CLASSIFY_NODE`), in the declarations' order, each named as declared (the HTTP API's form field), with its type,
bounds, choices, default and help as the tooltip. A widget always has a value, so a setting declared without a
default shows the value that applies when it is left out (`omitted`: `exact`, `working`, 4), or `auto` when none
does (the model type), or its minimum (the seed: ComfyUI draws seeds itself); a widget left at that value is
passed to `build_config` as left out. Declaring a setting as offered by a node is all it takes to add it there.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ootd import errors
from ootd.app.tryon.settings import NODES, SETTINGS, Setting
from ootd.errors import OotdError, worded

AUTO = "auto"  # a choice left out: what the setting's owner chooses (the model type: hd for upper, dc otherwise)
SEED = "seed"  # ComfyUI draws and changes seeds itself (`control_after_generate`)
# the nodes' own inputs (not settings), as messages name them
NODE_INPUTS = ("model", "person", "garment", "mask", "category", "garment2", "mask2", "category2")
# what the library's messages point to, in a node's words; None: the node has no word for it (the message's
# `otherwise` words apply): the checkpoints are chosen from ComfyUI's model folders, not typed as a flag's DIR
TERMS: dict[str, str | None] = {"automatic_mask": "the mask of an ootd Mask node", "checkpoints": None}


@dataclass(frozen=True)
class Widget:
    """One setting input of a node, as its declaration says: `kind` is int, float, bool, choice, path or text."""

    name: str
    kind: str
    default: Any
    tooltip: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    choices: tuple[str, ...] = ()
    left_out: Any = None  # the widget's value that means "left out" (passed as None), if it has one

    @property
    def seed(self) -> bool:
        return self.name == SEED


def node_name(name: str) -> str | None:
    """A node's word for a setting or an input a message names: `input steps` (the node's input of that name)."""
    if name in TERMS:
        return TERMS[name]
    offered = name in SETTINGS and any(node in SETTINGS[name].offered for node in NODES)
    return f"input {name}" if offered or name in NODE_INPUTS else None


@contextmanager
def node_errors() -> Iterator[None]:
    """ootd's errors as a node's: its class of ootd.errors, its one line in the node's words (`input steps`;
    ComfyUI shows the message, its log keeps the traceback)."""
    try:
        yield
    except OotdError as exc:
        kind = next(c for c in type(exc).__mro__ if c.__module__ == errors.__name__)
        raise kind(worded(exc, node_name)) from None


def _step(setting: Setting) -> float:
    """A float widget's step: about a hundredth of its range, a power of ten (scale 0-50: 0.1, a margin: 0.01)."""
    span = (setting.maximum or 1.0) - (setting.minimum or 0.0)
    return 10.0 ** (math.floor(math.log10(span)) - 2) if span > 0 else 0.01


def widget(setting: Setting) -> Widget:
    """A setting as a node's input, from its declaration."""
    facts = setting.describe()  # the help in the API's field names: a node's inputs
    default = setting.default if setting.default is not None else setting.omitted
    left_out = setting.omitted if setting.default is None else None
    common = {"name": setting.name, "tooltip": facts["help"]}
    if setting.choices:
        if default is None:
            return Widget(kind="choice", default=AUTO, choices=(AUTO, *setting.choices), left_out=AUTO, **common)
        return Widget(kind="choice", default=str(default), choices=tuple(setting.choices), left_out=left_out,
                      **common)
    if setting.kind is bool:
        return Widget(kind="bool", default=bool(default), left_out=left_out, **common)
    if setting.kind in (int, float):
        step = 1 if setting.kind is int else _step(setting)
        low, high = setting.minimum, setting.maximum
        if high is not None and setting.below_maximum:
            high = round(high - step, 10)
        start = default if default is not None else (low if low is not None else 0)
        return Widget(kind=setting.kind.__name__, default=setting.kind(start), low=low, high=high,
                      step=step if setting.kind is float else None, left_out=left_out, **common)
    kind = "path" if setting.kind is Path else "text"
    return Widget(kind=kind, default="" if default is None else str(default), left_out="", **common)


def widgets(node: str) -> list[Widget]:
    """The setting inputs of `node` (NODE, LOADER_NODE, MASK_NODE, CLASSIFY_NODE), in the declarations' order."""
    return [widget(setting) for setting in SETTINGS.offered_by(node)]


def config_words(node: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """A node's setting values -> `build_config` keywords: each setting `node` offers that `values` holds, a
    widget left at its "left out" value as None (then the setting's own default applies)."""
    words: dict[str, Any] = {}
    for one in widgets(node):
        if one.name not in values:
            continue
        value = values[one.name]
        if one.left_out is not None and value == one.left_out:
            value = None
        words[one.name] = Path(value).expanduser() if one.kind == "path" and value is not None else value
    return words
