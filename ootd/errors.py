"""Error types. Every failure a user can cause or fix is one of these, so the CLI can print one line."""

from __future__ import annotations

import re
from os import PathLike

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


class OotdError(Exception):
    """Base class: a failure with a message meant for the user (exit code 1)."""

    exit_code = 1


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
