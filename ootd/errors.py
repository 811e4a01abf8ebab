"""Error types. Every failure a user can cause or fix is one of these, so the CLI can print one line.

The library speaks its own words: an error about a setting (or an input) names it by its declared name
(`OotdError.about`: `mask_grow`, `model_type`, `mask`; ootd/app/tryon/settings.py declares them), never by a front
end's word for it, and each front end words the message its own way (`worded(exc, name)`: a flag for the CLI, a
form field for the HTTP API, an input for a node), with no rewriting of the text.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Mapping
from os import PathLike
from typing import Any, TypeVar

# What must not reach a terminal as it is: C0 and C1 controls, DEL, line and paragraph separators, and the
# bidirectional overrides and isolates (which reorder what is shown around them).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(path: PathLike | str) -> str:
    """A path (or any text) that can always be printed and stored as UTF-8: the bytes of a file name that is
    not valid UTF-8 (which Python holds as lone surrogates) show as \\xNN escapes."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text


def escaped(text: PathLike | str) -> str:
    """`text` for one human-readable line: `printable`, with each control character as an escape (\\n, \\t,
    \\x1b, \\u2028), as JSON shows it, so a file name can neither break a line, forge another, nor move the
    cursor."""
    shown = printable(text)
    if _CONTROLS.search(shown) is None:
        return shown
    return _CONTROLS.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                              else f"\\u{ord(m.group()):04x}"), shown)


# A front end's word for a setting or an input, by its declared name (`mask_grow` -> `--mask-grow` for the CLI);
# None: that front end does not let its user choose it.
Namer = Callable[[str], "str | None"]
Error = TypeVar("Error", bound="OotdError")


def library_name(name: str) -> None:
    """The library's own words: a setting by its declared name, as Python code passes it (`mask_grow=600`), or
    by the template's words for it (`{@automatic_mask|the automatic mask}`)."""
    return None


class _Names(dict):
    """The fields of a message template: its values as given, and each `{@name}` (or `{@name|words}`) as the
    front end calls that setting (`words`, or the name itself, where the front end has no word for it)."""

    def __init__(self, fields: Mapping[str, Any], name: Namer, missing: list[str]) -> None:
        super().__init__(fields)
        self.name, self.missing = name, missing

    def __missing__(self, key: str) -> str:
        if not key.startswith("@"):
            raise KeyError(key)
        setting, _, words = key[1:].partition("|")
        called = self.name(setting)
        if called is None:
            self.missing.append(setting)
            return words or setting
        return called


def fill(template: str, name: Namer, **fields: Any) -> str:
    """`template` with its values and its settings (`{@name}`) in a front end's words (`name`); a value is put in
    as it is, never read as a template itself."""
    return string.Formatter().vformat(template, (), _Names(fields, name, []))


class OotdError(Exception):
    """Base class: a failure with a message meant for the user (exit code 1).

    Made with `about`, it names the setting (or input) it is about and keeps its message as a template that names
    settings as `{@mask_grow}`, so each front end can word it (`words`); `str()` is the library's words."""

    exit_code = 1
    setting: str | None = None  # the declared name of the setting or input this error is about, if any
    value: Any = None  # the value of that setting it refuses, if one
    _template: tuple[str, str | None, dict[str, Any]] | None = None

    @classmethod
    def about(cls: type[Error], setting: str, template: str, *, value: Any = None, otherwise: str | None = None,
              **fields: Any) -> Error:
        """This error about `setting` (and its `value`, which the template may show as `{value}`): `template`
        names settings as `{@name}` (`{@name|words}`: `words` where a front end has no name for it); `otherwise`,
        when given, is the message for a front end that does not offer a setting the template names (the user
        there cannot change it)."""
        values = {"value": value, **fields}
        error = cls(fill(template, library_name, **values))
        error.setting, error.value, error._template = setting, value, (template, otherwise, values)
        return error

    def words(self, name: Namer) -> str:
        """The message, each setting it names worded by `name` (a front end's); the text itself otherwise."""
        if self._template is None:
            return str(self)
        template, otherwise, values = self._template
        missing: list[str] = []
        text = string.Formatter().vformat(template, (), _Names(values, name, missing))
        if missing and otherwise is not None:
            return fill(otherwise, name, **values)
        return text


def worded(exc: BaseException, name: Namer) -> str:
    """A failure's message in a front end's words (`name`: its word for each setting and input): the one function
    every front end words errors with."""
    return exc.words(name) if isinstance(exc, OotdError) else str(exc)


class UsageError(OotdError):
    """The request itself is wrong: bad option value, impossible combination (exit code 2)."""

    exit_code = 2


class InputImageError(OotdError):
    """An input image is missing, unreadable or unusable."""

    exit_code = 2


class CheckpointError(OotdError):
    """A checkpoint file is missing, truncated or not what the layout expects."""


class NoPersonError(OotdError):
    """Pose estimation found nobody in the person image."""


class OutputError(OotdError):
    """Outputs cannot be written (folder not writable, file exists without --overwrite)."""


class NoSpaceError(OutputError):
    """The device holding an output is full: the run stops (every later write would fail too)."""


def no_space(path: PathLike | str) -> NoSpaceError:
    """The one message for a full device, naming the file that could not be written."""
    return NoSpaceError(f"no space left on device ({printable(path)})")


class DeviceError(OotdError):
    """The requested device or precision cannot be used here."""


class UnsupportedError(DeviceError):
    """A setting this machine cannot run, though another could (exit code 3): a device it does not have, a
    precision or quantization its hardware lacks, an attention backend or extra that is not installed. The
    same words work elsewhere, so it is neither a usage error (2) nor a failure of the run (1)."""

    exit_code = 3


class NumericalError(OotdError):
    """The computation produced NaN or infinite values (half-precision overflow, damaged weights)."""


class OutOfMemoryError(OotdError):
    """The device ran out of memory even after re-planning."""
