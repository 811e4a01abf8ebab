"""`Models`: the one owner of every network in the process (the package docstring says what it guarantees)."""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ootd.errors import OotdError, UsageError
from ootd.models.files import Failure, files_state
from ootd.models.source import ModelSource, current_source
from ootd.pipeline_types import Progress
from ootd.settings import ModelType, ParsingProvider
from ootd.speedups.modes import SpeedModes

if TYPE_CHECKING:
    import torch

    from ootd.attention import AttentionFn
    from ootd.evaluation.networks import Networks
    from ootd.evaluation.settings import MetricWeights
    from ootd.hardware.policy import Precision
    from ootd.method.classify import GarmentClassifier
    from ootd.models.training import TrainingModels
    from ootd.pipeline import TryOnPipeline
    from ootd.preprocessing import Preprocessor
    from ootd.runtime import HardwareChoice, Runtime, RuntimeRequest
    from ootd.training.encode import Encoders
    from ootd.training.settings import TrainSettings
    from ootd.weights.loading import Components
    from ootd.weights.lora import LoraChoice

T = TypeVar("T")


class Kind(StrEnum):
    """What the owner holds, by kind (`release` takes them; `held` lists them)."""

    PIPELINE = "pipeline"  # a try-on pipeline: one model type, one adapter
    PREPROCESSOR = "preprocessor"  # pose + parsing
    CLASSIFIER = "classifier"  # CLIP's zero-shot garment categories (`--category auto`)
    ENCODERS = "encoders"  # the VAE and CLIP encoders `ootd train prepare` computes its cache with
    COMPONENTS = "components"  # one model type's networks, no pipeline (the benchmark's)
    TRAINABLE = "trainable"  # a fine-tune's models
    METRICS = "metrics"  # the evaluation's networks


_HEAVY = frozenset({Kind.PIPELINE, Kind.ENCODERS, Kind.COMPONENTS, Kind.TRAINABLE, Kind.METRICS})
# What loading a kind releases first: what never stays in memory beside it. Pose + parsing (small, shared by the
# pipelines) and the classifier stay unless released on request; a try-on pipeline also drops the classifier
# unless `Keep.classifier`, and the least recently used pipelines beyond `Keep.pipelines`.
DISPLACES: dict[Kind, frozenset[Kind]] = {
    Kind.PIPELINE: _HEAVY - {Kind.PIPELINE},
    Kind.PREPROCESSOR: frozenset(),
    Kind.CLASSIFIER: frozenset(),
    Kind.ENCODERS: _HEAVY | {Kind.CLASSIFIER},
    Kind.COMPONENTS: _HEAVY | {Kind.CLASSIFIER},
    Kind.TRAINABLE: _HEAVY | {Kind.CLASSIFIER},
    Kind.METRICS: _HEAVY | {Kind.CLASSIFIER},
}


@dataclass(frozen=True)
class Keep:
    """What may stay in memory together beyond `DISPLACES`: how many try-on pipelines (a server answering both
    kinds of garment keeps one per model type), and whether the classifier stays while a pipeline loads (a server
    classifies requests all day; a command classifies every garment first, and the try-on's memory plan does not
    count the classifier)."""

    pipelines: int = 1
    classifier: bool = False


@dataclass
class LoadTime:
    """The loads of a block (`Models.timed`): how many, and their seconds."""

    seconds: float = 0.0
    count: int = 0


def _silent(stage: str, done: int, total: int) -> None:
    return None


class Models:
    """Every network of one process (or Ray actor, or replica): made by a front end from one RuntimeRequest and
    the checkpoints folder, handed down, asked through its typed getters. `keep`: what may stay in memory together;
    `source`: models to use instead of loading (else those of an enclosing `use_models`); `attention`: an attention
    function instead of the chosen backend (experiments). Getters may be called from several threads (a server
    classifies requests while its worker runs a try-on); one model loads once however many ask at the same time.
    """

    def __init__(self, checkpoints: Path | str | None, request: RuntimeRequest | None = None, *,
                 parsing_provider: ParsingProvider = ParsingProvider.CPU, max_memory: int | None = None,
                 modes: SpeedModes | None = None, keep: Keep = Keep(), source: ModelSource | None = None,
                 attention: AttentionFn | None = None) -> None:
        self.checkpoints = Path(checkpoints) if checkpoints is not None else None
        self._request = request
        self.parsing_provider = parsing_provider
        self.max_memory = max_memory
        self.modes = modes or SpeedModes()
        self.keep = keep
        self.source = source if source is not None else current_source()
        self._attention = attention
        self._runtime: Runtime | None = None
        self._held: OrderedDict[tuple, Any] = OrderedDict()  # least recently used first
        self._failed: dict[tuple, Failure] = {}  # stands while the files the load read are unchanged
        self._pipeline_loads: dict[str, int] = {}  # by model type
        self._pipeline_seconds = 0.0
        self._timers: list[tuple[LoadTime, frozenset[Kind]]] = []
        self._lock = threading.RLock()
        self._key_locks: dict[tuple, threading.Lock] = {}

    @classmethod
    def from_pretrained(cls, checkpoints: str | Path, *, device: str | None = None, dtype: Any = None,
                        attention: str | AttentionFn = "auto", parsing_provider: str = "cpu",
                        profile: str | Path | None = None, max_memory: int | None = None,
                        channels_last: bool | None = None, compile: bool | None = None, quantize: str | None = None,
                        speed: SpeedModes | None = None, threads: int | None = None, keep: Keep = Keep(),
                        source: ModelSource | None = None) -> Models:
        """The owner of a checkpoints tree in the released layout, from a library user's words (parsed here, once).

        `device` None picks the best available; `dtype` (a word or a torch dtype; None: the device profile's, fp32
        on the CPU); `attention` a backend name (auto, flash, sdpa, chunked, math) or an attention function;
        `profile` a TOML file over the device profile (configs/profiles/); `speed` the speed modes
        (ootd/speedups/modes.py) calls run with, `channels_last`, `compile` and `quantize` (none, int8-dynamic,
        int8-weight, fp8: the `quant` extra) over its fields; `threads` torch's CPU threads; `keep` and `source`
        as the constructor's."""
        from ootd.hardware.dtypes import dtype_name
        from ootd.runtime import RuntimeRequest
        from ootd.settings import AttentionName, PrecisionName, QuantizeName

        given = {"channels_last": channels_last, "compile": compile,
                 "quantize": QuantizeName.parse(quantize) if quantize is not None else None}
        modes = replace(speed or SpeedModes(), **{k: v for k, v in given.items() if v is not None})
        word = dtype if isinstance(dtype, str | None) else dtype_name(dtype)
        request = RuntimeRequest(
            device=device, precision=PrecisionName.parse(word or PrecisionName.AUTO, "precision"),
            attention=AttentionName.parse(attention, "attention backend") if isinstance(attention, str)
            else AttentionName.AUTO, quantize=modes.quantize, channels_last=modes.channels_last,
            compile=modes.compile, profile=Path(profile) if profile else None, threads=threads)
        return cls(Path(checkpoints), request, keep=keep, source=source, max_memory=max_memory, modes=modes,
                   parsing_provider=ParsingProvider.parse(parsing_provider, "parsing provider"),
                   attention=None if isinstance(attention, str) else attention)

    # -- where and how ------------------------------------------------------------------------------

    @property
    def request(self) -> RuntimeRequest:
        if self._request is None:
            from ootd.runtime import RuntimeRequest

            self._request = RuntimeRequest()
        return self._request

    def runtime(self) -> Runtime:
        """Where and how every model runs (ootd/runtime.py): resolved once, when first asked (the first load)."""
        with self._lock:
            if self._runtime is None:
                from ootd.runtime import resolve_runtime

                self._runtime = resolve_runtime(self.request, attention=self._attention)
            return self._runtime

    def hardware(self) -> HardwareChoice:
        """What the request means on this machine, known before anything loads (no GPU initialised)."""
        from ootd.runtime import choose_hardware

        return choose_hardware(self.request)

    @property
    def device(self) -> torch.device | None:
        """The device the models run on, once the runtime is resolved (None before: nothing ran yet)."""
        return self._runtime.device.torch_device if self._runtime is not None else None

    # -- the getters --------------------------------------------------------------------------------

    def pipeline(self, model_type: ModelType | str, lora: LoraChoice | str | Path | None = None,
                 lora_scale: float = 1.0, *, progress: Progress | None = None) -> TryOnPipeline:
        """The try-on pipeline of `model_type` with the adapter `lora` (a checked LoraChoice, or a file `ootd
        train` wrote, merged at `lora_scale`; None: the released weights), loaded now unless held; `progress` hears
        ("load", done, total) as it loads."""
        from ootd.weights.lora import LoraChoice

        model_type = ModelType.parse(model_type)
        if not isinstance(lora, LoraChoice):
            lora = LoraChoice.parse(lora, lora_scale)
        key = (Kind.PIPELINE, model_type, lora)
        if self.source is not None and self.source.pipeline is not None:
            return self._get(key, lambda tick: self.source.pipeline(model_type), progress)
        from ootd.models.build import build_pipeline, network_files

        def build(tick: Progress | None) -> TryOnPipeline:
            runtime = self.runtime()
            with self._lock:
                held = self._find(Kind.PREPROCESSOR)
            return build_pipeline(lambda: self._components(model_type, runtime.precision, tick), model_type,
                                  runtime, modes=self.modes, preprocessor=held or self.preprocessor,
                                  parsing_provider=self.parsing_provider, max_memory=self.max_memory, lora=lora,
                                  checkpoints=self.checkpoints)

        def files() -> tuple[Path, ...]:
            return network_files(self.checkpoints, model_type) + ((lora.path,) if lora is not None else ())

        return self._get(key, build, progress, reports=True, files=files)

    def preprocessor(self, progress: Progress | None = None) -> Preprocessor:
        """Pose + parsing, on the device the pipelines use (they share it)."""
        if self.source is not None and self.source.preprocessor is not None:
            return self._get((Kind.PREPROCESSOR,), lambda tick: self.source.preprocessor(), progress)
        from ootd.models.build import load_preprocessor, preprocessor_files

        return self._get((Kind.PREPROCESSOR,), lambda tick: load_preprocessor(
            self._checkpoints(), self.runtime(), self.parsing_provider), progress,
            files=lambda: preprocessor_files(self.checkpoints))

    def classifier(self, progress: Progress | None = None) -> GarmentClassifier:
        """CLIP's zero-shot garment classifier (`--category auto`), on the CPU in fp32."""
        from ootd.models.build import classifier_files, load_classifier

        return self._get((Kind.CLASSIFIER,), lambda tick: load_classifier(self._checkpoints()), progress,
                         files=lambda: classifier_files(self.checkpoints))

    def encoders(self, progress: Progress | None = None) -> Encoders:
        """The VAE and CLIP encoders on the device, in the runtime's dtypes (`ootd train prepare`)."""
        from ootd.models.build import encoder_files, load_encoders

        return self._get((Kind.ENCODERS,), lambda tick: load_encoders(self._checkpoints(), self.runtime()),
                         progress, files=lambda: encoder_files(self.checkpoints))

    def components(self, model_type: ModelType, precision: Precision | None = None,
                   progress: Progress | None = None) -> Components:
        """Every network of one model type on the CPU, in `precision` (None: the runtime's): what the benchmark
        builds its own calls from."""
        from ootd.models.build import network_files

        runtime = self.runtime()
        chosen = precision or runtime.precision
        return self._get((Kind.COMPONENTS, model_type, tuple(chosen.dtypes().values())),
                         lambda tick: self._components(model_type, chosen, tick), progress, reports=True,
                         files=lambda: network_files(self.checkpoints, model_type))

    def trainable(self, model_type: ModelType, settings: TrainSettings, progress: Progress | None = None, *,
                  merged: LoraChoice | None = None) -> TrainingModels:
        """A fine-tune's models (ootd/models/training.py) in the runtime's precision, the adapters added; `merged`:
        an `ootd train` adapter merged into the UNets first, at its scale (a distillation's teacher). Each ask
        hands them with the adapters as made (`TrainingModels.restart`), whatever a run before trained into them:
        they serve one run at a time, and an ask while a run holds them (`TrainingModels.in_run`) is an OotdError
        rather than a silent reset of that run's weights."""
        from ootd.models.build import load_training_components, training_files
        from ootd.models.training import build_training_models, training_components
        from ootd.weights.lora import apply_lora, read_adapter

        adapter = read_adapter(merged.path) if merged is not None else None  # a damaged file fails before loading

        def build(tick: Progress | None) -> TrainingModels:
            runtime = self.runtime()
            if self.source is not None and self.source.components is not None:
                components = training_components(self.source.components(model_type, runtime.precision,
                                                                        runtime.device.torch_device))
            else:
                components = load_training_components(self._checkpoints(), model_type, runtime)
            apply_lora(components, model_type, adapter, merged.scale if merged is not None else 1.0)
            return build_training_models(components, model_type, runtime, settings)

        def files() -> tuple[Path, ...]:
            return training_files(self.checkpoints, model_type) + ((merged.path,) if merged is not None else ())

        trained = self._get((Kind.TRAINABLE, model_type, settings, merged), build, progress, files=files)
        trained.restart()
        return trained

    def metrics(self, weights: MetricWeights, progress: Progress | None = None) -> Networks | None:
        """The evaluation's networks (InceptionV3 features, LPIPS) on the runtime's device; None where the eval
        extra is not installed (ootd/evaluation/networks.py `stack_problem` says why)."""
        from ootd.models.build import load_metrics

        source = self.source.metrics if self.source is not None else None
        if source is None:
            from ootd.evaluation.networks import stack_problem

            if stack_problem() is not None:  # nothing to hold (`held` never lists networks that are not there)
                return None
        return self._get((Kind.METRICS, weights),
                         lambda tick: load_metrics(weights, self.runtime().device.torch_device, source), progress)

    def check_metrics(self, weights: MetricWeights) -> str | None:
        """What `metrics` needs, checked before any work (the published weights fetched where the eval extra is):
        why the networks cannot run here, or None (also when a source stands in for them)."""
        if self.source is not None and self.source.metrics is not None:
            return None
        from ootd.evaluation.networks import check_networks

        return check_networks(weights)

    # -- what is held, what it cost -----------------------------------------------------------------

    def holds(self, model_type: ModelType) -> bool:
        """Whether a pipeline of `model_type` is in memory."""
        with self._lock:
            return any(key[0] is Kind.PIPELINE and key[1] is model_type for key in self._held)

    def held(self) -> list[str]:
        """What is in memory: `hd`, `dc` for pipelines, the kind's word for the rest, in the order last used."""
        with self._lock:
            return [key[1].value if key[0] is Kind.PIPELINE else key[0].value for key in self._held]

    def failure(self, model_type: ModelType) -> OotdError | None:
        """The error loading a pipeline of `model_type` failed with (remembered), else None."""
        with self._lock:
            return next((failed.error for key, failed in self._failed.items()
                         if key[0] is Kind.PIPELINE and key[1] is model_type), None)

    @property
    def loads(self) -> dict[str, int]:
        """Pipelines loaded, by model type (tests and summaries: each loads once)."""
        return dict(self._pipeline_loads)

    @property
    def seconds(self) -> float:
        """Seconds spent loading pipelines so far."""
        return self._pipeline_seconds

    @contextmanager
    def timed(self, *kinds: Kind) -> Iterator[LoadTime]:
        """The loads of `kinds` (default: pipelines) made inside the block, counted and timed: what a front end
        reports as its `load` time, apart from the work it loaded for."""
        timer = LoadTime()
        entry = (timer, frozenset(kinds or (Kind.PIPELINE,)))
        self._timers.append(entry)
        try:
            yield timer
        finally:
            self._timers.remove(entry)

    def release(self, *kinds: Kind, model_type: ModelType | None = None) -> None:
        """Drop what is held of `kinds` (none given: everything) and give its memory back (ComfyUI's "free
        memory"); `model_type`: only the try-on pipelines of that model type (a host that unloads its models one
        at a time). A released model loads again when next asked for; a remembered failure stays (while its files are
        unchanged, `_get`)."""
        with self._lock:
            self._drop([key for key in self._held if (not kinds or key[0] in kinds)
                        and (model_type is None or (key[0] is Kind.PIPELINE and key[1] is model_type))])

    # -- inside ---------------------------------------------------------------------------------------

    def _checkpoints(self) -> Path:
        if self.checkpoints is None:
            raise UsageError("no checkpoints folder was given to load models from")
        return self.checkpoints

    def _components(self, model_type: ModelType, precision: Precision, progress: Progress | None) -> Components:
        if self.source is not None and self.source.components is not None:
            made = self.source.components(model_type, precision, self.runtime().device.torch_device)
            if progress is not None:
                progress("load", 1, 1)
            return made
        from ootd.models.build import read_components

        return read_components(self._checkpoints(), model_type, precision, progress)

    def _find(self, kind: Kind) -> Any:
        return next((model for key, model in self._held.items() if key[0] is kind), None)

    def _get(self, key: tuple, build: Callable[[Progress | None], T], progress: Progress | None,
             reports: bool = False, files: Callable[[], tuple[Path, ...]] = tuple) -> T:
        """The model under `key`: held, or built now (`reports`: the build reports its own progress). A load that
        failed is not tried again while the files it read (`files`) are as they were: its error is raised at
        once; once they changed (a repaired or replaced checkpoint), the next request loads anew."""
        with self._lock:
            if key in self._held:
                self._held.move_to_end(key)
                return self._held[key]
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:  # one load per key, however many threads ask at once
            with self._lock:
                if key in self._held:
                    return self._held[key]
                failed = self._failed.get(key)
            if failed is not None and failed.stands():  # a fresh traceback: each would chain onto the last
                raise failed.error.with_traceback(None)
            with self._lock:
                self._make_room(key[0])
            return self._load(key, build, progress, reports, files())

    def _load(self, key: tuple, build: Callable[[Progress | None], T], progress: Progress | None,
              reports: bool, files: tuple[Path, ...]) -> T:
        tick = progress or _silent
        tick("load", 0, 1)
        state = files_state(files)  # before the build reads them: a repair made meanwhile is a change
        start = time.perf_counter()
        try:
            model = build(progress if reports else None)
        except OotdError as exc:  # the same error for later requests, while the files are unchanged
            with self._lock:
                self._failed[key] = Failure(exc, files, state)
            raise
        seconds = time.perf_counter() - start
        kind = key[0]
        with self._lock:
            self._held[key] = model
            self._failed.pop(key, None)
            if kind is Kind.PIPELINE:
                self._pipeline_loads[key[1].value] = self._pipeline_loads.get(key[1].value, 0) + 1
                self._pipeline_seconds += seconds
            for timer, kinds in self._timers:
                if kind in kinds:
                    timer.seconds += seconds
                    timer.count += 1
        if not reports:
            tick("load", 1, 1)  # after it is held: a progress that raises (a cancelled job) keeps the load
        return model

    def _make_room(self, kind: Kind) -> None:
        """Release what may not stay beside a model of `kind` about to load (caller holds the lock)."""
        drop = set(DISPLACES[kind])
        if kind is Kind.PIPELINE and not self.keep.classifier:
            drop.add(Kind.CLASSIFIER)
        victims = [key for key in self._held if key[0] in drop]
        if kind is Kind.PIPELINE:
            pipelines = [key for key in self._held if key[0] is Kind.PIPELINE]
            victims += pipelines[:max(0, len(pipelines) - max(0, self.keep.pipelines - 1))]
        self._drop(victims)

    def _drop(self, keys: list[tuple]) -> None:
        if not keys:
            return
        for key in keys:
            del self._held[key]
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is None:
            return
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        elif self._runtime is not None and self._runtime.device.type == "mps":
            torch.mps.empty_cache()

