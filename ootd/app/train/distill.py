"""`ootd train distill`: a few-step adapter from the model as loaded, on a prepared cache (docs/training.md).

The run is `ootd train run`'s (ootd/app/train/loop.py): the same cache, data order, checkpoints, `--resume`, signals,
loss log and plot, and Ray Train engine; what differs is here. The objective is latent consistency distillation
(ootd/training/distill.py) into a LoRA on the try-on UNet; the teacher is the model as loaded, optionally with an
`ootd train` adapter merged in; after every optimizer update the target network (an EMA of the student) follows, in
the same unit against signals, and every checkpoint holds it (`target.safetensors`), so a resumed run continues
exactly. The adapter file records its sampling and base weights (ootd/weights/fewstep.py); with a teacher adapter,
RUN/lora.safetensors holds that adapter and the distilled one as one LoRA (ootd/training/adapters.py `stack`), so
`--lora RUN/lora.safetensors` on the released weights is the whole distilled model. The validation sheets put the
student at 1, 2, 4 and 8 steps beside the teacher at 20 (ootd/app/train/distill_sheets.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from ootd.app.train.checkpoints import checkpoints
from ootd.app.train.loop import Trainer, TrainOptions, training_models
from ootd.errors import UsageError, printable
from ootd.models.training import TrainingModels
from ootd.settings import ModelType
from ootd.training.cache import CacheIndex
from ootd.training.settings import DistillSettings
from ootd.weights.fewstep import FewStep, base_sha256, weights_sha256
from ootd.weights.lora import LoraAdapter, LoraChoice, read_adapter

if TYPE_CHECKING:
    from ootd.models import Models

TARGET_FILE = "target.safetensors"  # a checkpoint's target network (the EMA of the student's LoRA)


@dataclass(frozen=True)
class DistillOptions(TrainOptions):
    """What `ootd train distill` was asked for, checked: a fine-tune's options, DistillSettings, and the teacher's
    `ootd train` adapter (None: the base weights alone)."""

    teacher: LoraChoice | None = None

    def load_models(self, index: CacheIndex, models: Models | None = None) -> TrainingModels:
        return load_distill_models(models or training_models(self), ModelType.parse(index.model_type), self.distill,
                                   self.teacher)

    def make_trainer(self, models: TrainingModels, index: CacheIndex, *, rank: int = 0, workers: int = 1,
                     model: torch.nn.Module | None = None) -> Trainer:
        return DistillTrainer(self, models, index, rank=rank, workers=workers, model=model)

    @property
    def distill(self) -> DistillSettings:
        if not isinstance(self.settings, DistillSettings):
            raise TypeError("a distillation's settings are DistillSettings")
        return self.settings


def read_teacher(teacher: LoraChoice | None, model_type: ModelType) -> LoraAdapter | None:
    """The teacher's adapter, checked before any model loads: a plain `ootd train` adapter of this model type."""
    if teacher is None:
        return None
    adapter = read_adapter(teacher.path)
    if adapter.few_step is not None:
        raise UsageError.about("teacher_lora", "{@teacher_lora} {file} is a few-step adapter: the teacher is the "
                               "model as sampled with its 20 guided steps (give an `ootd train run` adapter, or "
                               "none)", value=teacher.path, file=printable(teacher.path))
    if adapter.model_type is not model_type:
        raise UsageError.about("teacher_lora", "{@teacher_lora} {file} was trained on the {trained} model, this "
                               "cache is for the {cache} model", value=teacher.path, file=printable(teacher.path),
                               trained=adapter.model_type.value, cache=model_type.value)
    return adapter


def load_distill_models(models: Models, model_type: ModelType, settings: DistillSettings,
                        teacher: LoraChoice | None = None) -> TrainingModels:
    """A distillation's models, from the model owner: a fine-tune's (ootd/models/training.py), the teacher's
    adapter merged into the UNets before the student's LoRA is added, and the consistency objective in place of
    the fine-tune's: in a copy of the holder, so that what the owner holds and hands to its next user keeps the
    fine-tune's objective (the networks are shared, not copied)."""
    from ootd.training.distill import ConsistencyObjective

    read_teacher(teacher, model_type)  # checked before any model loads
    trained = models.trainable(model_type, settings, merged=teacher)
    c = trained.pipe.components
    objective = ConsistencyObjective(c.unet_garm, c.unet_vton, trained.pipe.fusion, c.scheduler_config,
                                     trained.params, guidance=settings.guidance, huber_c=settings.huber_c,
                                     garment_grad=settings.train_garment)
    objective.train()  # the networks are in training mode already (the fine-tune's objective set it)
    return replace(trained, objective=objective)


class DistillTrainer(Trainer):
    """The loop's state with a target network, few-step adapter files and the few-step validation sheets."""

    def __init__(self, options: DistillOptions, models: TrainingModels, index: CacheIndex, **kwargs: Any) -> None:
        super().__init__(options, models, index, **kwargs)
        self.distill = options.distill
        model_type = ModelType.parse(index.model_type)
        self.teacher = read_teacher(options.teacher, model_type)
        weights = weights_sha256(options.checkpoints, model_type)
        teacher = (self.teacher.sha256, options.teacher.scale) if self.teacher and options.teacher else None
        s = self.distill
        # what the checkpoints' adapter (the student alone) fits, and what RUN/lora.safetensors (with the teacher's
        # adapter folded in) fits: the base weights with or without the teacher's adapter
        self.student_sampling = FewStep(s.sampler, s.sample_steps, 0.0, s.guidance, base_sha256(weights, teacher))
        self.published_sampling = FewStep(s.sampler, s.sample_steps, 0.0, s.guidance, weights)
        self.teacher_pictures: dict[str, Any] = {}  # the teacher's validation try-ons: it never changes

    def after_update(self) -> None:
        self.models.objective.update_target(self.distill.ema_decay)

    def restore(self) -> None:
        from safetensors.torch import load_file

        folder = checkpoints(self.options.output)[-1].folder
        recorded = read_adapter(folder / "lora.safetensors").few_step
        if recorded is None or recorded.base_sha256 != self.student_sampling.base_sha256:
            raise UsageError.about("resume", "{@resume} continues a distillation of other base weights or another "
                                   "{@teacher_lora} ({folder}): start a new run (another {@output}) to change them",
                                   folder=printable(folder))
        super().restore()
        try:
            saved = load_file(str(folder / TARGET_FILE))
        except Exception as exc:  # noqa: BLE001 - a damaged or missing file: that checkpoint cannot be resumed
            raise UsageError(f"checkpoint {printable(folder)} has no readable target network ({TARGET_FILE}: "
                             f"{str(exc).splitlines()[0]}); remove it to resume from the one before") from None
        target = self.models.objective.target
        fits = len(saved) == len(target) and all(
            f"target.{i}" in saved and saved[f"target.{i}"].shape == t.shape for i, t in enumerate(target))
        if not fits:
            raise UsageError(f"checkpoint {printable(folder)}'s target network does not fit this run's adapter")
        with torch.no_grad():
            for i, tensor in enumerate(target):
                tensor.copy_(saved[f"target.{i}"])

    PLOT_LABELS = {"loss_label": "consistency loss (pseudo-Huber)",
                   "score_label": "validation: SSIM of the 4-step student to the teacher at 20 steps"}

    def checkpoint_extras(self, adapter: dict[str, dict[str, torch.Tensor]]) -> dict[str, Any]:
        """The student's adapter with its sampling, the target network, and RUN/lora.safetensors with a teacher's
        adapter folded in."""
        from safetensors.torch import save

        target = save({f"target.{i}": t.detach().cpu().contiguous()
                       for i, t in enumerate(self.models.objective.target)})
        return {"few_step": self.student_sampling, "files": {TARGET_FILE: target},
                "published": self.published(adapter)}

    def published(self, adapter: dict[str, dict[str, torch.Tensor]]) -> bytes | None:
        """With a teacher adapter: it and the student's `adapter` folded into one (what fits the released weights);
        the checkpoint's adapter alone is the student's."""
        from ootd.training.adapters import stack
        from ootd.weights.lora import adapter_bytes

        if self.teacher is None or self.options.teacher is None:
            return None
        student = {name: {key: tensor.detach().cpu() for key, tensor in state.items()}
                   for name, state in adapter.items() if state}  # as a checkpoint's file gives it back
        teacher = (self.teacher.tensors, self.teacher.rank, self.teacher.alpha, self.options.teacher.scale)
        tensors, rank = stack([teacher, (student, self.distill.rank, self.distill.alpha, 1.0)])
        return adapter_bytes(tensors, ModelType.parse(self.index.model_type), rank, rank, self.published_sampling)

    def run_validation(self) -> None:
        import json

        from ootd.app.train.distill_sheets import validate_few_step

        result = validate_few_step(self.models, self.options.cache, self.index, self.distill, self.step,
                                   self.options.output / "validation", self.teacher_pictures)
        if result is not None:
            self.validations.append(result)
            with open(self.options.output / "validation.jsonl", "a", encoding="utf-8") as handle:
                handle.write(json.dumps(result) + "\n")
