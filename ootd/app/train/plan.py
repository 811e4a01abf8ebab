"""`ootd train run --explain`: the device, precision and attention a fine-tune runs with and its memory estimate
(ootd/training/memory.py), from the loaded models."""

from __future__ import annotations

from typing import Any

from ootd.settings import Resolution
from ootd.training.memory import TrainingEstimate, estimate_training
from ootd.training.settings import TrainSettings


def _params(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())


def training_estimate(models: Any, resolution: Resolution, settings: TrainSettings) -> TrainingEstimate:
    c = models.pipe.components
    adapter = sum(p.numel() for p in models.params)
    weight_bytes = c.unet_vton.conv_in.weight.element_size()
    autocast = models.autocast.itemsize if models.autocast is not None else 4
    return estimate_training(_params(c.unet_vton) + _params(c.unet_garm) - adapter, _params(c.vae), adapter,
                             weight_bytes, (resolution.width // 8) * (resolution.height // 8), settings.batch_size,
                             settings.gradient_checkpointing, settings.train_garment, autocast)


def explain_lines(models: Any, resolution: Resolution, settings: TrainSettings, workers: int = 1) -> list[str]:
    info = models.pipe.describe()
    shown = {"device": "device", "precision": "precision_word", "attention": "attention"}
    lines = [f"{label}: {info[key]}" for label, key in shown.items() if info.get(key)]
    lines.append(f"global batch: {settings.batch_size} x {settings.accumulation} accumulation x {workers} "
                 f"worker(s) = {settings.batch_size * settings.accumulation * workers} pairs per step")
    lines.append(training_estimate(models, resolution, settings).explain() + (" (per worker)" if workers > 1 else ""))
    return lines
