"""Speed presets: `exact` (the default: the method as published, today's numbers) and `fast` (the opt-in modes
that change the images, combined), and how explicit options combine with them.

A preset fills the speed options the user left out; an option given explicitly wins. `--speed exact` with an
option that changes the images is refused: exact is a guarantee. What ran is described by `SpeedModes.label()`:
the preset whose values it matches, else `custom`; outputs record it with every option (PNG text, JSON).

Precision is not part of a preset: `--precision auto` already picks the fastest dtype that is safe on the device
(bf16 on CPUs with bf16 matrix units, fp16 on GPUs), and `--precision fp32` gives fp32 numbers in any preset.
The values of `fast` are the ones measured in docs/benchmarks.md ("Speed modes").
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ootd.config import QuantizeName, SpeedPreset, check_cache_interval, check_token_merge
from ootd.errors import UsageError


@dataclass(frozen=True)
class SpeedModes:
    """The speed options that change what is computed; None (channels_last only) means the device profile's."""

    token_merge: float = 0.0  # ootd/token_merge.py: fraction of the finest level's person tokens merged
    cache_interval: int = 1  # ootd/feature_cache.py: deep UNet levels every N-th step
    quantize: QuantizeName = QuantizeName.NONE  # ootd/quantize.py: the UNets' Linear weights
    channels_last: bool | None = None  # NHWC activations: faster convolutions, CPU GroupNorm rounds differently

    def validate(self) -> None:
        check_token_merge(self.token_merge)
        check_cache_interval(self.cache_interval)

    def label(self) -> str:
        """The preset these modes are, else `custom`."""
        for name, preset in PRESETS.items():
            if all(getattr(preset, f.name) is None or getattr(preset, f.name) == getattr(self, f.name)
                   for f in fields(self)):
                return name.value
        return "custom"

    def words(self) -> dict[str, str]:
        """What outputs record (PNG text keys; JSON turns the numbers back into numbers)."""
        return {"speed": self.label(), "token_merge": str(self.token_merge),
                "cache_interval": str(self.cache_interval), "quantize": self.quantize.value}


def speed_summary(recorded: dict[str, str]) -> str:
    """`speed fast (token merge 0.5, cache interval 3)` from an output's recorded settings; empty when exact."""
    speed = recorded.get("speed", SpeedPreset.EXACT.value)
    if speed == SpeedPreset.EXACT.value:
        return ""
    exact = PRESETS[SpeedPreset.EXACT].words()
    on = [f"{key.replace('_', ' ')} {recorded[key]}" for key in ("token_merge", "cache_interval", "quantize")
          if key in recorded and recorded[key] != exact[key]]
    return f"speed {speed}" + (f" ({', '.join(on)})" if on else "")


PRESETS: dict[SpeedPreset, SpeedModes] = {
    SpeedPreset.EXACT: SpeedModes(),
    SpeedPreset.FAST: SpeedModes(token_merge=0.5, cache_interval=3),
}


def resolve_speed(preset: str | SpeedPreset | None = None, *, token_merge: float | None = None,
                  cache_interval: int | None = None, quantize: str | QuantizeName | None = None,
                  channels_last: bool | None = None) -> SpeedModes:
    """The preset (None: exact) with the options the user gave explicitly (None: not given) on top."""
    chosen = SpeedPreset.parse(preset) if preset is not None else SpeedPreset.EXACT
    given = {"token_merge": float(token_merge) if token_merge is not None else None, "cache_interval": cache_interval,
             "quantize": QuantizeName.parse(quantize) if quantize is not None else None,
             "channels_last": channels_last}
    given = {key: value for key, value in given.items() if value is not None}
    modes = replace(PRESETS[chosen], **given)
    modes.validate()
    if preset is not None and chosen is SpeedPreset.EXACT:
        exact = PRESETS[SpeedPreset.EXACT]
        changed = [f"--{key.replace('_', '-')} {value}" for key, value in given.items()
                   if key != "channels_last" and value != getattr(exact, key)]
        if changed:
            raise UsageError(f"--speed exact keeps the exact method; {', '.join(changed)} changes the images: "
                             "drop one of them")
    return modes
