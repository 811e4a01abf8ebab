"""A fine-tune's models, built by the model owner (`Models.trainable`): the inference pipeline over the two UNets
and the VAE (its fusion is the objective's, its `generate` makes the validation try-ons), LoRA on the UNets, the
objective module.

The CLIP encoders are not loaded: every prompt embedding is in the cache, and the pipeline has none (asking it for
conditioning is an error that says so).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ootd.errors import OotdError
from ootd.settings import ModelType
from ootd.training.settings import MixedPrecision, TrainSettings

if TYPE_CHECKING:
    from ootd.pipeline import TryOnPipeline
    from ootd.runtime import Runtime
    from ootd.training.distill import ConsistencyObjective
    from ootd.training.objective import TryOnObjective
    from ootd.weights.loading import Components


class Lease:
    """Which run trains a fine-tune's models now (`TrainingModels.in_run`): one at a time. Shared by the copies a
    distillation makes of the holder (`dataclasses.replace` keeps the same object), so the owner's holder sees it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.run: str | None = None  # the run folder of the run that holds the models, None while none does


@dataclass
class TrainingModels:
    """The models of one worker's fine-tune: `pipe` for validation, `objective` for the loss, the adapters'
    `params` (the only trainable ones), the adapted UNets by name (ootd/weights/lora.py UNET_NAMES), and
    `initial`: the adapters' values as made, on the CPU (`restart` puts them back: a run trains `params` in place).
    A run holds them from its start to its end (`in_run`); asking the owner for them meanwhile is an error."""

    pipe: TryOnPipeline
    objective: TryOnObjective | ConsistencyObjective  # a fine-tune's, or a distillation's (ootd train distill)
    params: list[torch.nn.Parameter]
    unets: dict[str, torch.nn.Module]
    device: torch.device
    autocast: torch.dtype | None
    initial: list[torch.Tensor] = field(repr=False)
    lease: Lease = field(default_factory=Lease, repr=False, compare=False)

    def restart(self) -> None:
        """The adapters back to their values as made, without gradients: what the model owner hands each run
        (the optimizer of the run before changed them in place). Bit for bit: a copy, not a draw again. Refused
        while a run holds them (`in_run`): it would silently undo what that run has trained so far."""
        with self.lease.lock:
            if self.lease.run is not None:
                raise OotdError(f"the fine-tune's models are in use by the training run in {self.lease.run}: "
                                "asking the model owner for them again (Models.trainable) would put their adapter "
                                "back as made in the middle of that run; ask once it has ended, or use another "
                                "model owner")
            with torch.no_grad():
                for param, value in zip(self.params, self.initial, strict=True):
                    param.copy_(value)
                    param.grad = None

    @contextlib.contextmanager
    def in_run(self, run: str) -> Iterator[TrainingModels]:
        """Held by the run `run` (its folder) from its start (the trainer made, a checkpoint restored) to its end,
        however it ends; a second run, or a `restart` (an ask of the owner), meanwhile is an error."""
        with self.lease.lock:
            if self.lease.run is not None:
                raise OotdError(f"the fine-tune's models are in use by the training run in {self.lease.run}: "
                                f"the run in {run} cannot train them at the same time; start it once that run has "
                                "ended, or give it models of another model owner")
            self.lease.run = run
        try:
            yield self
        finally:
            with self.lease.lock:
                self.lease.run = None

    @contextlib.contextmanager
    def validating(self) -> Iterator[TryOnPipeline]:
        """The pipeline for validation try-ons; afterwards every model is back on the device (a validation
        call's memory plan may have offloaded one the training steps need there)."""
        try:
            yield self.pipe
        finally:
            self.pipe.residency.place("none")


def weight_dtype(mixed: MixedPrecision) -> torch.dtype:
    """The dtype the trained UNets are loaded in (and autocast's when mixed)."""
    return {MixedPrecision.NO: torch.float32, MixedPrecision.BF16: torch.bfloat16,
            MixedPrecision.FP16: torch.float16}[mixed]


def training_components(components: Components) -> Components:
    """A model type's components without what a fine-tune never runs (the CLIP encoders, tokenizer, processor)."""
    from dataclasses import replace

    return replace(components, tokenizer=None, text_encoder=None, image_encoder=None, image_processor=None)


def build_training_models(components: Components, model_type: ModelType, runtime: Runtime,
                          settings: TrainSettings) -> TrainingModels:
    """The pipeline over `components` first (it freezes every model it holds), then the adapters: their parameters
    are the only trainable ones after."""
    from ootd.pipeline import TryOnPipeline
    from ootd.training.adapters import add_lora, target_modules
    from ootd.training.objective import TryOnObjective

    pipe = TryOnPipeline(components, model_type, runtime.device, runtime.precision, runtime.attention_fn(),
                         profile=runtime.profile)
    unets = {"unet_vton": components.unet_vton}
    if settings.train_garment:
        unets["unet_garm"] = components.unet_garm
    params: list[torch.nn.Parameter] = []
    for i, (name, unet) in enumerate(unets.items()):
        targets = target_modules(unet, skip_last_block=name == "unet_garm")
        params += add_lora(unet, targets, settings.rank, settings.alpha, settings.seed + i)
        if settings.gradient_checkpointing:
            unet.enable_gradient_checkpointing()
    objective = TryOnObjective(components.unet_garm, components.unet_vton, pipe.fusion, components.scheduler_config,
                               garment_grad=settings.train_garment)
    objective.train()
    dtype = weight_dtype(settings.mixed_precision)
    autocast = None if settings.mixed_precision is MixedPrecision.NO else dtype
    initial = [p.detach().to("cpu", copy=True) for p in params]  # small: the adapters alone
    return TrainingModels(pipe, objective, params, unets, runtime.device.torch_device, autocast, initial)
