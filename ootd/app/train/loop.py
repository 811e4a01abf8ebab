"""`ootd train run`: the fine-tune's loop, the same on one process and on each Ray Train worker.

Per optimizer step: `accumulation` forward/backward passes over micro-batches of `batch_size` cached pairs (the
pairs and every random draw fixed by the seed and the step: ootd/training/data.py), then AdamW and the
learning-rate schedule. Rank 0 logs the loss, writes checkpoints every `checkpoint_every` steps and at the end, and
validation sheets every `validate_every` steps and at the end. Ctrl-C or SIGTERM between two steps writes a
checkpoint of the last finished step before the run exits (130 or 143): nothing is half-written, and `--resume`
continues from it as if the run had never stopped. The optimizer's update, the schedule's step and the step count
are one unit for a signal (it waits for them), so a checkpoint's step always names the weights it holds.

Why not Hugging Face accelerate for the mixed-precision scaling, `no_sync` and the optimizer's state (it is a
dependency): its `save_state` writes the optimizer with torch.save (a pickle) in place, where a checkpoint here is
safetensors written in a hidden folder and renamed (whole or absent, ootd/app/train/checkpoints.py) and readable
without unpickling; its `accumulate` decides when gradients synchronise from a counter of its own that a resume
must restore, where here the last micro-batch of each optimizer step synchronises (`_sync`), a function of the
step alone; its prepared scheduler steps once per process unless told otherwise, and on Ray Train it would have
to own the DDP wrapping that `ray.train.torch.prepare_model` does. What the loop writes by hand is torch's own
GradScaler, DDP's own `no_sync` and the optimizer's own `state_dict`, a few lines each, and the tests hold the
bit-exact resume and the accumulation arithmetic (tests/app/train/test_loop.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ootd.app.train.checkpoints import (
    Restored,
    adapter_of,
    check_resumable,
    checkpoints,
    load_checkpoint,
    save_checkpoint,
    signals_deferred,
)
from ootd.app.train.logs import LossLog, plot_losses
from ootd.app.train.validation import validate
from ootd.errors import NumericalError, OutputError, UsageError, printable
from ootd.imaging.atomic import append_line, write_text_atomic
from ootd.models.training import TrainingModels
from ootd.pipeline_types import Progress
from ootd.settings import AttentionName, ModelType
from ootd.training.cache import CacheIndex, read_index
from ootd.training.data import Layout, load_batch, step_batches
from ootd.training.settings import LrSchedule, MixedPrecision, TrainSettings

if TYPE_CHECKING:
    from ootd.models import Models

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainOptions:
    """What `ootd train run` was asked for, checked."""

    cache: Path
    output: Path
    checkpoints: Path
    settings: TrainSettings = field(default_factory=TrainSettings)
    device: str | None = None  # a checked device word (ootd/hardware/spec.py)
    attention: AttentionName = AttentionName.AUTO
    resume: bool = False

    def load_models(self, index: CacheIndex, models: Models | None = None) -> TrainingModels:
        """The models this run trains, for the cache's model type, from `models` (None: the options' own owner)."""
        return (models or training_models(self)).trainable(ModelType.parse(index.model_type), self.settings)

    def make_trainer(self, models: TrainingModels, index: CacheIndex, *, rank: int = 0, workers: int = 1,
                     model: torch.nn.Module | None = None) -> Trainer:
        """The loop's state for one worker (`model`: the objective's DDP wrapper on a Ray worker)."""
        return Trainer(self, models, index, rank=rank, workers=workers, model=model)


@dataclass
class TrainReport:
    steps: int  # the step the run ended at
    first_step: int  # the step it started from (0, or the resumed checkpoint's)
    losses: list[float]
    adapter: Path
    validation: list[dict]
    seconds: float


def check_mixed_precision(mixed: MixedPrecision, device: str | None) -> None:
    """bf16/fp16 only where the device profile allows them (the same check as --precision: exit 3 elsewhere)."""
    if mixed is MixedPrecision.NO:
        return
    from ootd.runtime import RuntimeRequest, choose_hardware
    from ootd.settings import PrecisionName

    choose_hardware(RuntimeRequest(device=device, precision=PrecisionName(mixed.value)))


def training_models(options: TrainOptions) -> Models:
    """The model owner of a fine-tune: its runtime on the chosen device and attention, in the dtype the UNets
    train in (fp32, or the mixed precision's)."""
    from ootd.models import Models
    from ootd.runtime import RuntimeRequest
    from ootd.settings import PrecisionName

    mixed = options.settings.mixed_precision
    precision = PrecisionName.FP32 if mixed is MixedPrecision.NO else PrecisionName(mixed.value)
    return Models(options.checkpoints, RuntimeRequest(device=options.device, precision=precision,
                                                      attention=options.attention))


def load_trainable(options: TrainOptions, index: CacheIndex, models: Models | None = None) -> TrainingModels:
    """The models of the run `options` asks for (a fine-tune's or a distillation's), for the cache's model type,
    from `models` (None: the options' own owner)."""
    return options.load_models(index, models)


def open_run(options: TrainOptions, index: CacheIndex) -> None:
    """The run folder: a new one (refusing to mix two runs in one) or, with --resume, the run it continues."""
    run = options.output
    if run.exists() and not run.is_dir():
        raise OutputError(f"run folder {printable(run)} is a file")
    record = run / "run.json"
    if record.is_file() and not options.resume:
        raise OutputError.about("resume", "{run} already holds a training run: pass {@resume} to continue "
                                "it, or another {@output}", run=printable(run))
    if options.resume and not checkpoints(run) and not record.is_file():
        raise UsageError.about("resume", "{@resume}: {run} has no checkpoint to continue from", run=printable(run))
    run.mkdir(parents=True, exist_ok=True)
    if not record.is_file():
        write_text_atomic(record, json.dumps({
            "cache": str(options.cache.resolve()), "checkpoints": str(options.checkpoints),
            "model_type": index.model_type, "resolution": index.resolution, "settings": options.settings.to_json(),
            "train_pairs": len(index.split("train")), "val_pairs": len(index.split("val"))}, indent=1) + "\n")


def lr_schedule(optimizer: torch.optim.Optimizer, settings: TrainSettings, total: int, done: int = 0) -> Any:
    """The learning-rate schedule (diffusers' get_scheduler): a linear warm-up of `settings.warmup` steps, then
    `settings.schedule` (diffusers' own "constant" has no warm-up: ours is its "constant_with_warmup"). `done`: the
    optimizer steps already taken (a resumed run; the optimizer's state restored, with its `initial_lr`)."""
    from diffusers.optimization import get_scheduler

    name = "constant_with_warmup" if settings.schedule is LrSchedule.CONSTANT else settings.schedule.value
    return get_scheduler(name, optimizer, num_warmup_steps=settings.warmup, num_training_steps=total,
                         last_epoch=done - 1)


class Trainer:
    """One worker's share of the fine-tune. `model` is the objective, or its DDP wrapper on a Ray worker."""

    def __init__(self, options: TrainOptions, models: TrainingModels, index: CacheIndex, *, rank: int = 0,
                 workers: int = 1, model: torch.nn.Module | None = None) -> None:
        s = options.settings
        self.options, self.models, self.index, self.rank, self.workers = options, models, index, rank, workers
        self.model = model if model is not None else models.objective
        self.train_keys = [e.key for e in index.split("train")]
        if not self.train_keys:
            raise UsageError(f"cache {printable(options.cache)} has no training pairs (all held out?)")
        self.layout = Layout(s.batch_size, s.accumulation, workers)
        self.total = s.total_steps(len(self.train_keys), workers)
        self.optimizer = torch.optim.AdamW(models.params, lr=s.learning_rate)
        self.lr = lr_schedule(self.optimizer, s, self.total)
        use_scaler = s.mixed_precision is MixedPrecision.FP16 and models.device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda") if use_scaler else None
        self.step = 0
        self.last_loss = math.nan  # the loss of the latest step taken
        self.last_lr = math.nan  # the learning rate it took
        self.log = LossLog(options.output / "loss.jsonl")
        self.validations: list[dict] = []

    def restore(self) -> None:
        """Continue from the run's latest checkpoint (--resume); a run stopped before its first one (a full disk,
        a kill) starts again from step 0, with its own settings."""
        from ootd.training.adapters import load_lora_state

        found = checkpoints(self.options.output)
        if not found:
            saved = json.loads((self.options.output / "run.json").read_text(encoding="utf-8"))
            check_resumable(Restored(0, {}, {}, {"settings": saved.get("settings", {})}), self.options.settings)
            if self.rank == 0:
                self.log.keep_until(0)
            return
        latest = found[-1]
        restored = load_checkpoint(latest)
        check_resumable(restored, self.options.settings)
        for name, unet in self.models.unets.items():
            load_lora_state(unet, restored.adapter.get(name, {}))
        self.optimizer.load_state_dict(restored.optimizer_state)
        # the schedule where it stood after that step (its rate: the one the next step takes), without stepping it
        # through the steps taken (which, before any optimizer step, torch rightly warns about)
        self.lr = lr_schedule(self.optimizer, self.options.settings, self.total, done=restored.step)
        self.step = restored.step
        self.validations = list(restored.state.get("validation", []))
        if self.rank == 0:
            self.log.keep_until(self.step)
            adapter_of(self.options.output, latest, self.published(restored.adapter))

    def _sync(self, last: bool) -> contextlib.AbstractContextManager:
        no_sync = getattr(self.model, "no_sync", None)
        return contextlib.nullcontext() if last or no_sync is None else no_sync()

    def train_step(self) -> float:
        """One optimizer step; returns its loss (the mean over micro-batches and workers)."""
        s, objective = self.options.settings, self.models.objective
        self.optimizer.zero_grad(set_to_none=True)
        batches = step_batches(self.step, len(self.train_keys), self.layout, self.rank, s.seed)
        total = torch.zeros((), device=self.models.device)
        for i, batch in enumerate(batches):
            tensors = load_batch(self.options.cache, [self.train_keys[n] for n, _ in batch], self.models.device)
            draws = objective.draw([j for _, j in batch], tensors["target"].shape[1:], s.seed, self.step, s.dropout)
            with self._sync(i == len(batches) - 1):
                with self._autocast():
                    loss = self.model(tensors["target"], tensors["masked"], tensors["garment"], tensors["prompt"],
                                      draws.noise, draws.timesteps, draws.drop) / len(batches)
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            objective.release()
            total += loss.detach()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(total)
            total /= self.workers
        value = float(total)
        if not math.isfinite(value):  # before the step: the weights and the last checkpoint stay good
            raise NumericalError.about("learning_rate", "the training loss is not finite at step {step}; "
                                       "lower {@learning_rate} or use {@mixed_precision} no", step=self.step + 1)
        self.last_loss = value
        self.last_lr = self.lr.get_last_lr()[0]  # the rate this step takes (the log's)
        with signals_deferred():  # the weights and the step's label change together: a checkpoint never mixes them
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.after_update()
            self.lr.step()
            self.step += 1
        return value

    def after_update(self) -> None:
        """What follows each optimizer update in the same unit against signals (a distillation's target network)."""

    def _autocast(self) -> contextlib.AbstractContextManager:
        dtype = self.models.autocast
        return torch.autocast(self.models.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()

    def log_step(self, loss: float, seconds: float) -> None:
        """The loss log's line of the step just taken (rank 0)."""
        self.log.append({"step": self.step, "loss": loss, "lr": self.last_lr, "seconds": round(seconds, 4)})

    def checkpoint(self) -> None:
        from ootd.training.adapters import lora_state

        adapter = {name: lora_state(unet) for name, unet in self.models.unets.items()}
        save_checkpoint(self.options.output, self.step, adapter, ModelType.parse(self.index.model_type),
                        self.options.settings, self.optimizer.state_dict(), {"validation": self.validations},
                        **self.checkpoint_extras(adapter))
        plot_losses(self.log.read(), self.options.output / "loss.png", self.validations, **self.PLOT_LABELS)

    PLOT_LABELS: dict[str, str] = {}  # the loss plot's axis labels, where they are not a fine-tune's

    def checkpoint_extras(self, adapter: dict[str, dict[str, torch.Tensor]]) -> dict[str, Any]:
        """What a checkpoint holds beyond a fine-tune's (save_checkpoint's keywords): a distillation's."""
        return {}

    def published(self, adapter: dict[str, dict[str, torch.Tensor]]) -> bytes | None:
        """RUN/lora.safetensors' bytes for a checkpoint's `adapter` where they are not the checkpoint's own
        adapter file (a distillation's teacher adapter folded in); None: they are. A checkpoint writes them, and a
        resume writes them again from the checkpoint it continues."""
        return None

    def run_validation(self) -> None:
        result = validate(self.models, self.options.cache, self.index, self.options.settings, self.step,
                          self.options.output / "validation")
        if result is not None:
            self.validations.append(result.record())
            append_line(self.options.output / "validation.jsonl", json.dumps(result.record()) + "\n")


def _due(step: int, every: int, total: int) -> bool:
    return step == total or (every > 0 and step % every == 0)


def run_loop(trainer: Trainer, progress: Progress | None = None, stop: Callable[[], None] | None = None) -> TrainReport:
    """Steps until the end; checkpoints, validation and the log on rank 0; a checkpoint on Ctrl-C/SIGTERM, or when
    `stop` (called before each step: a Ray driver's stop, ootd/app/train/stopping.py) raises a KeyboardInterrupt."""
    s, lead = trainer.options.settings, trainer.rank == 0
    tick = progress or (lambda stage, done, total: None)
    first, losses, started, saved = trainer.step, [], time.perf_counter(), trainer.step
    logged, t = trainer.step, started
    tick("train", trainer.step, trainer.total)
    try:
        while trainer.step < trainer.total:
            if stop is not None:
                stop()
            t = time.perf_counter()
            loss = trainer.train_step()
            losses.append(loss)
            if lead:
                trainer.log_step(loss, time.perf_counter() - t)
                logged = trainer.step
                if _due(trainer.step, s.validate_every, trainer.total) and s.validation_pairs:
                    trainer.run_validation()
                if _due(trainer.step, s.checkpoint_every, trainer.total):
                    trainer.checkpoint()
                    saved = trainer.step
            tick("train", trainer.step, trainer.total)
    except KeyboardInterrupt:
        if lead and trainer.step > logged:  # the signal came as the step ended (deferred to it): log it too
            trainer.log_step(trainer.last_loss, time.perf_counter() - t)
        if lead and trainer.step > saved:
            logger.warning("interrupted: saving a checkpoint of step %d before exiting", trainer.step)
            trainer.checkpoint()
        raise
    adapter = trainer.options.output / "lora.safetensors"
    return TrainReport(trainer.step, first, losses, adapter, trainer.validations, time.perf_counter() - started)


def train_local(options: TrainOptions, progress: Progress | None = None, models: TrainingModels | None = None,
                index: CacheIndex | None = None) -> TrainReport:
    """The whole fine-tune in this process (`models`: already loaded ones, e.g. by --explain or a test)."""
    index = index or read_index(options.cache)
    open_run(options, index)
    models = models or options.load_models(index)
    with models.in_run(printable(options.output)):  # from here to its end the run alone trains them
        trainer = options.make_trainer(models, index)
        if options.resume:
            trainer.restore()
        return run_loop(trainer, progress)
