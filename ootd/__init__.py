"""ootd: virtual try-on (OOTDiffusion) on ROCm, CUDA, MPS and the CPU.

    from ootd import TryOnPipeline
    pipe = TryOnPipeline.from_pretrained("checkpoints", model_type="hd")
    result = pipe("person.jpg", "garment.jpg", "upper", seed=1)
    result.images[0].save("out.png")
"""

from __future__ import annotations

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

use_user_cache()  # torch.compile's cache out of the shared temporary folder, before anything imports torch._inductor

if TYPE_CHECKING:
    from ootd.pipeline import TryOnPipeline, TryOnResult


def __getattr__(name: str):  # noqa: ANN202 - heavy imports (torch, diffusers) only when used
    if name in ("TryOnPipeline", "TryOnResult"):
        from ootd import pipeline

        return getattr(pipeline, name)
    raise AttributeError(name)


__all__ = [
    "CheckpointError", "DeviceError", "InputImageError", "NoPersonError", "OotdError", "OutOfMemoryError",
    "OutputError", "TryOnPipeline", "TryOnResult", "UsageError", "__version__",
]
