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
_NUMBER = re.compile(r"\d+")

# values used to check a template before any inputs are known
EXAMPLE_FIELDS: dict[str, Any] = {
    "person": "person", "garment": "garment", "mask": "auto", "category": "upper", "model": "hd", "seed": 1,
    "steps": 20, "scale": 2.0, "resolution": "768x1024", "scheduler": "unipc", "fit": "pad", "i": 0,
}


def template_fields(template: str) -> list[str]:
    """The field names a template uses; a one-line UsageError for a malformed template, an unknown field or a
    format spec that could make a name longer than any allowed (checked here, before anything is formatted:
    `{i:1000000000}` would build a gigabyte string first)."""
    try:
        parts = [(name, spec) for _, name, spec, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise UsageError.about("name", "bad {@name} template {value!r}: {problem}", value=template,
                               problem=exc) from None
    names = [name for name, _ in parts]
    for name, spec in parts:
        _check_spec(template, name, spec or "")
    for name in names:
        if name not in NAME_FIELDS:
            what = f"{{{name}}}" if name else "{} (a field needs a name)"
            raise UsageError.about("name", "unknown field {field} in {@name}: use {fields}", value=template,
                                   field=what, fields=", ".join("{" + f + "}" for f in NAME_FIELDS))
    if "i" not in names:
        raise UsageError.about("name", "{@name} {value!r} needs {{i}} (the sample number), so samples and "
                               "masks get their own files", value=template)
    return names


def _check_spec(template: str, name: str, spec: str) -> None:
    """A field's format spec may not hold a field of its own (`{i:{seed}}`: a width from a value) nor a width
    or precision above MAX_STEM: the name would be refused anyway, after formatting a string that long."""
    if "{" in spec or "}" in spec:
        raise UsageError.about("name", "bad {@name} template {value!r}: {field} takes no field in its format",
                               value=template, field=f"{{{name}:{spec}}}")
    too_big = [n for n in _NUMBER.findall(spec) if len(n) > len(str(MAX_STEM)) or int(n) > MAX_STEM]
    if too_big:
        raise UsageError.about("name", "bad {@name} template {value!r}: {field} asks for {wide} characters, "
                               "more than the {most} a name may have", value=template, field=f"{{{name}:{spec}}}",
                               wide=too_big[0], most=MAX_STEM)


def render_name(template: str, fields: dict[str, Any]) -> str:
    """The file stem for one output (no extension); a one-line UsageError when it is not a safe file name."""
    template_fields(template)
    try:
        stem = template.format(**fields)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise UsageError.about("name", "bad {@name} template {value!r}: {problem}", value=template,
                               problem=exc) from None
    if not _SAFE.fullmatch(stem) or len(stem) > MAX_STEM or stem in (".", ".."):
        raise UsageError.about("name", "{@name} {value!r} gives {stem!r}, not a safe file name: use letters, digits, "
                               "'-', '.' and '_' (no '/', no leading '.' or '-', at most {most} characters)",
                               value=template, stem=stem, most=MAX_STEM)
    return stem


def check_template(template: str) -> str:
    """Validate a template with example values (cheap, before anything is loaded); returns it."""
    render_name(template, EXAMPLE_FIELDS)
    return template
