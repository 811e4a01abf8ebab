"""What each speed mode is set to, with its bounds and its check (declared once, here), the modes together
(`SpeedModes`), the presets `exact` and `fast`, and how explicit options combine with a preset.

Imported at `--help` time, so no torch here: each mode's hook (token_merge.py, feature_cache.py, quantize.py,
execution.py) imports its settings from this module. A preset fills the options a user left out; an option given
explicitly wins. `--speed exact` with an option that changes the images is refused: exact is a guarantee. What ran
is described by `SpeedModes.label()`: the preset whose values it matches, else `custom`; outputs record it with
every option (PNG text, JSON: ootd/app/tryon/record.py).

Precision is not part of a preset: `--precision auto` already picks the fastest dtype that is safe on the device
(bf16 on CPUs with bf16 matrix units, fp16 on GPUs), and `--precision fp32` gives fp32 numbers in any preset.
The values of `fast` are the ones measured in docs/benchmarks.md ("Speed modes").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ootd.errors import UsageError
from ootd.settings import QuantizeName, SpeedPreset


@dataclass(frozen=True)
class TokenMerge:
    """Token merging (token_merge.py): this fraction of the finest attention level's person tokens merged.

    With one destination per 2x2 cell a quarter of the tokens are destinations, so MAX merges every other token
    into one of them. 0 is the exact path (nothing installed)."""

    ratio: float = 0.0
    MAX = 0.75

    def __post_init__(self) -> None:
        ratio = float(self.ratio)  # one spelling in the outputs' records: 0 and 0.0 are both "0.0"
        if not 0.0 <= ratio <= self.MAX:
            raise UsageError.about("token_merge", "{@token_merge|token merge ratio} must be between 0 (exact) and "
                                   "{most}, got {value}", value=self.ratio, most=self.MAX)
        object.__setattr__(self, "ratio", ratio)

    @property
    def on(self) -> bool:
        return self.ratio > 0


@dataclass(frozen=True)
class FeatureCache:
    """Feature caching (feature_cache.py): the try-on UNet's deep levels recomputed every `interval`-th step
    only. 1 is the exact path (nothing installed)."""

    interval: int = 1
    MAX = 10

    def __post_init__(self) -> None:
        if not 1 <= self.interval <= self.MAX:
            raise UsageError.about("cache_interval", "{@cache_interval|cache interval} must be between 1 (exact) "
                                   "and {most}, got {value}", value=self.interval, most=self.MAX)

    @property
    def on(self) -> bool:
        return self.interval > 1


@dataclass(frozen=True)
class SpeedModes:
    """Every speed option together. token_merge, feature_cache and quantize change what is computed;
    channels_last and compile only how (None: the device profile's choice)."""

    token_merge: TokenMerge = field(default_factory=TokenMerge)
    feature_cache: FeatureCache = field(default_factory=FeatureCache)
    quantize: QuantizeName = QuantizeName.NONE  # quantize.py: the UNets' Linear weights
    channels_last: bool | None = None  # execution.py: NHWC activations (CPU GroupNorm rounds differently)
    compile: bool | None = None  # execution.py: torch.compile the try-on UNet

    def label(self) -> str:
        """The preset these modes are, else `custom`."""
        for name, preset in PRESETS.items():
            if all(getattr(preset, f.name) is None or getattr(preset, f.name) == getattr(self, f.name)
                   for f in fields(self)):
                return name.value
        return "custom"


PRESETS: dict[SpeedPreset, SpeedModes] = {
    SpeedPreset.EXACT: SpeedModes(),
    SpeedPreset.FAST: SpeedModes(token_merge=TokenMerge(0.5), feature_cache=FeatureCache(3)),
}
_SAME_COMPUTATION = ("channels_last", "compile")  # options `speed` exact allows


def _switch(word: object) -> bool:
    return bool(word)


# each speed setting (the names of ootd/app/tryon/settings.py's declarations) -> its field of SpeedModes, the check
# that makes its value, and how that value is told back in a message (None: it does not change the images)
MODES: dict[str, tuple[str, Callable[[Any], Any], Callable[[Any], Any] | None]] = {
    "token_merge": ("token_merge", TokenMerge, lambda mode: mode.ratio),
    "cache_interval": ("feature_cache", FeatureCache, lambda mode: mode.interval),
    "quantize": ("quantize", QuantizeName.parse, lambda mode: mode.value),
    "channels_last": ("channels_last", _switch, None),
    "compile": ("compile", _switch, None),
}


def resolve_speed(preset: str | SpeedPreset | None = None, **words: Any) -> SpeedModes:
    """The preset (None: exact) with the speed settings the user gave explicitly (MODES' names; None: not given)
    on top; each setting's own check runs here, once."""
    unknown = sorted(set(words) - set(MODES))
    if unknown:
        raise TypeError(f"no speed setting named {unknown[0]!r}")
    chosen = SpeedPreset.parse(preset) if preset is not None else SpeedPreset.EXACT
    given = {name: MODES[name][1](word) for name, word in words.items() if word is not None}
    modes = replace(PRESETS[chosen], **{MODES[name][0]: value for name, value in given.items()})
    if preset is not None and chosen is SpeedPreset.EXACT:
        exact = PRESETS[SpeedPreset.EXACT]
        changed = [name for name, value in given.items()
                   if MODES[name][0] not in _SAME_COMPUTATION and value != getattr(exact, MODES[name][0])]
        if changed:
            # each changed setting as `{@token_merge} 0.5`: the user's own words in every front end
            named = {f"value_{name}": MODES[name][2](given[name]) for name in changed}
            said = ", ".join(f"{{@{name}}} {{value_{name}}}" for name in changed)
            raise UsageError.about("speed", "{@speed} exact keeps the exact method; " + said + " changes the "
                                   "images: drop one of them", value=chosen, **named)
    return modes
