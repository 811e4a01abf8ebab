"""The device a user names (--device, the OOTD_DEVICE environment variable, the library's `device=`), checked
before anything is loaded: a word that is not a device is a usage error (exit 2) that names the bad value and,
when it came from the environment, the variable, so a stale shell setting is found at once."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ootd.errors import UsageError

ENV_DEVICE = "OOTD_DEVICE"
DEVICE_TYPES = ("cpu", "cuda", "mps")  # ROCm GPUs are "cuda" in PyTorch
DEVICE_WORDS = "auto, cpu, cuda, cuda:N or mps"


def check_device_spec(spec: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """Return `spec` unchanged if it names a device type ootd runs on (None and "auto": choose), else raise.

    Whether that device exists here is detection's question (a DeviceError, exit 1); this only refuses words.
    """
    if spec is None or spec == "auto":
        return spec
    try:
        import torch  # not at import: the CLI reads ENV_DEVICE at --help time

        device = torch.device(str(spec))
    except (RuntimeError, ValueError, TypeError):
        device = None
    if device is not None and device.type in DEVICE_TYPES:
        return spec
    environ = os.environ if environ is None else environ
    from_env = environ.get(ENV_DEVICE, "").strip() == str(spec).strip()
    source = f" (set by the environment variable {ENV_DEVICE})" if from_env else ""
    raise UsageError(f"unknown device {str(spec)!r}{source}: use {DEVICE_WORDS}")
