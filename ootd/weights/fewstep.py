"""A few-step adapter's own sampling (`ootd train distill`, docs/training.md "Few-step adapters").

A distilled adapter only works as it was distilled: with a consistency sampler, a handful of steps and image
guidance off (the student learned the guided solution, so its conditional pass alone gives it). Its file therefore
says so: the adapter header (ootd/weights/lora.py) carries under `few_step` the scheduler it was distilled for
(diffusers' LCMScheduler or TCDScheduler), the step count and the guidance scale it expects, the teacher's guidance,
and the sha256 of the base weights it was distilled from. A try-on that loads it samples with those settings unless
it sets them itself (`fill_sampling`), and refuses it on other base weights (`check_base`): the adapter's change is
a correction of one particular model, meaningless on another.

The base weights' hash is the sha256 over the weight files of the two UNets of the model type (the try-on UNet
runs every step; the garment UNet's features feed it), and, when the teacher had an `ootd train` adapter merged in,
that adapter's sha256 and scale.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ootd.errors import CheckpointError, Namer, fill, library_name, printable
from ootd.settings import CONSISTENCY_GRID, GUIDANCE_ON, ModelType, SamplingSettings, SchedulerName

FEW_STEP_KEY = "few_step"  # the adapter header's key (its value: this dataclass as JSON)
OBJECTIVE = "lcm"  # the distillation objective: latent consistency distillation (training/distill.py)
GUIDANCE_OFF = 0.0  # the scale a few-step adapter samples at: one pass per step, no unconditional half
MAX_FEW_STEPS = 8  # the step counts a few-step adapter is made for (`ootd train distill --sample-steps`)
# build_config's words a few-step adapter fills when they are not given, and SamplingSettings' names for them
SAMPLING_WORDS = {"steps": "steps", "scale": "guidance_scale", "scheduler": "scheduler"}


@dataclass(frozen=True)
class FewStep:
    """What a few-step adapter file records of its sampling and its origin."""

    scheduler: SchedulerName
    steps: int
    guidance: float  # the sampling scale it expects (GUIDANCE_OFF: guidance is in the weights)
    teacher_guidance: float  # the image guidance the teacher sampled with
    base_sha256: str  # the base weights it was distilled from (`base_sha256` below)
    objective: str = OBJECTIVE

    def header(self) -> dict[str, str]:
        """The adapter header's entry."""
        data = {"scheduler": self.scheduler.value, "steps": self.steps, "guidance": self.guidance,
                "teacher_guidance": self.teacher_guidance, "base_sha256": self.base_sha256,
                "objective": self.objective}
        return {FEW_STEP_KEY: json.dumps(data, sort_keys=True)}

    @classmethod
    def from_header(cls, header: Mapping[str, str]) -> FewStep | None:
        """The entry of an adapter header, None for a plain adapter; ValueError for a malformed one."""
        text = header.get(FEW_STEP_KEY)
        if text is None:
            return None
        try:
            data = json.loads(text)
            few = cls(SchedulerName(data["scheduler"]), int(data["steps"]), float(data["guidance"]),
                      float(data["teacher_guidance"]), str(data["base_sha256"]), str(data.get("objective", OBJECTIVE)))
        except (TypeError, KeyError, ValueError, json.JSONDecodeError) as exc:
            raise ValueError(f"its few-step entry is malformed ({exc})") from None
        if not (few.scheduler.few_step and 1 <= few.steps <= CONSISTENCY_GRID and math.isfinite(few.guidance)
                and 0 <= few.guidance <= 50 and len(few.base_sha256) == 64):
            raise ValueError(f"its few-step entry is out of bounds ({text[:200]})")
        return few

    def words(self) -> str:
        """`4 steps, lcm scheduler, guidance off`: what the one-line notices say."""
        guidance = "guidance off" if self.guidance < GUIDANCE_ON else f"guidance scale {self.guidance:g}"
        return f"{self.steps} steps, {self.scheduler.value} scheduler, {guidance}"

    def sampling(self) -> dict[str, object]:
        """The adapter's settings as build_config's words."""
        return {"steps": self.steps, "scale": self.guidance, "scheduler": self.scheduler.value}


def fill_sampling(few_step: FewStep | None, given: Mapping[str, object | None]) -> tuple[dict[str, object],
                                                                                       tuple[str, ...]]:
    """`given` (build_config's steps, scale, scheduler; None: not set) completed: a few-step adapter's own settings
    for the unset ones, else SamplingSettings' defaults; and the names taken from the adapter (a plain adapter, or
    none, takes nothing)."""
    defaults = SamplingSettings()
    own = few_step.sampling() if few_step is not None else {}
    taken = tuple(name for name in SAMPLING_WORDS if given.get(name) is None and name in own)
    filled = {name: given[name] if given.get(name) is not None else own.get(name, getattr(defaults, field))
              for name, field in SAMPLING_WORDS.items()}
    return filled, taken


def call_sampling(few_step: FewStep | None, *, steps: int | None, guidance_scale: float | None,
                  scheduler: str | SchedulerName | None, **words: object) -> SamplingSettings:
    """A pipeline call's checked settings (the Python API): `fill_sampling`'s values, `words` as given."""
    filled, _ = fill_sampling(few_step, {"steps": steps, "scale": guidance_scale, "scheduler": scheduler})
    return SamplingSettings.from_words(steps=filled["steps"], guidance_scale=filled["scale"],  # type: ignore[arg-type]
                                       scheduler=filled["scheduler"], **words)  # type: ignore[arg-type]


def notice(name: str, few_step: FewStep, taken: tuple[str, ...], words: Namer = library_name) -> str:
    """The one line a front end says when a few-step adapter's sampling applies; the settings given instead (those
    not `taken` from it) worded by `words` (a front end's names for them)."""
    kept = [fill("{@" + setting + "}", words) for setting in SAMPLING_WORDS if setting not in taken]
    overridden = f"; {', '.join(kept)} as given" if kept else ""
    return f"few-step adapter {printable(name)}: sampling with its own {few_step.words()}{overridden}"


_HASHES: dict[tuple[str, int, int], str] = {}  # per process: a batch or a server loads the same files again


def _weights_file_sha256(path: Path) -> str:
    from ootd.weights.layout import file_sha256

    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHES:
        _HASHES[key] = file_sha256(path)
    return _HASHES[key]


def weights_sha256(checkpoints: Path, model_type: ModelType) -> str:
    """The sha256 of the model type's two UNets' weight files (a checkpoint error when one is missing)."""
    from ootd.weights.layout import Layout, find_weights

    layout = Layout(Path(checkpoints))
    parts = [f"{name}:{_weights_file_sha256(find_weights(folder, 'diffusers', layout))}"
             for name, folder in (("unet_vton", layout.unet_vton(model_type)),
                                  ("unet_garm", layout.unet_garm(model_type)))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def base_sha256(weights: str, teacher: tuple[str, float] | None = None) -> str:
    """The base a few-step adapter is distilled on: the weights' hash, or with a teacher adapter (its sha256 and
    scale, merged into them) a hash of the three."""
    if teacher is None:
        return weights
    return hashlib.sha256(f"{weights}\nteacher:{teacher[0]}@{teacher[1]!r}".encode()).hexdigest()


def check_base(path: Path, few_step: FewStep, checkpoints: Path, model_type: ModelType) -> None:
    """Refuse, in one line, a few-step adapter distilled from other base weights than these checkpoints'."""
    here = weights_sha256(checkpoints, model_type)
    if few_step.base_sha256 != here:
        raise CheckpointError(
            f"LoRA adapter {printable(path)} was distilled from other base weights (base sha256 "
            f"{few_step.base_sha256[:12]}, these {model_type.value} UNets are {here[:12]}): use it with the "
            "checkpoints it was distilled from (and the `ootd train` adapter it was distilled with, which its "
            "RUN/lora.safetensors already holds), or distil one from these")
