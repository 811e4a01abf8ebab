"""From a RunConfig to loaded models: the cheap checkpoint check first, then loading, one model at a time.

`PipelineLoader` is the one place a front end gets a `TryOnPipeline` (and the pose + parsing models): it loads
each model type when it is first needed and holds at most one, so a batch mixing hd and dc pairs never has both
in memory. `use_models` is the one seam to hand it models instead of the checkpoints (preloaded pipelines: tests,
an embedding application); every loader made inside it uses them.
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.app.console import quiet_libraries
from ootd.app.tryon.config import RunConfig
from ootd.errors import CheckpointError, DeviceError, OotdError, UnsupportedError, UsageError
from ootd.pipeline_types import Progress
from ootd.settings import ModelType, ParsingProvider

if TYPE_CHECKING:
    from ootd.pipeline import TryOnPipeline
    from ootd.runtime import HardwareChoice, Runtime

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class ModelSource:
    """Models to use instead of loading them: `pipeline(model_type)` and, optionally, `preprocessor()`."""

    pipeline: Callable[[ModelType], Any]
    preprocessor: Callable[[], Any] | None = None


_SOURCE: ContextVar[ModelSource | None] = ContextVar("ootd_model_source", default=None)


@contextmanager
def use_models(pipeline: Callable[[ModelType], Any], preprocessor: Callable[[], Any] | None = None
               ) -> Iterator[ModelSource]:
    """Within this block every PipelineLoader made without a factory of its own takes its pipelines (and pose +
    parsing models) from these callables instead of the checkpoints."""
    source = ModelSource(pipeline, preprocessor)
    token = _SOURCE.set(source)
    try:
        yield source
    finally:
        _SOURCE.reset(token)


def load_pipeline(config: RunConfig, model_type: ModelType, *, runtime: Runtime, preprocessor: Any = None,
                  progress: Progress | None = None) -> TryOnPipeline:
    """Build the pipeline a config asks for on a resolved runtime (memory budget, speed modes, parsing
    provider). `preprocessor`: pose + parsing already loaded, else loaded when first needed; `progress` hears
    ("load", done, total) per component."""
    from ootd.pipeline import TryOnPipeline

    quiet_libraries(importing=True)  # importing transformers/diffusers may have reset their levels
    return TryOnPipeline.load(config.checkpoints, model_type, runtime, modes=config.speed, preprocessor=preprocessor,
                              parsing_provider=config.parsing_provider, max_memory=config.max_memory,
                              progress=progress, lora=config.lora)


def check_hardware(config: RunConfig, device_source: str | None = None) -> HardwareChoice:
    """What a config asks of this machine, checked without loading anything (and returned): an unknown device
    word is a usage error (exit 2); a precision, quantization, attention backend or parsing provider this machine
    cannot run (fp16 on the CPU, fp8 without float8 units, flash without flash-attn, a missing extra) is an
    UnsupportedError (exit 3), the class the same settings raise when a pipeline loads. `device_source` names
    where the device word came from when it was not an option (e.g. "OOTD_DEVICE"), so the message points at
    it."""
    from ootd.attention.select import check_attention
    from ootd.hardware.device import require_gpu
    from ootd.runtime import choose_hardware
    from ootd.settings import QuantizeName

    where = f" (from {device_source})" if device_source else ""
    try:
        hardware = choose_hardware(config.runtime_request)
        if hardware.device.type == "cuda":
            require_gpu(config.device, hardware.device.index or 0)
    except UnsupportedError as exc:
        raise UnsupportedError(f"{exc}{where}") from None
    except DeviceError as exc:
        raise UsageError(f"{exc}{where}") from None
    check_attention(config.attention, hardware.device, hardware.precision.unet, hardware.profile)
    if config.speed.quantize is not QuantizeName.NONE:
        from ootd.speedups.quantize import require_torchao

        require_torchao()
    if config.parsing_provider is not ParsingProvider.CPU:
        _check_parsing_provider(config.parsing_provider)
    return hardware


def _check_parsing_provider(provider: ParsingProvider) -> None:
    from ootd.preprocessing import ootd_errors
    from preprocess.parsing import resolve_providers

    with ootd_errors():
        resolve_providers(provider.value)


class PipelineLoader:
    """Loads each model type lazily, when its first try-on runs, and holds at most one at a time; loads the pose
    and parsing models once, when a mask has to be made before a pipeline is loaded, and hands them to the
    pipelines it loads.

    A load that fails with an OotdError is remembered: every later request for that model type gets the same
    error at once instead of a retry. `models` replaces loading from the checkpoints (else the models of an
    enclosing `use_models`): its pipelines, and its pose + parsing models when it has them.
    """

    def __init__(self, config: RunConfig, models: ModelSource | None = None) -> None:
        source = models or _SOURCE.get()
        self.config = config
        self.factory = source.pipeline if source is not None else None
        self._make_preprocessor = source.preprocessor if source is not None else None
        self.loads: dict[str, int] = {}  # model type -> times loaded (tests check: once each)
        self.seconds = 0.0
        self._current: tuple[ModelType, Any] | None = None
        self._failed: dict[ModelType, OotdError] = {}
        self._preprocessor: Any = None
        self._runtime: Runtime | None = None

    def runtime(self) -> Runtime:
        """Where and how every model of this loader runs, resolved when the first one loads (ootd/runtime.py)."""
        if self._runtime is None:
            from ootd.runtime import resolve_runtime

            self._runtime = resolve_runtime(self.config.runtime_request)
        return self._runtime

    def hardware(self) -> HardwareChoice:
        """What the config means on this machine, before anything loads (the memory budget's precision)."""
        from ootd.runtime import choose_hardware

        return choose_hardware(self.config.runtime_request)

    def preprocessor(self) -> Any:
        """Pose + parsing, loaded once, on the device the pipelines will use (they share it), so "no person
        detected" comes before the diffusion models load."""
        if self._preprocessor is None:
            if self._make_preprocessor is not None:
                self._preprocessor = self._make_preprocessor()
            else:
                from ootd.preprocessing import Preprocessor

                runtime = self.runtime()
                self._preprocessor = Preprocessor.from_checkpoints(
                    self.config.checkpoints, runtime.device.torch_device, self.config.parsing_provider,
                    runtime.threads)
        return self._preprocessor

    def _load(self, model_type: ModelType, progress: Progress | None) -> Any:
        if self.factory is not None:
            return self.factory(model_type)
        return load_pipeline(self.config, model_type, runtime=self.runtime(), preprocessor=self._preprocessor,
                             progress=progress)

    def get(self, model_type: ModelType, progress: Progress | None = None) -> Any:
        """The pipeline of `model_type`, loaded now if it is not the one held (`progress` hears the load)."""
        if model_type in self._failed:
            raise self._failed[model_type]
        if self._current is not None and self._current[0] is model_type:
            return self._current[1]
        self.release()
        start = time.perf_counter()
        try:
            pipe = self._load(model_type, progress)
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
    from ootd.weights.layout import Layout
    from ootd.weights.verify import verify_checkpoints

    root = Path(root)
    hint, fixed = "run `ootd download --dest {root}`", ", or pass {@checkpoints} DIR / set OOTD_CHECKPOINTS"
    for problem, found in (("folder {root} does not exist", root.exists()), ("path {root} is not a folder",
                                                                             root.is_dir())):
        if not found:  # `otherwise`: where the checkpoints are not the user's to choose (a server's request)
            raise CheckpointError.about("checkpoints", f"checkpoints {problem}; {hint}{fixed}", root=root,
                                        otherwise=f"checkpoints {problem}; {hint}")
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
