"""Reading a PNG's record back: its text chunks (what ootd writes is the typed record of ootd/app/tryon/record.py),
whether a file is ours, and how a record differs from what a run expects (resume).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from ootd.app.tryon.record import (
    COMPARED_SETTINGS,
    DEFAULT_WORDS,
    GARMENT_KEY,
    MASK_KEY,
    PERSON_KEY,
    SAMPLE_KEY,
    SEED_KEY,
    SOFTWARE_KEY,
    SOFTWARE_PREFIX,
)

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
    from ootd.errors import InputImageError
    from ootd.imaging.opener import open_image

    try:
        with open_image(path, InputImageError, min_side=0, formats=("PNG",), decode=False) as im:
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


def is_intermediate_record(record: dict[str, str]) -> bool:
    """Ours without a sample number: a picture the job writes beside its results (pose, parsing, mask, masked
    person, contact sheet, `ootd mask`'s files), which `ootd compare` and `ootd eval` leave out."""
    return is_ours(record) and SAMPLE_KEY not in record


@dataclass(frozen=True)
class RecordedInputs:
    """The file names a record gives for a picture's inputs ("" where it gives none): what `ootd eval` pairs a
    result with its person's photo by."""

    person: str
    garment: str
    mask: str


def recorded_inputs(record: dict[str, str]) -> RecordedInputs:
    return RecordedInputs(record.get(PERSON_KEY, ""), record.get(GARMENT_KEY, ""), record.get(MASK_KEY, ""))


def recorded_seed(record: dict[str, str]) -> str:
    """The seed as written ("" when none is recorded): resume compares the words of a pair's files, and a word
    that is not a number must still count as a different seed."""
    return record.get(SEED_KEY, "")


def setting_changes(a: dict[str, str], b: dict[str, str]) -> dict[str, tuple[str, str]]:
    """The settings two of our records give differently, as (a's, b's) words (COMPARED_SETTINGS, in order); a key
    a record lacks has the value it meant when it was written (DEFAULT_WORDS), else "unknown"."""
    a, b = {**DEFAULT_WORDS, **a}, {**DEFAULT_WORDS, **b}
    return {k: (a.get(k, "unknown"), b.get(k, "unknown")) for k in COMPARED_SETTINGS if a.get(k) != b.get(k)}


def differences(recorded: dict[str, str], expected: dict[str, str]) -> str | None:
    """What a file records differently from `expected` (at most three, one line), None when it matches. A key
    the file does not record means the exact speed path (files written before the speed modes existed)."""
    if not is_ours(recorded):
        return "it records no ootd settings"
    recorded = {**DEFAULT_WORDS, **recorded}
    diffs = [f"{key} {recorded.get(key, 'unknown')} (now {value})" for key, value in expected.items()
             if recorded.get(key) != value]
    return ", ".join(diffs[:3]) + (" ..." if len(diffs) > 3 else "") if diffs else None


@dataclass(frozen=True)
class RecordedPass:
    """One pass of a picture as its record gives it (words as written; "" where it gives none)."""

    category: str
    model_type: str
    mask: str  # record.AUTO_MASK for a mask made from pose and parsing


@dataclass(frozen=True)
class RecordedFraming:
    """What maps a result back onto the person photo it was made from, as its record gives it: the working size
    and framing, the mask's growth, whether the picture is at the photo's size (and keeps it outside the mask,
    with which seam), and each pass's category, model and mask (an outfit's in the order they ran)."""

    resolution: str
    fit: str
    mask_grow: str
    output_size: str
    keep_unmasked: bool
    feather: str
    passes: tuple[RecordedPass, ...]


def recorded_framing(record: dict[str, str]) -> RecordedFraming:
    """The framing of a picture's record (a key it lacks has the value it meant when it was written)."""
    text = {**DEFAULT_WORDS, **record}
    names = [name for name in text.get("outfit", "").split("+") if name]
    if names:
        passes = tuple(RecordedPass(text.get(f"{n}_category", ""), text.get(f"{n}_model_type", ""),
                                    text.get(f"{n}_mask", "")) for n in names)
    else:
        passes = (RecordedPass(text.get("category", ""), text.get("model_type", ""), text.get("mask", "")),)
    return RecordedFraming(text.get("resolution", ""), text.get("fit", ""), text.get("mask_grow", "0"),
                           text.get("output_size", ""), text.get("keep_unmasked") == "yes", text.get("feather", ""),
                           passes)
