"""The PNG record: what every picture ootd writes says about how it was made, written and read here only.

Written as PNG text chunks before the pixels: `software` (what makes a file ours), the settings that determine
the pixels (model, category, sampling and speed modes, input names, framing, mask growth), then where they were
computed (device, precision, attention) and the sample number. The pipeline formats its own part with
`SamplingSettings.words()` and `SpeedModes.words()`, and `expected_record` builds the same keys from a config
with the same two methods, so a resumed batch compares like with like without restating any formatting.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from ootd import __version__
from ootd.speedups.modes import EXACT_WORDS
from ootd.weights.lora import NO_LORA

if TYPE_CHECKING:
    from ootd.app.tryon.config import RunConfig
    from ootd.app.tryon.outcome import TryOnOutcome
    from ootd.app.tryon.request import TryOnRequest
    from ootd.settings import Category, ModelType

SOFTWARE_KEY = "software"
SOFTWARE_PREFIX = "ootd"
# the keys that record what determines the pixels (and which inputs they came from): what resume compares
PIXEL_SETTINGS = ("model_type", "category", "samples", "steps", "scale", "seed", "resolution", "scheduler",
                  "cache_interval", "token_merge", "quantize", "person", "garment", "mask", "fit", "mask_grow",
                  "lora_sha256", "lora_scale")


def software() -> dict[str, str]:
    return {SOFTWARE_KEY: f"{SOFTWARE_PREFIX} {__version__}"}


def input_record(request: TryOnRequest, config: RunConfig) -> dict[str, str]:
    """Which inputs, and how they were framed and masked (and, for `--category auto`, that the category was
    classified and with which probability)."""
    record = {"person": request.name("person"), "garment": request.name("garment"),
              "mask": request.name("mask") if request.mask is not None else "auto",
              "fit": config.fit.value, "mask_grow": str(config.mask_grow)}
    if request.category_p is not None:
        record.update(category_source="auto", category_p=f"{request.category_p:.4f}")
    return record


def run_record(model_type: ModelType, category: Category, config: RunConfig) -> dict[str, str]:
    """The pipeline's own part of the record, as a run with `config` writes it (TryOnPipeline.generate)."""
    return {"model_type": model_type.value, "category": category.value, **config.sampling.words(),
            **config.speed.words(), **(config.lora.words() if config.lora is not None else NO_LORA)}


def png_record(outcome: TryOnOutcome, config: RunConfig, sample: int | None = None) -> dict[str, str]:
    """The record of one output of a finished try-on (`sample`: which image; None for intermediates)."""
    result, info = outcome.result, outcome.info
    record = {**software(), **{str(k): str(v) for k, v in (result.settings or {}).items()},
              "seed": str(result.seed), **input_record(outcome.request, config),
              "device": str(info.get("device", "")), "precision": str(info.get("precision", "")),
              "attention": str(info.get("attention", ""))}
    if sample is not None:
        record["sample"] = str(sample)
    return record


def mask_record(person_name: str, category: Category, model_type: ModelType, config: RunConfig) -> dict[str, str]:
    """The record of `ootd mask` outputs: what made the mask (a try-on with these settings makes the same)."""
    return {**software(), "person": person_name, "category": category.value, "model_type": model_type.value,
            "resolution": str(config.sampling.resolution), "fit": config.fit.value, "mask_grow": str(config.mask_grow)}


def expected_record(request: TryOnRequest, model_type: ModelType, config: RunConfig) -> dict[str, str]:
    """What a run with `config` would record for `request`, for the keys in PIXEL_SETTINGS (without the seed when
    it was drawn at random: a resumed batch keeps its files' seed)."""
    full = {**run_record(model_type, request.category, config), **input_record(request, config)}
    expected = {key: full[key] for key in PIXEL_SETTINGS}
    if config.seed_random:
        del expected["seed"]
    return expected


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HEAD_BYTES = 1 << 16  # ootd's record is 1-2 KB of text chunks between the header and the pixels


def read_record(path: Path) -> dict[str, str]:
    """The record of a PNG ({} for anything else, or a file that cannot be read): the text chunks before the
    pixels, as ootd writes them, without decoding the image.

    A resume reads one record per output, so the common case - plain tEXt chunks before the pixels, as Pillow
    writes ootd's records - is one read of the file's head and a walk over its chunks (checksums checked); any
    other file (iTXt or zTXt chunks, the text after the pixels, a head that does not parse) is read by Pillow,
    with the same result."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(HEAD_BYTES)
    except OSError:
        return {}
    if not head.startswith(PNG_SIGNATURE):
        return {}
    found = _head_text(head)
    if found is not None and SOFTWARE_KEY in found:
        return found
    return _read_record_pillow(path)


def _head_text(head: bytes) -> dict[str, str] | None:
    """The tEXt chunks before the first IDAT, as Pillow reads them; None when Pillow must look (another text
    chunk kind, a bad checksum, a chunk longer than `head`, no IHDR first)."""
    found: dict[str, str] = {}
    pos, end = len(PNG_SIGNATURE), len(head)
    first = True
    while pos + 8 <= end:
        length, kind = struct.unpack_from(">I4s", head, pos)
        if first and kind != b"IHDR":
            return None
        first = False
        if kind in (b"IDAT", b"IEND"):
            return found
        if kind in (b"iTXt", b"zTXt") or pos + 12 + length > end:
            return None
        data = head[pos + 8:pos + 8 + length]
        if zlib.crc32(kind + data) != struct.unpack_from(">I", head, pos + 8 + length)[0]:
            return None
        if kind == b"tEXt":
            key, _, value = data.partition(b"\0")
            if key:
                found[key.decode("latin-1")] = value.decode("latin-1")
        pos += 12 + length
    return None


def _read_record_pillow(path: Path) -> dict[str, str]:
    from PIL import Image

    try:
        with Image.open(path) as im:
            if im.format != "PNG":
                return {}
            found = {str(k): v for k, v in im.info.items() if isinstance(v, str)}
            if SOFTWARE_KEY not in found:  # text written after the pixels (by another tool): decode to find it
                found = dict(getattr(im, "text", None) or {})
            return {str(k): str(v) for k, v in found.items()}
    except Exception:  # noqa: BLE001 - anything unreadable records nothing
        return {}


def is_ours(record: dict[str, str]) -> bool:
    return record.get(SOFTWARE_KEY, "").startswith(SOFTWARE_PREFIX)


def is_our_png(path: Path) -> bool:
    """A PNG written by ootd (reads the header chunks only)."""
    return Path(path).is_file() and is_ours(read_record(path))


def differences(recorded: dict[str, str], expected: dict[str, str]) -> str | None:
    """What a file records differently from `expected` (at most three, one line), None when it matches. A key
    the file does not record means the exact speed path (files written before the speed modes existed)."""
    if not is_ours(recorded):
        return "it records no ootd settings"
    recorded = {**EXACT_WORDS, **NO_LORA, **recorded}  # no lora keys: made without an adapter
    diffs = [f"{key} {recorded.get(key, 'unknown')} (now {value})" for key, value in expected.items()
             if recorded.get(key) != value]
    return ", ".join(diffs[:3]) + (" ..." if len(diffs) > 3 else "") if diffs else None
