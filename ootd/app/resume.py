"""The resume rule every batch engine shares: is a pair already done, with the settings asked for now?

Every PNG ootd writes records the settings that made its pixels (ootd/app/outputs.py `png_metadata`). A pair is
done only when all its outputs exist and record the same settings as this run would use; outputs made
with other settings are `stale`, and the batch refuses to start rather than mix them up or replace them (the
user picks: the old settings, --overwrite, another --output, or a --name template that tells them apart).
Device, precision and attention backend are not compared: they change pixels only by rounding, and a batch
resumed on another machine should not redo its work. When the seed was drawn at random, it is not compared
either: the files' seed is kept for the rest of the batch (see BatchRunner).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ootd.app.config import RunConfig
from ootd.config import QuantizeName, SamplingSettings

if TYPE_CHECKING:
    from ootd.app.outputs import Targets
    from ootd.app.tryon import TryOnRequest

# the PNG text keys that record what determines the pixels (and which inputs they came from)
PIXEL_SETTINGS = ("model_type", "category", "samples", "steps", "scale", "seed", "resolution", "scheduler",
                  "cache_interval", "token_merge", "quantize", "person", "garment", "mask", "fit", "mask_grow")
# what a key means when an output does not record it (written before the key existed)
RECORDED_DEFAULTS = {"cache_interval": str(SamplingSettings.cache_interval),
                     "token_merge": str(SamplingSettings.token_merge), "quantize": QuantizeName.NONE.value}


@dataclass(frozen=True)
class ResumeState:
    """What the files on disk say about one pair: `todo` (some or all missing), `done` or `stale`."""

    status: str
    seed: int | None = None  # the seed the existing files were made with
    reason: str | None = None  # why they are stale, one line


def expected_settings(request: TryOnRequest, config: RunConfig) -> dict[str, str]:
    """The PNG text this run would write for the request, for the keys in PIXEL_SETTINGS (as the pipeline and
    png_metadata format them)."""
    sampling = config.sampling
    expected = {
        "model_type": config.model_type_for(request.category).value, "category": request.category.value,
        "samples": str(sampling.num_samples), "steps": str(sampling.steps), "scale": str(sampling.guidance_scale),
        "seed": str(sampling.seed), "resolution": str(sampling.resolution), "scheduler": str(sampling.scheduler),
        "cache_interval": str(sampling.cache_interval), "token_merge": str(sampling.token_merge),
        "quantize": config.quantize.value,
        "person": request.name("person"), "garment": request.name("garment"),
        "mask": request.name("mask") if request.mask is not None else "auto",
        "fit": str(config.fit), "mask_grow": str(config.mask_grow),
    }
    if config.seed_random:
        del expected["seed"]
    return expected


def recorded_settings(path: Path) -> dict[str, str]:
    """The PNG text of an output ({} when it has none or cannot be read)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            # the chunks before the pixels, as ootd writes them: no decoding (`im.text` would decode the image)
            found = {str(k): v for k, v in im.info.items() if isinstance(v, str)}
            if "software" not in found:  # text written after the pixels by another tool
                found = dict(getattr(im, "text", None) or {})
            return {str(k): str(v) for k, v in found.items()}
    except (OSError, ValueError, SyntaxError):
        return {}


def _differences(recorded: dict[str, str], expected: dict[str, str]) -> str | None:
    if not recorded.get("software", "").startswith("ootd"):
        return "it records no ootd settings"
    recorded = {**RECORDED_DEFAULTS, **recorded}
    diffs = [f"{key} {recorded.get(key, 'unknown')} (now {value})" for key, value in expected.items()
             if recorded.get(key) != value]
    return ", ".join(diffs[:3]) + (" ..." if len(diffs) > 3 else "") if diffs else None


def resume_state(targets: Targets, expected: dict[str, str]) -> ResumeState:
    """The rule: `done` when every output (samples, intermediates, grid) exists and records `expected`; `stale`
    when an existing one records something else; `todo` otherwise (only the missing files will be written)."""
    wanted = targets.all()
    existing = [p for p in wanted if p.exists()]
    seeds: set[str] = set()
    for path in existing:
        recorded = recorded_settings(path)
        problem = _differences(recorded, expected)
        if problem is not None:
            return ResumeState("stale", reason=f"{path} was made with {problem}")
        seeds.add(recorded.get("seed", ""))
    if len(seeds) > 1:
        return ResumeState("stale", reason=f"{existing[0]} and the other samples were made with different seeds "
                                           f"({', '.join(sorted(seeds))})")
    seed = next(iter(seeds), "")
    return ResumeState("done" if existing and len(existing) == len(wanted) else "todo",
                       int(seed) if seed.isdigit() else None)


def stale_error(count: int, example: str) -> str:
    """The one line a batch refuses with."""
    return (f"{count} pair(s) have outputs made with other settings ({example}); rerun with those settings to "
            "resume, or use --overwrite to redo them, another --output, or a --name with the changed field "
            "(e.g. {steps})")
