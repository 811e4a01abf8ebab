"""From a RunConfig to the model owner, and the cheap checks before anything loads.

`models_for` makes the one `Models` (ootd/models/) a front end gets every model of its try-ons from: the runtime
the config asks for (resolved once, when the first model loads), its memory budget, speed modes and parsing
provider. A front end makes it once and hands it down (the job runs each pass on `models.pipeline`); a server
keeps both model types and the classifier (`Keep`), a command one pipeline at a time. `check_hardware` and
`check_checkpoints_present` say what cannot run before anything loads.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ootd.app.tryon.config import RunConfig
from ootd.errors import CheckpointError, DeviceError, UnsupportedError, UsageError
from ootd.models import Keep, Models, ModelSource
from ootd.settings import ModelType, ParsingProvider

if TYPE_CHECKING:
    from ootd.runtime import HardwareChoice

logger = logging.getLogger(__name__)


def models_for(config: RunConfig, keep: Keep = Keep(), source: ModelSource | None = None) -> Models:
    """The model owner a config asks for (`source`: models to use instead of the checkpoints' ones)."""
    return Models(config.checkpoints, config.runtime_request, parsing_provider=config.parsing_provider,
                  max_memory=config.max_memory, modes=config.speed, keep=keep, source=source)


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
