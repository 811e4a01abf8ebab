"""What a fine-tune does, declared once with its defaults and bounds (`ootd train run`'s options read them).

The paper (arXiv 2403.01779, §4.1 and §3.3) trains both UNets in full with AdamW at a fixed learning rate of 5e-5,
36,000 iterations, batch 64 at 512x384 and 16 at 1024x768, and an outfitting dropout of 10%. A LoRA fine-tune of
the released model on a shop's pairs is a much smaller change: the defaults below keep the paper's optimizer, its
fixed-rate schedule (after a short warm-up) and its dropout rate, and use the learning rate LoRA fine-tunes of
Stable Diffusion commonly use (1e-4) with a rank of 8; docs/training.md says which setting comes from where.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from enum import nonmember

from ootd.errors import UsageError
from ootd.settings import GUIDANCE_ON, Choice, SchedulerName


class LrSchedule(Choice):
    """Learning-rate schedules (diffusers.optimization.get_scheduler's), after the warm-up."""

    CONSTANT = "constant"  # the paper's fixed rate
    LINEAR = "linear"
    COSINE = "cosine"

    label = nonmember("learning-rate schedule")


class MixedPrecision(Choice):
    """Autocast dtype of the forward passes; the adapter's weights and the optimizer stay in fp32."""

    NO = "no"
    BF16 = "bf16"
    FP16 = "fp16"  # with a gradient scaler (CUDA/ROCm)

    label = nonmember("mixed precision")


PAPER_DROPOUT = 0.1  # the paper's outfitting dropout rate


@dataclass(frozen=True)
class TrainSettings:
    """One fine-tune's settings (stored with its checkpoints, so a resume can refuse a changed one)."""

    steps: int = 1000  # optimizer steps; with `epochs` set, epochs x steps per epoch instead
    epochs: int | None = None
    batch_size: int = 1  # pairs per forward pass and device; the global batch is batch x accumulation x workers
    accumulation: int = 1  # forward passes per optimizer step
    learning_rate: float = 1e-4
    schedule: LrSchedule = LrSchedule.CONSTANT
    warmup: int = 50  # optimizer steps of linear warm-up
    rank: int = 8  # LoRA rank
    alpha: float = 8.0  # LoRA alpha (the change is scaled by alpha / rank)
    train_garment: bool = False  # also adapt the garment UNet's attention projections
    dropout: float = PAPER_DROPOUT  # outfitting dropout: the fraction of samples trained without the garment
    seed: int = 0
    mixed_precision: MixedPrecision = MixedPrecision.NO
    gradient_checkpointing: bool = False
    checkpoint_every: int = 500  # optimizer steps between checkpoints (one is always written at the end)
    validate_every: int = 500  # optimizer steps between validation sheets; 0: only at the end
    validation_steps: int = 20  # denoising steps of a validation try-on
    validation_pairs: int = 4  # held-out pairs on a sheet

    def validate(self) -> None:
        """Every bound, as one-line usage errors naming the setting (`{@steps}`: each front end words it)."""
        checks = [
            ("steps", 1 <= self.steps <= 10_000_000, "must be 1 to 10000000"),
            ("epochs", self.epochs is None or 1 <= self.epochs <= 100_000, "must be 1 to 100000"),
            ("batch_size", 1 <= self.batch_size <= 256, "must be 1 to 256"),
            ("accumulation", 1 <= self.accumulation <= 1024, "must be 1 to 1024"),
            ("learning_rate", math.isfinite(self.learning_rate) and 0 < self.learning_rate <= 1,
             "must be above 0 and at most 1"),
            ("warmup", 0 <= self.warmup <= 1_000_000, "must be 0 to 1000000 steps"),
            ("rank", 1 <= self.rank <= 1024, "must be 1 to 1024"),
            ("alpha", math.isfinite(self.alpha) and 0 < self.alpha <= 4096, "must be above 0"),
            ("dropout", 0.0 <= self.dropout < 1.0, "must be from 0 up to (not including) 1"),
            ("seed", 0 <= self.seed < 2**63, "must be a non-negative 64-bit integer"),
            ("checkpoint_every", self.checkpoint_every >= 1, "must be at least 1"),
            ("validate_every", self.validate_every >= 0, "must be 0 or more"),
            ("validation_steps", 1 <= self.validation_steps <= 1000, "must be 1 to 1000"),
            ("validation_pairs", 0 <= self.validation_pairs <= 64, "must be 0 to 64"),
        ]
        self._refuse(checks)

    def _refuse(self, checks: list[tuple[str, bool, str]]) -> None:
        """The first check that fails, as a usage error naming its setting (`{@steps} must be ..., got 0`)."""
        for name, ok, bound in checks:
            if not ok:
                value = getattr(self, name)
                raise UsageError.about(name, f"{{@{name}}} {bound}, got {{value}}",
                                       value=getattr(value, "value", value))

    @classmethod
    def from_words(cls, *, schedule: str | LrSchedule = LrSchedule.CONSTANT,
                   mixed_precision: str | MixedPrecision = MixedPrecision.NO, **values: object) -> TrainSettings:
        """Checked settings from what a user gave (anything omitted keeps its default)."""
        settings = cls(schedule=LrSchedule.parse(schedule), mixed_precision=MixedPrecision.parse(mixed_precision),
                       **values)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def total_steps(self, pairs: int, workers: int = 1) -> int:
        """Optimizer steps of the run: `steps`, or `epochs` passes over `pairs` at the global batch."""
        if self.epochs is None:
            return self.steps
        global_batch = self.batch_size * self.accumulation * workers
        return self.epochs * max(1, math.ceil(pairs / global_batch))

    @property
    def target_network(self) -> bool:
        """Whether the run keeps a target network (an EMA copy of the adapter): a distillation's."""
        return False

    def to_json(self) -> dict[str, object]:
        return {k: (v.value if isinstance(v, Choice) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> TrainSettings:
        known = {f.name for f in fields(cls)}
        return cls.from_words(**{k: v for k, v in data.items() if k in known})  # type: ignore[arg-type]

    # what a resumed run must share with the one it continues (the rest may change: e.g. more steps)
    RESUME_FIXED = ("batch_size", "accumulation", "rank", "alpha", "train_garment", "dropout", "seed")


# -- `ootd train distill`: latent consistency distillation into a few-step adapter (ootd/training/distill.py) ----
# The defaults are those of diffusers' LCM-LoRA training script (rank 64, learning rate 1e-4, Huber c 0.001, a grid
# of 50 timesteps: a skipping interval of 20) and of the LCM paper's target network (EMA decay 0.95); the teacher's
# guidance is the released try-on's own scale. docs/training.md says why.
DISTILL_SAMPLERS = (SchedulerName.LCM, SchedulerName.TCD)
_SAMPLER_WORDS = ", ".join(sampler.value for sampler in DISTILL_SAMPLERS)


@dataclass(frozen=True)
class DistillSettings(TrainSettings):
    """One distillation's settings: a fine-tune's, without outfitting dropout (the student always sees its garment:
    it learns the guided solution), with the teacher's guidance, the target network's EMA decay, the Huber loss's
    c and what the adapter records of its sampling."""

    rank: int = 64
    alpha: float = 64.0
    dropout: float = 0.0
    guidance: float = 2.0  # the teacher's image guidance (the released scale)
    ema_decay: float = 0.95  # the target network: an EMA of the student (0: the student itself, as LCM-LoRA)
    huber_c: float = 0.001
    sample_steps: int = 4  # the step count the adapter records
    sampler: SchedulerName = SchedulerName.LCM  # the scheduler it records (and the validation sheets use)

    def validate(self) -> None:
        super().validate()
        from ootd.weights.fewstep import MAX_FEW_STEPS

        self._refuse([
            ("dropout", self.dropout == 0.0, "must be 0: distillation trains without outfitting dropout"),
            ("guidance", math.isfinite(self.guidance) and GUIDANCE_ON <= self.guidance <= 50,
             f"must be from {GUIDANCE_ON:g} (image guidance on) to 50"),
            ("ema_decay", 0.0 <= self.ema_decay < 1.0, "must be from 0 up to (not including) 1"),
            ("huber_c", math.isfinite(self.huber_c) and 0 < self.huber_c <= 1, "must be above 0 and at most 1"),
            ("sample_steps", 1 <= self.sample_steps <= MAX_FEW_STEPS, f"must be 1 to {MAX_FEW_STEPS}"),
            ("sampler", self.sampler in DISTILL_SAMPLERS, f"must be one of {_SAMPLER_WORDS}"),
        ])

    @classmethod
    def from_words(cls, *, sampler: str | SchedulerName = SchedulerName.LCM,  # type: ignore[override]
                   **values: object) -> DistillSettings:
        word = str(getattr(sampler, "value", sampler)).strip().lower()
        if word not in {one.value for one in DISTILL_SAMPLERS}:
            raise UsageError.about("sampler", "{@sampler} must be one of {words}, got {value}", value=sampler,
                                   words=_SAMPLER_WORDS)
        return super().from_words(sampler=SchedulerName(word), **values)  # type: ignore[return-value]

    @property
    def target_network(self) -> bool:
        return True

    RESUME_FIXED = (*TrainSettings.RESUME_FIXED, "guidance", "ema_decay", "huber_c")
