"""ootd: virtual try-on (OOTDiffusion) on ROCm, CUDA, MPS and the CPU.

    from ootd import Models
    models = Models.from_pretrained("checkpoints")   # every network of the process, one runtime
    pipe = models.pipeline("hd")
    result = pipe("person.jpg", "garment.jpg", "upper", seed=1)
    result.images[0].save("out.png")
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ootd.errors import (
    CheckpointError,
    DeviceError,
    InputImageError,
    NoPersonError,
    OotdError,
    OutOfMemoryError,
    OutputError,
    UsageError,
)
from ootd.hardware.compile_cache import use_user_cache

__version__ = "0.1.0"


class _ImportNoise(logging.Filter):
    """What importing torchao (the `quant` extra, imported by diffusers and transformers whenever it is installed)
    logs on every start: its CUDA kernels that this build cannot load, that Triton is missing (a CPU machine has
    none), deprecation notes from its own enums, and diffusers saying its torchao checkpoint support is off.
    Harmless, and not ootd's to report: these messages, on these loggers only, are dropped unless `show` is set
    (a front end's --debug: ootd.app.console)."""

    MESSAGES = {
        "torchao": ("Failed to load ",),
        "torchao.kernel.intmm": ("Detected no triton",),
        "torch.utils._pytree": ("is an Enum subclass and is now natively supported",),
        "diffusers.quantizers.torchao.torchao_quantizer": ("Unable to import `torchao` Tensor objects",),
    }
    show = False

    def filter(self, record: logging.LogRecord) -> bool:
        if self.show:
            return True
        message = record.getMessage()
        return not any(part in message for part in self.MESSAGES.get(record.name, ()))


IMPORT_NOISE = _ImportNoise()
for _name in _ImportNoise.MESSAGES:
    logging.getLogger(_name).addFilter(IMPORT_NOISE)

use_user_cache()  # torch.compile's cache out of the shared temporary folder, before anything imports torch._inductor

if TYPE_CHECKING:
    from ootd.models import Models
    from ootd.pipeline import TryOnPipeline, TryOnResult


def __getattr__(name: str):  # noqa: ANN202 - heavy imports (torch, diffusers) only when used
    if name in ("TryOnPipeline", "TryOnResult"):
        from ootd import pipeline

        return getattr(pipeline, name)
    if name == "Models":
        from ootd import models

        return models.Models
    raise AttributeError(name)


__all__ = [
    "CheckpointError", "DeviceError", "InputImageError", "Models", "NoPersonError", "OotdError", "OutOfMemoryError",
    "OutputError", "TryOnPipeline", "TryOnResult", "UsageError", "__version__",
]
