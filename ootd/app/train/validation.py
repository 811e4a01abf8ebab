"""Validation sheets: the held-out pairs tried on with the adapter as it is at a step, by the inference pipeline
itself (its `generate`, the adapter's layers live), beside the real photo, with the SSIM of each try-on against it.

Each row of a sheet: the real photo (the person wearing the garment) | the garment | the try-on. The SSIM is
ootd/imaging/similarity.py's (the one `ootd compare` reports), over the whole picture: the region outside the mask
is the photo's own in every try-on, so it is the repainted region that moves the number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image

from ootd.imaging.atomic import save_png_atomic
from ootd.imaging.contact_sheet import GAP, contact_sheet
from ootd.imaging.files import load_image
from ootd.imaging.framing import FitInfo
from ootd.imaging.masks import masked_person_image
from ootd.imaging.similarity import ssim
from ootd.pipeline_types import GarmentInputs, PersonInputs, Timings
from ootd.settings import Category, SamplingSettings, parse_resolution
from ootd.training.cache import CacheEntry, CacheIndex, image_paths, read_entry
from ootd.training.settings import TrainSettings

if TYPE_CHECKING:
    from ootd.models.training import TrainingModels
    from ootd.pipeline import TryOnPipeline

VALIDATION_SCALE = 2.0  # image guidance of the validation try-ons: the inference default


@dataclass(frozen=True)
class ValidationResult:
    step: int
    sheet: Path
    ssim: list[float]

    def record(self) -> dict[str, Any]:
        return {"step": self.step, "sheet": self.sheet.name, "ssim": [round(s, 5) for s in self.ssim],
                "ssim_mean": round(float(np.mean(self.ssim)), 5) if self.ssim else None}


def held_out_inputs(pipe: TryOnPipeline, cache: Path, entry: CacheEntry,
                    index: CacheIndex) -> tuple[PersonInputs, GarmentInputs, Image.Image]:
    """A held-out pair as the pipeline takes it (from its cache entry), and its real photo."""
    tensors = read_entry(cache, entry.key)
    person_png, garment_png = image_paths(cache, entry.key)
    person, garment = load_image(person_png, "person"), load_image(garment_png, "garment")
    resolution, category = parse_resolution(index.resolution), Category.parse(entry.category)
    device, dtype = pipe.device.torch_device, pipe.precision.unet
    mask = Image.fromarray(tensors["mask"].numpy(), mode="L")
    fit = FitInfo("stretch", person.size, person.size, (0, 0, *person.size))
    person_in = PersonInputs(category, resolution, person, mask, masked_person_image(person, mask), fit, {},
                             tensors["masked"][None].to(device, dtype), tensors["target"][None].to(device, dtype),
                             Timings())
    prompt = tensors["prompt"][None].to(device, dtype)
    with torch.inference_mode():
        features = pipe.garment_features(tensors["garment"][None].to(device, dtype), prompt)
    return person_in, GarmentInputs(category, resolution, garment, prompt, features, Timings()), person


def validate(models: TrainingModels, cache: Path, index: CacheIndex, settings: TrainSettings, step: int,
             folder: Path) -> ValidationResult | None:
    """Try on the first `validation_pairs` held-out pairs at this step with the fine-tune's own pipeline (its
    models are back where training needs them afterwards); write the sheet; None without any."""
    entries = index.split("val")[: settings.validation_pairs]
    if not entries:
        return None
    sampling = SamplingSettings(num_samples=1, steps=settings.validation_steps, guidance_scale=VALIDATION_SCALE,
                                seed=settings.seed, resolution=parse_resolution(index.resolution))
    rows, scores = [], []
    with models.validating() as pipe:
        for entry in entries:
            person_in, garment_in, real = held_out_inputs(pipe, cache, entry, index)
            result = pipe.generate(person_in, garment_in, sampling)
            tried = result.images[0].convert("RGB").resize(real.size)
            scores.append(ssim(np.asarray(real), np.asarray(tried)))
            rows.append(contact_sheet([real, garment_in.garment, tried]))
    return ValidationResult(step, write_sheet(rows, folder, step, {"ssim": json.dumps([round(s, 5) for s in scores])}),
                            scores)


def write_sheet(rows: list[Image.Image], folder: Path, step: int, text: dict[str, str]) -> Path:
    """The rows one under another, as RUN/validation/step-N.png (complete or absent)."""
    width = max(r.width for r in rows)
    sheet = Image.new("RGB", (width, sum(r.height for r in rows) + GAP * (len(rows) - 1)), (255, 255, 255))
    y = 0
    for row in rows:
        sheet.paste(row, (0, y))
        y += row.height + GAP
    folder.mkdir(parents=True, exist_ok=True)
    return save_png_atomic(sheet, folder / f"step-{step:08d}.png",
                           {"software": "ootd", "validation_step": str(step), **text}, overwrite=True)
