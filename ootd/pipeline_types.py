"""What the pipeline's stages hand each other and return: prepared person, prepared garment, the result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from PIL import Image

from ootd.imaging.framing import FitInfo
from ootd.settings import Category, ModelType, Resolution, SamplingSettings
from ootd.speedups.modes import SpeedModes
from ootd.weights.lora import LoraChoice

if TYPE_CHECKING:
    import torch

Progress = Callable[[str, int, int], None]  # (stage, done, total): how every stage reports progress


@dataclass
class TryOnResult:
    """What one call returns, and what made it (model, category, sampling settings, speed modes). `timings` holds
    seconds per stage (and "steps": seconds per step)."""

    images: list[Image.Image]
    mask: Image.Image
    masked_person: Image.Image
    seed: int
    timings: dict[str, float | list[float]] = field(default_factory=dict)
    intermediates: dict[str, Image.Image] = field(default_factory=dict)
    model_type: ModelType | None = None
    category: Category | None = None
    sampling: SamplingSettings | None = None
    modes: SpeedModes | None = None
    lora: LoraChoice | None = None  # the adapter merged into the UNets


@dataclass
class PersonInputs:
    """The person side of a try-on, reusable across garments."""

    category: Category
    resolution: Resolution
    person: Image.Image  # at the working resolution, framed 3:4
    mask: Image.Image  # "L", 255 inside, working resolution
    masked_person: Image.Image
    fit: FitInfo
    intermediates: dict[str, Image.Image]
    person_latents: torch.Tensor  # masked person, unscaled
    original_latents: torch.Tensor  # person, times the VAE scaling factor
    timings: dict[str, float]


@dataclass
class GarmentInputs:
    """The garment side of a try-on, reusable across people."""

    category: Category
    resolution: Resolution
    garment: Image.Image
    prompt: torch.Tensor  # [1, L, D]
    features: dict[str, torch.Tensor]  # garment UNet block inputs, batch [garment, zeros]
    timings: dict[str, float]
