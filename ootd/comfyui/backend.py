"""What the nodes take from ootd's models: the model handle the loader node hands on, and the models it shares
across nodes and prompts. (The nodes' setting inputs and their words for the library's messages: inputs.py,
derived from the settings' declarations.)

Nothing else in this package touches the models, so this is the one module to change when they move.

The models of one loader choice (`ModelChoice`: checkpoints, model type, precision, attention, adapter, device)
are held by one `SharedModels`, found by that choice in a process-wide table: ootd's model owner (`Models`,
ootd/models/, the only thing that loads a network) with ComfyUI's hooks around it. The first try-on that needs a
model loads it, every later one (any node, any prompt) reuses it; both model types stay (an outfit needs both),
and the classifier. A `Host` (ComfyUI's model management, ootd/comfyui/host.py) is asked to make room before a
pipeline loads and told what the owner holds, and gets the model released when it asks for its memory back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ootd.errors import OotdError
from ootd.settings import ModelType

if TYPE_CHECKING:
    from ootd.app.tryon.config import RunConfig
    from ootd.method.classify import GarmentClassifier
    from ootd.models import Models
    from ootd.pipeline import TryOnPipeline
    from ootd.pipeline_types import Progress
    from ootd.preprocessing import Preprocessor

T = TypeVar("T")

logger = logging.getLogger("ootd.comfyui")


# --------------------------------------------------------------------------------------------------- models

PARSING, CLASSIFIER = "pose+parsing", "classifier"  # the held models besides the pipelines (`hd`, `dc`)


class Host(Protocol):
    """What the models need of the application that holds them (ComfyUI: ootd/comfyui/host.py)."""

    def make_room(self, nbytes: int) -> None:
        """Free what the host holds on the device until `nbytes` more fit."""

    def hold(self, name: str, nbytes: int, release: Callable[[], None], device: str | None = None) -> object:
        """Count a loaded model as the host's (on `device`, None: the host's); `release` drops it when the host
        needs the memory."""

    def drop(self, token: object) -> None:
        """Stop counting a model that ootd released itself."""


@dataclass(frozen=True)
class ModelChoice:
    """What the loader node chose: the handle's identity (equal choices share their models). `words`: the
    loader's other settings as `build_config` keywords (inputs.py `config_words`), sorted by name."""

    checkpoints: Path
    device: str = "cpu"
    words: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, checkpoints: Path, device: str = "cpu", **words: Any) -> ModelChoice:
        return cls(Path(checkpoints), device, tuple(sorted(words.items())))

    def config_words(self) -> dict[str, Any]:
        """Its `build_config` keywords."""
        return {**dict(self.words), "checkpoints": self.checkpoints, "device": self.device}


# what the owner calls what it holds (`Models.held()`) -> the name ComfyUI's log and the performance text show
SHOWN = {"preprocessor": "pose+parsing"}


def shown(name: str) -> str:
    return SHOWN.get(name, name)


@dataclass
class SharedModels:
    """The models of one choice, held by ootd's model owner (`Models`, ootd/models/), the only thing that loads
    them: a pipeline per model type (both stay, an outfit needs both), pose + parsing, the classifier, each loaded
    when first asked for and kept for every later node and prompt. Around each load the host is asked for room
    and then told what the owner holds; when the host wants the memory back, the owner releases that model."""

    config: RunConfig  # the loader's words (no sampling): what the models are loaded with
    host: Host
    owner: Models = field(init=False)
    held: dict[str, object] = field(default_factory=dict)  # `Models.held()` name -> the host's token for it
    loads: dict[str, int] = field(default_factory=dict)  # what was loaded, how often (a test reads it)

    def __post_init__(self) -> None:
        from ootd.app.tryon.loader import models_for
        from ootd.models import Keep, ModelSource
        from ootd.models.source import current_source

        source = current_source()
        if _PREPROCESSOR is not None:
            source = replace(source or ModelSource(), preprocessor=_PREPROCESSOR)
        self.owner = models_for(self.config, Keep(pipelines=len(ModelType), classifier=True), source)

    def pipeline(self, model_type: ModelType, config: RunConfig, progress: Progress | None = None
                 ) -> TryOnPipeline:
        """The pipeline of `model_type` (with the loader's adapter), loaded now (after asking the host for room
        for it and its working memory at `config`'s settings) if the owner does not hold it."""
        if self.owner.holds(model_type):
            return self.owner.pipeline(model_type, self.config.lora)
        from ootd.app.tryon.budget import memory_wanted

        self.host.make_room(memory_wanted(config, model_type))
        return self._load(lambda: self.owner.pipeline(model_type, self.config.lora, progress=progress))

    def preprocessor(self) -> Preprocessor:
        """Pose + parsing (what the job's checks and the mask node use)."""
        return self._load(self.owner.preprocessor)

    def classifier(self) -> GarmentClassifier:
        """`auto`'s classifier of these checkpoints, on the CPU."""
        return self._load(self.owner.classifier)

    def _load(self, get: Callable[[], T]) -> T:
        """`get()` from the owner, and the host told (`sync`). A failed load raises its error (the node's) and
        leaves every model loaded before in place (reloading them would cost the user minutes): the owner raises
        that error again at once while the files it read are unchanged, and loads anew once they changed, so in
        ComfyUI the user fixes the file and queues the prompt again (ootd/models/files.py)."""
        start = time.perf_counter()
        try:
            model = get()
        except OotdError:
            self.sync()  # what the owner let go to make room for the load is no longer counted
            raise
        self.sync(time.perf_counter() - start)
        return model

    def sync(self, seconds: float = 0.0) -> None:
        """Tell the host what the owner holds now: a model it let go is no longer counted, one it loaded (in
        `seconds`) is counted, with its size."""
        kept = self.owner.held()
        for gone in [name for name in self.held if name not in kept]:
            self.host.drop(self.held.pop(gone))
        for name in [name for name in kept if name not in self.held]:
            model = self._held_model(name)
            self.loads[name] = self.loads.get(name, 0) + 1
            self.held[name] = self.host.hold(f"ootd {shown(name)}", resident_bytes(model),
                                             partial(self.release, name), "cpu" if name == "classifier" else None)
            logger.info("ootd: %s loaded in %.1f s", shown(name), seconds)

    def _held_model(self, name: str) -> Any:
        if name in ModelType.words():
            return self.owner.pipeline(ModelType(name), self.config.lora)
        return {"preprocessor": self.owner.preprocessor, "classifier": self.owner.classifier}[name]()

    def release(self, name: str | None = None) -> None:
        """Drop one held model (by the owner's name: `hd`, `dc`, `preprocessor`, `classifier`) or all, giving
        its memory back."""
        from ootd.models import Kind

        names = [name] if name is not None else list(self.held)
        for one in names:
            token = self.held.pop(one, None)
            if token is None:
                continue
            if one in ModelType.words():
                self.owner.release(Kind.PIPELINE, model_type=ModelType(one))
            else:
                self.owner.release(Kind(one))
            self.host.drop(token)
            logger.info("ootd: %s released", shown(one))


_PREPROCESSOR: Callable[[], Any] | None = None


def use_preprocessor(make: Callable[[], Any] | None) -> None:
    """Pose + parsing from `make` instead of the checkpoints for the owners made from now on (None: from the
    checkpoints again): the seam for an application that brings its own, and for tests (the tiny checkpoints'
    random pose network finds nobody, so their ComfyUI gets a synthetic person's). ComfyUI runs prompts on a
    thread of its own, so a `use_models` block around its start would not reach them."""
    global _PREPROCESSOR
    _PREPROCESSOR = make


_TABLE: dict[ModelChoice, SharedModels] = {}


def shared_models(choice: ModelChoice, config: RunConfig, host: Host) -> SharedModels:
    """The models of `choice`, shared by every node and prompt of this process."""
    models = _TABLE.get(choice)
    if models is None:
        models = _TABLE[choice] = SharedModels(config, host)
    return models


def forget(choice: ModelChoice) -> None:
    """Release a choice's models and drop it from the table."""
    models = _TABLE.pop(choice, None)
    if models is not None:
        models.release()


@dataclass(frozen=True)
class ModelHandle:
    """The loader node's output: the choice, its config (checked), and the way to its shared models."""

    choice: ModelChoice
    config: RunConfig
    host: Host = field(compare=False, repr=False)

    @property
    def models(self) -> SharedModels:
        return shared_models(self.choice, self.config, self.host)

    def run_config(self, **words: Any) -> RunConfig:
        """The config of one try-on or mask: the loader's words with the node's settings on top."""
        from ootd.app.tryon.config import build_config

        return build_config(**self.choice.config_words(), **words)

    def describe(self) -> str:
        """The folder and device, and each setting the loader chose (left out: its default in words), in the
        declarations' order."""
        from ootd.app.tryon.settings import SETTINGS

        words = dict(self.choice.words)
        chosen = [f"{one.shown_label} {one.default_words() if words[one.name] is None else shown_word(words[one.name])}"
                  for one in SETTINGS if one.name in words]
        return f"{self.choice.checkpoints} on {self.choice.device}: {', '.join(chosen)}"


def shown_word(word: Any) -> str:
    """A setting's word as the loader's summary shows it: a file by its name, a number as short as it reads."""
    if isinstance(word, Path):
        return word.name
    return f"{word:g}" if isinstance(word, float) else str(word)


def make_handle(choice: ModelChoice, host: Host) -> ModelHandle:
    """Every word of the choice checked (the checkpoints folder there, the device, precision and attention
    runnable here, the adapter readable), nothing loaded."""
    from ootd.app.tryon.config import build_config
    from ootd.app.tryon.loader import check_checkpoints_present, check_hardware

    config = build_config(**choice.config_words())
    check_checkpoints_present(config.checkpoints, [], need_preprocess=False)
    check_hardware(config)
    return ModelHandle(choice, config, host)



def resident_bytes(model: Any) -> int:
    """Bytes of the weights a loaded model holds: the tensors of the torch modules among its attributes (two
    levels down: a pipeline's components, the pose estimator's network), each counted once, and the ONNX files
    its sessions were made from (human parsing)."""
    import torch

    seen: set[int] = set()
    total = 0
    found: list[Any] = []

    def visit(value: Any, depth: int) -> None:
        nonlocal total
        if isinstance(value, torch.nn.Module):
            found.append(value)
        elif isinstance(value, Path) and value.suffix == ".onnx" and value.is_file():
            total += value.stat().st_size
        elif depth < 2 and hasattr(value, "__dict__") and not isinstance(value, type):
            for item in vars(value).values():
                visit(item, depth + 1)

    visit(model, 0)
    for module in found:
        for tensor in (*module.parameters(), *module.buffers()):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                total += tensor.numel() * tensor.element_size()
    return total
