"""A distillation's validation sheets: per held-out pair, the real photo | the garment | the teacher at 20 steps |
the student at 1, 2, 4 and 8 steps, each made by the inference pipeline itself (its `generate`; the student with
the LoRA live, guidance off and the adapter's sampler; the teacher with the LoRA switched off, UniPC and its
guidance), with the SSIM of each student picture to the teacher's: how close the few steps come to the 20.

The teacher never changes during a run, so its pictures are made once per process and kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from ootd.app.train.validation import held_out_inputs, write_sheet
from ootd.imaging.contact_sheet import contact_sheet
from ootd.imaging.similarity import ssim
from ootd.pipeline_types import GarmentInputs, PersonInputs
from ootd.settings import SamplingSettings, SchedulerName, parse_resolution
from ootd.training.cache import CacheIndex
from ootd.training.settings import DistillSettings

if TYPE_CHECKING:
    from ootd.models.training import TrainingModels
    from ootd.pipeline import TryOnPipeline

STUDENT_STEPS = (1, 2, 4, 8)
TEACHER_STEPS = 20
SCORED_STEPS = 4  # the SSIM the loss plot shows


def _picture(pipe: TryOnPipeline, person: PersonInputs, garment: GarmentInputs, sampling: SamplingSettings,
             like: Image.Image) -> Image.Image:
    return pipe.generate(person, garment, sampling).images[0].convert("RGB").resize(like.size)


def validate_few_step(models: TrainingModels, cache: Path, index: CacheIndex, settings: DistillSettings, step: int,
                      folder: Path, teacher_pictures: dict[str, Image.Image]) -> dict[str, Any] | None:
    """Try on the first `validation_pairs` held-out pairs; write the sheet; its record (None without any pair):
    the SSIM to the teacher per pair at 4 steps (`ssim`, `ssim_mean`) and its mean at every step count."""
    from ootd.training.distill import adapters_off

    entries = index.split("val")[: settings.validation_pairs]
    if not entries:
        return None
    resolution = parse_resolution(index.resolution)
    teacher = SamplingSettings(num_samples=1, steps=TEACHER_STEPS, guidance_scale=settings.guidance,
                               seed=settings.seed, resolution=resolution, scheduler=SchedulerName.UNIPC)
    rows, scores = [], {n: [] for n in STUDENT_STEPS}
    with models.validating() as pipe:  # the models back where training needs them after
        for entry in entries:
            if entry.key not in teacher_pictures:
                with adapters_off(*models.unets.values()):  # the garment's features too, if its UNet is adapted
                    person, garment, real = held_out_inputs(pipe, cache, entry, index)
                    teacher_pictures[entry.key] = _picture(pipe, person, garment, teacher, real)
            person, garment, real = held_out_inputs(pipe, cache, entry, index)
            reference = teacher_pictures[entry.key]
            tiles = [real, garment.garment, reference]
            for steps in STUDENT_STEPS:
                student = SamplingSettings(num_samples=1, steps=steps, guidance_scale=0.0, seed=settings.seed,
                                           resolution=resolution, scheduler=settings.sampler)
                tried = _picture(pipe, person, garment, student, real)
                scores[steps].append(ssim(np.asarray(reference), np.asarray(tried)))
                tiles.append(tried)
            rows.append(contact_sheet(tiles))
    by_steps = {str(n): round(float(np.mean(values)), 5) for n, values in scores.items()}
    sheet = write_sheet(rows, folder, step, {
        "columns": f"photo | garment | teacher {TEACHER_STEPS} steps | student "
                   + " | ".join(f"{n} step{'s' if n > 1 else ''}" for n in STUDENT_STEPS),
        "ssim_to_teacher": json.dumps(by_steps)})
    kept = scores[SCORED_STEPS]
    return {"step": step, "sheet": sheet.name, "ssim": [round(s, 5) for s in kept],
            "ssim_mean": round(float(np.mean(kept)), 5), "ssim_to_teacher": by_steps}
