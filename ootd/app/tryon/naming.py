"""Output names from a template: `--name "{person}__{garment}__{category}__{seed}__{i}"`.

The fields are declared once here (the CLI help and docs list them from NAME_FIELDS); the default template gives
the names ootd has always written. `{i}` is the sample number, and the kind (`mask`, `pose`, `grid`...) for the
files written next to the samples, so every template must hold it. A rendered name is one safe file name or a
one-line usage error, checked before any work starts.
"""

from __future__ import annotations

import re
import string
from typing import Any

from ootd.errors import UsageError

DEFAULT_NAME = "{person}__{garment}__{i}"  # what ootd wrote before names were configurable
NAME_FIELDS: dict[str, str] = {
    "person": "the person photo's file stem",
    "garment": "the garment photo's file stem",
    "mask": "the mask's file stem, or auto",
    "category": "upper, lower or dress",
    "model": "hd or dc",
    "seed": "the random seed",
    "steps": "denoising steps",
    "scale": "guidance scale",
    "resolution": "e.g. 768x1024",
    "scheduler": "the sampler",
    "fit": "pad, crop or stretch",
    "i": "sample number (the kind - mask, pose, grid... - for files beside the samples)",
}
_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
MAX_STEM = 200

# values used to check a template before any inputs are known
EXAMPLE_FIELDS: dict[str, Any] = {
    "person": "person", "garment": "garment", "mask": "auto", "category": "upper", "model": "hd", "seed": 1,
    "steps": 20, "scale": 2.0, "resolution": "768x1024", "scheduler": "unipc", "fit": "pad", "i": 0,
}


def template_fields(template: str) -> list[str]:
    """The field names a template uses; a one-line UsageError for a malformed template or an unknown field."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise UsageError(f"bad --name template {template!r}: {exc}") from None
    for name in names:
        if name not in NAME_FIELDS:
            what = f"{{{name}}}" if name else "{} (a field needs a name)"
            raise UsageError(f"unknown field {what} in --name: use {', '.join('{' + f + '}' for f in NAME_FIELDS)}")
    if "i" not in names:
        raise UsageError(f"--name {template!r} needs {{i}} (the sample number), so samples and masks get their "
                         "own files")
    return names


def render_name(template: str, fields: dict[str, Any]) -> str:
    """The file stem for one output (no extension); a one-line UsageError when it is not a safe file name."""
    template_fields(template)
    try:
        stem = template.format(**fields)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise UsageError(f"bad --name template {template!r}: {exc}") from None
    if not _SAFE.fullmatch(stem) or len(stem) > MAX_STEM or stem in (".", ".."):
        raise UsageError(f"--name {template!r} gives {stem!r}, not a safe file name: use letters, digits, '-', "
                         f"'.' and '_' (no '/', no leading '.' or '-', at most {MAX_STEM} characters)")
    return stem


def check_template(template: str) -> str:
    """Validate a template with example values (cheap, before anything is loaded); returns it."""
    render_name(template, EXAMPLE_FIELDS)
    return template
