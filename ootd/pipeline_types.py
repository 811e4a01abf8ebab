"""What the pipeline's stages hand each other and return: prepared person, prepared garment, the result, and the
typed records on it: where and how it ran (`RunInfo`), seconds per stage (`Timings`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from ootd.errors import UsageError
from ootd.imaging.files import ImageInput, load_photo
from ootd.imaging.framing import FitInfo, frame_of, restore_framing
from ootd.imaging.photo import photo_pictures
from ootd.settings import Category, ModelType, PhotoOutput, Resolution, SamplingSettings
from ootd.speedups.modes import SpeedModes
from ootd.weights.lora import LoraChoice

if TYPE_CHECKING:
    import torch

    from ootd.evaluation.preservation import Preservation
    from ootd.preprocessing import PhotoParse

Progress = Callable[[str, int, int], None]  # (stage, done, total): how every stage reports progress


@dataclass(frozen=True)
class RunInfo:
    """Where and how a try-on ran: what its PNG record, `--json`, the API and the summary lines report. A pipeline
    that describes itself (`TryOnPipeline.describe`) fills every field; a stand-in only the first ones."""

    device: str  # `cpu`, `cuda:0 (NVIDIA ...)`: the torch device, with its name when that says more
    precision: str  # the UNets' dtype: fp32, bf16, fp16
    attention: str  # the attention backend as its dispatcher describes it (what it chose, what ran)
    threads: int | None = None  # torch's CPU threads (a CPU float sum's last bit depends on them)
    device_name: str | None = None
    arch: str | None = None
    vendor: str | None = None
    model_type: str | None = None
    precision_word: str | None = None  # the precision for people, with why `auto` chose it
    precision_by_component: dict[str, str] | None = None
    channels_last: bool | None = None
    vae_channels_last: bool | None = None
    compile: bool | None = None
    quantize: str | None = None
    parsing_providers: list[str] | None = None
    plan: dict[str, Any] | None = None  # the memory plan of the call (ootd/memory/planner.py `Plan.to_dict`)
    described: bool = False  # the pipeline described itself (else: read from a stand-in's attributes)

    _OWN = ("device", "device_name", "arch", "vendor", "model_type", "precision", "precision_word", "attention",
            "channels_last", "vae_channels_last", "compile", "quantize", "parsing_providers", "plan",
            "precision_by_component", "threads")

    def to_json(self) -> dict[str, Any]:
        """The keys (in the order) `--json`, the batch summary and the API have always given: a described
        pipeline's every field, a stand-in's those it has."""
        kept = {"parsing_providers", "plan"} if self.described else set()
        return {key: value for key in self._OWN
                if (value := getattr(self, key)) is not None or key in kept}


@dataclass
class Timings:
    """Seconds per stage, in the order the stages ran, and per denoising step: what one call measured, what a job
    adds up over its passes, what a front end adds its own stages to (`load`, `save`). `to_json` gives them as
    every answer has: a stage's seconds by its name, the steps' under `steps` after `denoise`."""

    stages: dict[str, float] = field(default_factory=dict)
    steps: list[float] = field(default_factory=list)

    def add(self, stage: str, seconds: float) -> None:
        """`seconds` more for `stage` (a new stage goes last)."""
        self.stages[stage] = self.stages.get(stage, 0.0) + seconds

    def extend(self, other: Timings, leave_out: Iterable[str] = ()) -> None:
        """Another call's stages added to these (those in `leave_out` not), its steps after these."""
        skip = set(leave_out)
        for stage, seconds in other.stages.items():
            if stage not in skip:
                self.add(stage, seconds)
        self.steps.extend(other.steps)

    @property
    def total(self) -> float:
        """The stages' seconds added up."""
        return sum(self.stages.values())

    def to_json(self, digits: int | None = None, **ends: float) -> dict[str, float | list[float]]:
        """Stage -> seconds, `steps` after `denoise` (or last), then `ends` (a front end's `total`, `wall`), each
        rounded to `digits` when given."""
        def fix(value: float) -> float:
            return round(value, digits) if digits is not None else value

        out: dict[str, float | list[float]] = {}
        for stage, seconds in self.stages.items():
            out[stage] = fix(seconds)
            if stage == "denoise" and self.steps:
                out["steps"] = [fix(step) for step in self.steps]
        if self.steps and "steps" not in out:
            out["steps"] = [fix(step) for step in self.steps]
        out.update({name: fix(seconds) for name, seconds in ends.items()})
        return out


@dataclass
class TryOnResult:
    """What one call returns, and what made it (model, category, sampling settings, speed modes): `timings` its
    seconds per stage and step, `ran` where and how it ran."""

    images: list[Image.Image]
    mask: Image.Image
    masked_person: Image.Image
    seed: int
    timings: Timings = field(default_factory=Timings)
    intermediates: dict[str, Image.Image] = field(default_factory=dict)
    model_type: ModelType | None = None
    category: Category | None = None
    sampling: SamplingSettings | None = None
    modes: SpeedModes | None = None
    lora: LoraChoice | None = None  # the adapter merged into the UNets
    fit: FitInfo | None = None  # how the person photo was framed (what maps the images back onto it)
    ran: RunInfo | None = None  # the device, precision, attention and memory plan of the call

    def on_photo(self, photo: ImageInput | bytes, *, keep_unmasked: bool = True,
                 feather: int | None = None) -> list[Image.Image]:
        """The images brought back to the person `photo` they were made from (its path, bytes or image), as
        `ootd run --keep-unmasked` gives them: the photo itself, at its own size, orientation and mode, with
        only the repainted region replaced, blended over a seam of `feather` (`--feather`, default 4); with
        `keep_unmasked=False`, as `--output-size photo`: the generated picture at the photo's size and framing.
        The same code as the CLI (ootd/imaging/photo.py), so the same pixels for the same inputs and seed;
        `images` stay the method's own output at the working size."""
        if self.fit is None:
            raise UsageError("this result does not say how its photo was framed (made by TryOnPipeline)")
        output = PhotoOutput.from_words(None if keep_unmasked else "photo", keep_unmasked, feather)
        label = str(photo) if isinstance(photo, str | Path) else "photo"
        loaded = load_photo(photo, label)
        if loaded.size != self.fit.original_size:
            raise UsageError(f"person image {label}: {loaded.size[0]}x{loaded.size[1]} upright, the result was "
                             f"made from a {self.fit.original_size[0]}x{self.fit.original_size[1]} photo")
        info = frame_of(loaded.size, self.fit.size, self.fit.mode)
        repainted = restore_framing(self.mask.convert("L"), self.fit, keep_scale=True)
        pictures, _ = photo_pictures(loaded, self.images, info, repainted.resize(self.images[0].size, Image.NEAREST),
                                     output.keep_unmasked, output.feather)
        return pictures[:]  # by index: each stays open (iterating would stream them, closing each in turn)

    def preservation(self, photo: ImageInput | bytes, parser: Any) -> list[Preservation]:
        """What each image changed of the person `photo` it was made from (its path, bytes or image), region by
        region, outside and inside the mask (docs/preservation.md): the photo framed as the images were, parsed
        by `parser` (the pose and parsing models: `pipe.preprocessor`). The figures `ootd eval --preservation`
        gives for the same images saved at the working size."""
        from ootd.evaluation.preservation import SEAM_LATENT, measure_preservation, regions_at_working_size
        from ootd.imaging.framing import fit_to_aspect

        if self.fit is None or self.model_type is None:
            raise UsageError("this result does not say how its photo was framed (made by TryOnPipeline)")
        label = str(photo) if isinstance(photo, str | Path) else "photo"
        loaded = load_photo(photo, label).convert("RGB")
        if loaded.size != self.fit.original_size:
            raise UsageError(f"person image {label}: {loaded.size[0]}x{loaded.size[1]} upright, the result was "
                             f"made from a {self.fit.original_size[0]}x{self.fit.original_size[1]} photo")
        framed, fit = fit_to_aspect(loaded, self.fit.size, self.fit.mode, pad_color="edge")
        _, keypoints, labels = parser.parse(framed)
        regions = regions_at_working_size(labels, keypoints, self.model_type.value, fit)
        reference = np.asarray(restore_framing(framed, fit, keep_scale=True))
        mask = np.asarray(restore_framing(self.mask.convert("L"), fit, keep_scale=True)) >= 128
        return [measure_preservation(np.asarray(image.convert("RGB")), reference, regions, mask, SEAM_LATENT)
                for image in self.images]


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
    timings: Timings
    parse: PhotoParse | None = None  # the pose + parsing an automatic mask came from (PersonMask.parse)


@dataclass
class GarmentInputs:
    """The garment side of a try-on, reusable across people."""

    category: Category
    resolution: Resolution
    garment: Image.Image
    prompt: torch.Tensor  # [1, L, D]
    features: dict[str, torch.Tensor]  # garment UNet block inputs, batch [garment, zeros] (or [garment]: below)
    timings: Timings
    # the features hold guidance's unconditional item (zeros); False: [garment] alone, for calls without guidance
    unconditional: bool = True
