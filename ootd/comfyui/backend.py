"""What the nodes take from the rest of ootd, in one module: the settings a node offers (its inputs, named as the
HTTP API's form fields, with their bounds and defaults) and their conversion to `build_config`'s keywords; the
model handle the loader node hands on, and the models it shares across nodes and prompts; the library's messages
worded for a node (its inputs, not command-line flags).

Nothing else in this package touches the settings' declarations or the models, so this is the one module to change
when either moves.

The models of one loader choice (`ModelChoice`: checkpoints, model type, precision, attention, adapter, device)
are held by one `SharedModels`, found by that choice in a process-wide table: ootd's model owner (`Models`,
ootd/models/, the only thing that loads a network) with ComfyUI's hooks around it. The first try-on that needs a
model loads it, every later one (any node, any prompt) reuses it; both model types stay (an outfit needs both),
and the classifier. A `Host` (ComfyUI's model management, ootd/comfyui/host.py) is asked to make room before a
pipeline loads and told what the owner holds, and gets the model released when it asks for its memory back.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ootd.errors import OotdError
from ootd.settings import (
    DEFAULT_CATEGORY_MARGIN,
    DEFAULT_FEATHER,
    MAX_FEATHER,
    MAX_MASK_GROW,
    RESOLUTIONS,
    AttentionName,
    FitMode,
    ModelType,
    OutputSize,
    PrecisionName,
    SamplingSettings,
    SchedulerName,
    SpeedPreset,
)
from ootd.weights.lora import MAX_LORA_SCALE

if TYPE_CHECKING:
    from ootd.app.tryon.config import RunConfig
    from ootd.method.classify import GarmentClassifier
    from ootd.models import Models
    from ootd.pipeline import TryOnPipeline
    from ootd.pipeline_types import Progress
    from ootd.preprocessing import Preprocessor

T = TypeVar("T")

logger = logging.getLogger("ootd.comfyui")

AUTO = "auto"
NO_LORA = "none"


# ------------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Setting:
    """One input of the try-on node: its name (the HTTP API's form field), kind, default, bounds and tooltip."""

    name: str
    kind: str  # "int", "float", "bool" or "choice"
    default: Any
    tooltip: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    choices: tuple[str, ...] = ()


# Bounds as ootd checks them (SamplingSettings.validate, settings.py): tests/frontends/comfyui/test_backend.py
# holds them to it (a value at each bound runs, one past it is refused).
TRYON_SETTINGS: tuple[Setting, ...] = (
    Setting("samples", "int", SamplingSettings.num_samples, "pictures to make, each from its own noise: the "
            "IMAGE output is a batch of this many", 1, 64),
    Setting("steps", "int", SamplingSettings.steps, "denoising steps (ComfyUI's progress bar moves with them)",
            1, 1000),
    Setting("scale", "float", SamplingSettings.guidance_scale, "image guidance scale, 0 to 50 (off below 1)",
            0.0, 50.0, 0.1),
    Setting("seed", "int", 0, "the random seed: the same seed and settings give the same pictures as `ootd run "
            "--seed`", 0, 2**63 - 1),
    Setting("resolution", "choice", str(SamplingSettings.resolution), "the working size: 768x1024 (the released "
            "models' own) or 384x512 (faster)", choices=tuple(RESOLUTIONS)),
    Setting("scheduler", "choice", SamplingSettings.scheduler.value, "the sampler (unipc: the original's)",
            choices=SchedulerName.words()),
    Setting("fit", "choice", FitMode.PAD.value, "how a photo that is not 3:4 is framed: pad, crop or stretch",
            choices=FitMode.words()),
    Setting("keep_unmasked", "bool", False, "on: the pictures are the person photo itself, at its own size, with "
            "only the garment's region replaced (output_size is then the photo's)"),
    Setting("output_size", "choice", OutputSize.WORKING.value, "working: the pictures at the resolution; photo: "
            "the generated picture at the person photo's size and framing", choices=OutputSize.words()),
    Setting("feather", "int", DEFAULT_FEATHER, "with keep_unmasked: the seam's width in pixels of a 1024 px high "
            "picture (unused without it)", 0, MAX_FEATHER),
    Setting("speed", "choice", SpeedPreset.EXACT.value, "exact: the method's own pictures; fast: token merging "
            "and feature caching (different pictures, fewer seconds)", choices=SpeedPreset.words()),
)
MASK_SETTINGS: tuple[Setting, ...] = (
    Setting("grow", "int", 0, "pixels (of a 512 px high frame) added around the mask", 0, MAX_MASK_GROW),
    next(s for s in TRYON_SETTINGS if s.name == "resolution"),
    next(s for s in TRYON_SETTINGS if s.name == "fit"),
)
MARGIN = Setting("margin", "float", DEFAULT_CATEGORY_MARGIN, "the lead over the second likeliest category that "
                 "`auto` needs; under it the garment is refused (0: never refuse)", 0.0, 0.99, 0.01)
LOADER_CHOICES = {
    "model_type": ((AUTO, *ModelType.words()), "auto: hd for upper-body garments, dc otherwise; dc also does "
                   "upper garments"),
    "precision": (PrecisionName.words(), "auto: ootd's profile of ComfyUI's device (fp32 on most CPUs, fp16 or "
                  "bf16 on GPUs)"),
    "attention": (AttentionName.words(), "auto: ootd's choice for the device (a fused kernel where it is exact)"),
}
LORA_SCALE = Setting("lora_scale", "float", 1.0, "how much of the adapter: 0 = the base model's pictures, 1 = as "
                     "trained", 0.0, MAX_LORA_SCALE, 0.05)


def tryon_keywords(values: dict[str, Any]) -> dict[str, Any]:
    """The try-on node's settings -> `build_config` keywords. A node always has a value for every widget, so
    `feather` counts only with `keep_unmasked` (its tooltip says so) and `keep_unmasked` means the photo's
    size, whatever `output_size` says."""
    keep = bool(values["keep_unmasked"])
    return {"samples": int(values["samples"]), "steps": int(values["steps"]), "scale": float(values["scale"]),
            "seed": int(values["seed"]), "resolution": str(values["resolution"]),
            "scheduler": str(values["scheduler"]), "fit": str(values["fit"]), "speed": str(values["speed"]),
            "keep_unmasked": keep, "output_size": None if keep else str(values["output_size"]),
            "feather": int(values["feather"]) if keep else None}


def mask_keywords(values: dict[str, Any]) -> dict[str, Any]:
    return {"mask_grow": int(values["grow"]), "resolution": str(values["resolution"]), "fit": str(values["fit"])}


# --------------------------------------------------------------------------------------------------- wording

# The library's messages name command-line flags; a node has inputs. Until the library carries the setting with
# its errors, its flags are worded here, once, as the inputs that set them.
_INPUTS = {"--model-type": "model_type", "--category": "category", "--mask": "mask", "--cloth": "garment",
           "--model": "person", "--samples": "samples", "--steps": "steps", "--scale": "scale", "--seed": "seed",
           "--resolution": "resolution", "--scheduler": "scheduler", "--fit": "fit", "--feather": "feather",
           "--keep-unmasked": "keep_unmasked", "--output-size": "output_size", "--speed": "speed",
           "--mask-grow": "grow", "--category-margin": "margin", "--lora-scale": "lora_scale", "--lora": "lora",
           "--precision": "precision", "--attention": "attention"}
_PHRASES = (
    ("pass --checkpoints DIR / set OOTD_CHECKPOINTS", "set the ootd Loader's checkpoints_path"),
    ("make one with `ootd mask`", "make one with the ootd Mask node"),
    ("give a mask image with --mask", "connect a MASK to the mask input"),
    ("`ootd run --mask`", "the try-on's mask input"),
    ("one --cloth", "one garment"),
)
_FLAG = re.compile(r"--[a-z][a-z-]*")


def node_words(message: str) -> str:
    """One line in a node's words: the flags of a library message as the inputs that set them."""
    text = " ".join(str(message).split())
    for words, ours in _PHRASES:
        text = text.replace(words, ours)
    return _FLAG.sub(lambda m: f"input {_INPUTS[m.group()]}" if m.group() in _INPUTS else m.group(), text)


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
    """What the loader node chose: the handle's identity (equal choices share their models)."""

    checkpoints: Path
    model_type: str = AUTO
    precision: str = PrecisionName.AUTO.value
    attention: str = AttentionName.AUTO.value
    lora: Path | None = None
    lora_scale: float = 1.0
    device: str = "cpu"

    def config_words(self) -> dict[str, Any]:
        """Its `build_config` keywords."""
        return {"checkpoints": self.checkpoints, "model_type": None if self.model_type == AUTO else self.model_type,
                "precision": self.precision, "attention": self.attention, "device": self.device,
                "lora": self.lora, "lora_scale": self.lora_scale if self.lora is not None else 1.0}


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
        self.owner = self._new_owner()

    def _new_owner(self) -> Models:
        from ootd.app.tryon.loader import models_for
        from ootd.models import Keep, ModelSource
        from ootd.models.source import current_source

        source = current_source()
        if _PREPROCESSOR is not None:
            source = replace(source or ModelSource(), preprocessor=_PREPROCESSOR)
        return models_for(self.config, Keep(pipelines=len(ModelType), classifier=True), source)

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
        """`get()` from the owner, and the host told (`sync`). A failed load is not kept (the owner would raise it
        again at once): in ComfyUI the user fixes the file and queues the prompt again, so the next prompt gets an
        owner that loads anew (what this one held is released)."""
        start = time.perf_counter()
        try:
            model = get()
        except OotdError:
            self.release()
            self.owner = self._new_owner()
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
        choice = self.choice
        lora = f", adapter {choice.lora.name} x {choice.lora_scale:g}" if choice.lora is not None else ""
        return (f"{choice.checkpoints} on {choice.device}: model type {choice.model_type}, precision "
                f"{choice.precision}, attention {choice.attention}{lora}")


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
