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

from dataclasses import dataclass, field, fields, replace

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
# each mode's field of SpeedModes -> the setting that asks for it and how its value is told
_SETTING_OF = {"token_merge": ("token_merge", lambda v: v.ratio), "feature_cache": ("cache_interval",
               lambda v: v.interval), "quantize": ("quantize", lambda v: v.value)}


def resolve_speed(preset: str | SpeedPreset | None = None, *, token_merge: float | None = None,
                  cache_interval: int | None = None, quantize: str | QuantizeName | None = None,
                  channels_last: bool | None = None, compile: bool | None = None) -> SpeedModes:
    """The preset (None: exact) with the options the user gave explicitly (None: not given) on top; each
    option's own check runs here, once."""
    chosen = SpeedPreset.parse(preset) if preset is not None else SpeedPreset.EXACT
    given = {"token_merge": TokenMerge(token_merge) if token_merge is not None else None,
             "feature_cache": FeatureCache(cache_interval) if cache_interval is not None else None,
             "quantize": QuantizeName.parse(quantize) if quantize is not None else None,
             "channels_last": channels_last, "compile": compile}
    given = {key: value for key, value in given.items() if value is not None}
    modes = replace(PRESETS[chosen], **given)
    if preset is not None and chosen is SpeedPreset.EXACT:
        exact = PRESETS[SpeedPreset.EXACT]
        changed = [key for key, value in given.items()
                   if key not in _SAME_COMPUTATION and value != getattr(exact, key)]
        if changed:
            # each changed setting as `{@token_merge} 0.5`: the user's own words in every front end
            named = {f"value_{key}": _SETTING_OF[key][1](given[key]) for key in changed}
            said = ", ".join(f"{{@{_SETTING_OF[key][0]}}} {{value_{key}}}" for key in changed)
            raise UsageError.about("speed", "{@speed} exact keeps the exact method; " + said + " changes the "
                                   "images: drop one of them", value=chosen, **named)
    return modes
