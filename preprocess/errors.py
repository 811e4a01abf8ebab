"""Errors of the preprocessing package (pose, parsing, mask), with no dependency on ootd.

The names mirror the failure kinds a user can act on; ootd/preprocessing.py maps each to ootd's typed error
of the same name (and exit code) with the same message.
"""

from __future__ import annotations


class PreprocessError(Exception):
    """Base class: a failure with a message meant for the user."""


class UsageError(PreprocessError):
    """An argument is wrong (unknown category or model type, negative grow)."""


class CheckpointError(PreprocessError):
    """A pose or parsing model file is missing, truncated or not what it should be."""


class DeviceError(PreprocessError):
    """No usable ONNX Runtime execution provider, or the chosen one failed."""


class UnsupportedError(DeviceError):
    """The chosen execution provider is not in this ONNX Runtime install (another machine's may have it)."""


class NoPersonError(PreprocessError):
    """Pose estimation found nobody in the person image."""
