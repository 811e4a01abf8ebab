"""From a RunConfig to a loaded pipeline: the cheap checkpoint check first, then loading, one model at a time.

`load_pipeline` is the one place a front end builds a `TryOnPipeline` (tests replace it with a preloaded one);
`PipelineLoader` loads each model type when it is first needed and holds at most one, so a batch mixing hd and
dc pairs never has both in memory.
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.app.config import RunConfig
from ootd.app.console import quiet_libraries
from ootd.config import ModelType, PrecisionName
from ootd.errors import CheckpointError, DeviceError, OotdError, UsageError

if TYPE_CHECKING:
    from ootd.pipeline import TryOnPipeline

logger = logging.getLogger(__name__)


def load_pipeline(config: RunConfig, model_type: ModelType, preprocessor: Any = None,
                  progress: Callable[[str, int, int], None] | None = None) -> TryOnPipeline:
    """Build the pipeline a config asks for (device, precision, attention, memory, speed options).
    `preprocessor`: pose + parsing already loaded (see `load_preprocessor`), else loaded when first needed;
    `progress` hears ("load", done, total) per component."""
    from ootd.pipeline import TryOnPipeline

    quiet_libraries(importing=True)  # importing transformers/diffusers may have reset their levels
    return TryOnPipeline.from_pretrained(
        config.checkpoints, model_type=model_type.value, device=config.device,
        dtype=None if config.precision == PrecisionName.AUTO else str(config.precision),
        attention=str(config.attention), parsing_provider=str(config.parsing_provider),
        max_memory=config.max_memory, channels_last=config.channels_last, compile=config.compile,
        quantize=config.quantize,
        **({"preprocessor": preprocessor} if preprocessor is not None else {}),
        **({"progress": progress} if progress is not None else {}),
    )


class RememberingPreprocessor:
    """Pose + parsing that remembers its latest answer: the mask made for the early "is there a person?" check is
    the one the pipeline uses, not computed twice. Anything else is the wrapped preprocessor's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._latest: tuple[tuple, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copying): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, person: Any, category: Any, model_type: Any, grow: int = 0) -> Any:
        import hashlib

        key = (person.size, person.mode, hashlib.sha256(person.tobytes()).digest(), str(category), str(model_type),
               grow)
        if self._latest is not None and self._latest[0] == key:
            return self._latest[1]
        made = self.inner(person, category, model_type, grow=grow)
        self._latest = (key, made)
        return made


def load_preprocessor(config: RunConfig) -> RememberingPreprocessor:
    """Pose + parsing alone (seconds), on the device the pipeline will use, so "no person detected" comes before
    the diffusion models load (minutes). The device's runtime settings are applied first, as the pipeline does."""
    import torch

    from ootd.device import detect_device, peek_device
    from ootd.device_policy import apply_environment, runtime_environment
    from ootd.preprocessing import Preprocessor

    apply_environment(runtime_environment(peek_device(config.device), torch.__version__))
    device = detect_device(config.device).torch_device
    return RememberingPreprocessor(Preprocessor.from_checkpoints(config.checkpoints, device,
                                                                 str(config.parsing_provider)))


def check_hardware(config: RunConfig, device_source: str | None = None) -> None:
    """The device name and the precision a user asked for, checked without loading anything: an unknown device
    or a precision the device cannot run is a usage error (exit 2). `device_source` names where the device word
    came from when it was not an option (e.g. "OOTD_DEVICE"), so the message points at it."""
    from ootd.device import peek_device
    from ootd.device_policy import choose_precision

    where = f" (from {device_source})" if device_source else ""
    try:
        info = peek_device(config.device)
    except DeviceError as exc:
        raise UsageError(f"{exc}{where}") from None
    try:
        choose_precision(info, str(config.precision))
    except DeviceError as exc:
        raise UsageError(str(exc)) from None


class PipelineLoader:
    """Loads each model type lazily, when its first try-on runs, and holds at most one at a time.

    A load that fails with an OotdError is remembered: every later request for that model type gets the same
    error at once instead of a retry. `factory` defaults to `load_pipeline` with this loader's config.
    """

    def __init__(self, config: RunConfig, factory: Callable[[ModelType], Any] | None = None) -> None:
        self.config = config
        self.factory = factory
        self.loads: dict[str, int] = {}  # model type -> times loaded (tests check: once each)
        self.seconds = 0.0
        self._current: tuple[ModelType, Any] | None = None
        self._failed: dict[ModelType, OotdError] = {}

    def _load(self, model_type: ModelType) -> Any:
        if self.factory is not None:
            return self.factory(model_type)
        return load_pipeline(self.config, model_type)  # looked up at call time (tests replace it)

    def get(self, model_type: ModelType) -> Any:
        if model_type in self._failed:
            raise self._failed[model_type]
        if self._current is not None and self._current[0] is model_type:
            return self._current[1]
        self.release()
        start = time.perf_counter()
        try:
            pipe = self._load(model_type)
        except OotdError as exc:  # the same error for every pair of this model type, without retrying
            self._failed[model_type] = exc
            raise
        self.seconds += time.perf_counter() - start
        self.loads[model_type.value] = self.loads.get(model_type.value, 0) + 1
        self._current = (model_type, pipe)
        return pipe

    def failure(self, model_type: ModelType) -> OotdError | None:
        """The error loading `model_type` failed with (remembered), else None."""
        return self._failed.get(model_type)

    def holds(self, model_type: ModelType) -> bool:
        return self._current is not None and self._current[0] is model_type

    @property
    def current(self) -> Any:
        return self._current[1] if self._current is not None else None

    def release(self) -> None:
        """Drop the loaded pipeline and give its memory back before another is loaded."""
        if self._current is None:
            return
        self._current = None
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()


def check_checkpoints_present(root: Path, model_types: Iterable[ModelType], need_preprocess: bool) -> None:
    """Fail now, with the file and the fix, when a file the run needs is missing or empty (no model loading).

    Truncated or corrupt files are caught when they are loaded; this only makes the common cases instant.
    """
    from ootd.checkpoints import Layout
    from ootd.verify import verify_checkpoints

    root = Path(root)
    hint = f"run `ootd download --dest {root}`, or pass --checkpoints DIR / set OOTD_CHECKPOINTS"
    if not root.exists():
        raise CheckpointError(f"checkpoints folder {root} does not exist; {hint}")
    if not root.is_dir():
        raise CheckpointError(f"checkpoints path {root} is not a folder; {hint}")
    models = sorted(set(model_types), key=lambda m: m.value)
    if not models:
        return
    layout = Layout(root)
    optional = set() if need_preprocess else {layout.parsing_atr, layout.parsing_lip, layout.body_pose}
    bad = [c for c in verify_checkpoints(root, models, load=False) if not c.ok and c.path not in optional]
    if bad:
        first = bad[0]
        more = f" ({len(bad) - 1} more: run `ootd checkpoints verify {root}`)" if len(bad) > 1 else ""
        raise CheckpointError(f"{first.component}: {first.path}: {first.problem}; {first.fix}{more}")
