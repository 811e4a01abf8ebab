"""Choices and settings as frozen dataclasses and str Enums, parsed once from user words.

The errors here name the setting they are about by its declared name (`{@mask_grow}`: ootd/errors.py), so each
front end words it its own way; the bounds are constants, which the declarations of ootd/app/tryon/settings.py
state to every front end (help, the API's schema, a node's inputs).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, fields
from enum import StrEnum, nonmember

from ootd.errors import UsageError


class Choice(StrEnum):
    """A closed set of user words: parsed once, case-insensitively, with the valid words in the error. A subclass
    names what it is for messages with `label = nonmember("model type")`."""

    label = nonmember("")

    @classmethod
    def parse(cls, value: str | Choice, what: str | None = None) -> Choice:
        try:
            return cls(str(getattr(value, "value", value)).strip().lower())
        except ValueError:
            label = what or cls.label or cls.__name__
            raise UsageError(f"unknown {label} {value!r}: use one of {', '.join(cls.words())}") from None

    @classmethod
    def words(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)


class ModelType(Choice):
    HD = "hd"  # half-body model (VITON-HD): upper-body garments only
    DC = "dc"  # full-body model (Dress Code): upper, lower, dress

    label = nonmember("model type")


class Category(StrEnum):
    UPPER = "upper"
    LOWER = "lower"
    DRESS = "dress"

    @property
    def mask_name(self) -> str:
        """The name the masking rules use (docs/upstream.md §8)."""
        return {"upper": "upper_body", "lower": "lower_body", "dress": "dresses"}[self.value]

    @property
    def prompt_word(self) -> str:
        """The word the dc model's text encoder is given (docs/upstream.md §3)."""
        return {"upper": "upperbody", "lower": "lowerbody", "dress": "dress"}[self.value]

    @classmethod
    def parse(cls, value: str | Category) -> Category:
        """Accept our names, the original's names and its 0/1/2 indices."""
        if isinstance(value, Category):
            return value
        key = str(value).strip().lower().replace("-", "_")
        aliases = {
            "upper": cls.UPPER, "upperbody": cls.UPPER, "upper_body": cls.UPPER, "0": cls.UPPER,
            "lower": cls.LOWER, "lowerbody": cls.LOWER, "lower_body": cls.LOWER, "1": cls.LOWER,
            "dress": cls.DRESS, "dresses": cls.DRESS, "2": cls.DRESS,
        }
        if key not in aliases:
            raise UsageError(f"unknown category {value!r}: use upper, lower or dress")
        return aliases[key]


DEFAULT_CATEGORY_MARGIN = 0.2  # `auto` refuses when the likeliest category leads the second by less
AUTO_CATEGORY = "auto"  # the category word that asks for classification (ootd/app/tryon/autocategory.py)
CategoryWord = Category | str  # a Category, or AUTO_CATEGORY; never handed to a pipeline


def parse_category_word(value: str | Category | None) -> CategoryWord:
    """A user's category word: a Category, or AUTO_CATEGORY for `auto`; resolved to a Category before a job is
    planned (a batch row's empty category means `auto`: ootd/app/batch/pairs.py)."""
    if isinstance(value, Category):
        return value
    key = str(value if value is not None else "").strip().lower()
    if key == AUTO_CATEGORY:
        return AUTO_CATEGORY
    try:
        return Category.parse(key)
    except UsageError:
        raise UsageError(f"unknown category {value!r}: use upper, lower, dress or auto") from None


def check_category_margin(value: float) -> float:
    """The probability lead `auto` needs over the second likeliest category: 0 (never refuse) up to 1."""
    if not 0.0 <= float(value) < 1.0:
        raise UsageError.about("category_margin", "{@category_margin} must be from 0 up to (not including) 1, "
                               "got {value}", value=value)
    return float(value)


def default_model_type(category: Category) -> ModelType:
    """hd for upper-body garments (its training set), dc for everything else."""
    return ModelType.HD if category is Category.UPPER else ModelType.DC


def check_model_category(model_type: ModelType, category: Category) -> None:
    if model_type is ModelType.HD and category is not Category.UPPER:
        raise UsageError.about(
            "model_type", "the hd model only does upper-body garments; use {@model_type} dc for category {category}",
            value=model_type, category=category.value,
            otherwise="the hd model only does upper-body garments: category {category} needs the dc model, which "
                      "is not available here")


@dataclass(frozen=True)
class Resolution:
    width: int
    height: int

    @property
    def size(self) -> tuple[int, int]:
        return (self.width, self.height)

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"


RESOLUTIONS = {"384x512": Resolution(384, 512), "768x1024": Resolution(768, 1024)}
PREPROCESS_RESOLUTION = Resolution(384, 512)  # pose, parsing and the mask always work here (docs/upstream.md §2)
# --mask-grow is counted in pixels of the PREPROCESS_RESOLUTION frame. Growing by its height already spreads a
# mask over nearly the whole picture, so more can only mean a mistake, and OpenCV's dilation needs a kernel of
# (2N+1)^2 bytes (N = 20000 crashes it, 100000 fails to allocate).
MAX_MASK_GROW = PREPROCESS_RESOLUTION.height


def check_mask_grow(pixels: int) -> int:
    """The mask growth in pixels if it is within 0..MAX_MASK_GROW, else a UsageError."""
    if not 0 <= int(pixels) <= MAX_MASK_GROW:
        raise UsageError.about("mask_grow", "{@mask_grow} must be 0 to {most} pixels (of a 512 px high frame), got "
                               "{value}", value=pixels, most=MAX_MASK_GROW)
    return int(pixels)


MAX_THREADS = 1024


def check_threads(threads: int) -> int:
    """A CPU thread count (the `threads` setting) if it is 1..MAX_THREADS, else a UsageError."""
    if not 1 <= int(threads) <= MAX_THREADS:
        raise UsageError.about("threads", "{@threads} must be 1 to {most}, got {value}", value=threads,
                               most=MAX_THREADS)
    return int(threads)


def parse_resolution(value: str | tuple[int, int] | Resolution) -> Resolution:
    if isinstance(value, Resolution):
        res = value
    elif isinstance(value, tuple | list):
        res = Resolution(int(value[0]), int(value[1]))
    else:
        key = str(value).strip().lower().replace("×", "x")
        if key not in RESOLUTIONS:
            raise UsageError(f"unknown resolution {value!r}: use 384x512 or 768x1024 (width x height)")
        res = RESOLUTIONS[key]
    if res not in RESOLUTIONS.values():
        raise UsageError(f"unsupported resolution {res}: use 384x512 or 768x1024 (width x height)")
    return res


class AttentionName(Choice):
    """Attention backends a user can ask for (ootd/attention/select.py builds them)."""

    label = nonmember("attention backend")

    AUTO = "auto"
    FLASH = "flash"
    SDPA = "sdpa"
    CHUNKED = "chunked"
    MATH = "math"


class PrecisionName(Choice):
    """Compute precision words; `auto` follows the device profile."""

    label = nonmember("precision")

    AUTO = "auto"
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


class QuantizeName(Choice):
    """Weight quantization of the UNets' Linear layers (ootd/speedups/quantize.py); `none` is the exact path."""

    NONE = "none"
    INT8_DYNAMIC = "int8-dynamic"  # int8 weights and int8 activations (quantized per call): the CPU candidate
    INT8_WEIGHT = "int8-weight"  # int8 weights, float activations: GPUs
    FP8 = "fp8"  # float8 weights and activations: NVIDIA compute capability 8.9+, AMD MI300 (gfx942)

    label = nonmember("quantization")


class SpeedPreset(Choice):
    """`--speed`: the exact method, or the speed modes that change the images combined (ootd/speedups/modes.py)."""

    EXACT = "exact"
    FAST = "fast"

    label = nonmember("speed preset")


class FitMode(Choice):
    """How an input that is not 3:4 is framed."""

    label = nonmember("fit mode")

    PAD = "pad"
    CROP = "crop"
    STRETCH = "stretch"


class OutputSize(Choice):
    """`--output-size`: the pictures at the working resolution (the method's own output), or the whole generated
    picture brought back to the photo's size and framing (ootd/imaging/photo.py)."""

    WORKING = "working"
    PHOTO = "photo"

    label = nonmember("output size")


# --feather: the half-width of the seam where `--keep-unmasked` blends the generated picture into the photo, in
# pixels of a picture FEATHER_HEIGHT high (scaled to the photo's height, so the seam looks the same at any size)
FEATHER_HEIGHT = 1024
DEFAULT_FEATHER = 4
MAX_FEATHER = 64


def check_feather(pixels: int) -> int:
    if not 0 <= int(pixels) <= MAX_FEATHER:
        raise UsageError.about("feather", "{@feather} must be 0 to {most} pixels (of a {height} px high picture), "
                               "got {value}", value=pixels, most=MAX_FEATHER, height=FEATHER_HEIGHT)
    return int(pixels)


@dataclass(frozen=True)
class PhotoOutput:
    """What the pictures are: the working resolution's (`OutputSize.WORKING`, the default: the original's
    output), the generated picture at the photo's size (`PHOTO`), or the photo itself with only the repainted
    region replaced, blended over `feather` pixels (`keep_unmasked`: at the photo's size)."""

    size: OutputSize = OutputSize.WORKING
    keep_unmasked: bool = False
    feather: int = DEFAULT_FEATHER

    @property
    def at_photo_size(self) -> bool:
        return self.keep_unmasked or self.size is OutputSize.PHOTO

    @classmethod
    def from_words(cls, size: str | None = None, keep_unmasked: bool = False,
                   feather: int | None = None) -> PhotoOutput:
        """Checked: `feather` needs `keep_unmasked`, which returns the photo at its own size (never `working`)."""
        chosen = OutputSize.parse(size) if size is not None else None
        if keep_unmasked and chosen is OutputSize.WORKING:
            raise UsageError.about("output_size", "{@keep_unmasked} gives back the photo at its own size: leave out "
                                   "{@output_size} working", value=chosen)
        if feather is not None and not keep_unmasked:
            raise UsageError.about("feather", "{@feather} is the seam of {@keep_unmasked}: pass {@keep_unmasked} "
                                   "too, or leave it out", value=feather)
        return cls(OutputSize.PHOTO if keep_unmasked else (chosen or OutputSize.WORKING), keep_unmasked,
                   check_feather(feather if feather is not None else DEFAULT_FEATHER))

    def updated(self, size: str | None = None, keep_unmasked: bool | None = None,
                feather: int | None = None) -> PhotoOutput:
        """These pictures, or what a request asks instead (checked as one: `keep_unmasked` not given keeps this
        one's; nothing given keeps all)."""
        if size is None and keep_unmasked is None and feather is None:
            return self
        kept = self.keep_unmasked if keep_unmasked is None else keep_unmasked
        return type(self).from_words(size, kept, feather)


class ParsingProvider(Choice):
    """ONNX Runtime execution providers for human parsing; `auto` tries the GPU ones first."""

    label = nonmember("parsing provider")

    AUTO = "auto"
    CPU = "cpu"
    MIGRAPHX = "migraphx"
    ROCM = "rocm"
    CUDA = "cuda"


class Pairing(Choice):
    """How folder-mode batch pairs people with garments."""

    label = nonmember("pairing")

    PRODUCT = "product"
    ZIP = "zip"


class SchedulerName(Choice):
    UNIPC = "unipc"  # the original's
    DPMPP = "dpmpp"  # DPM-Solver++ multistep
    DDIM = "ddim"
    EULER = "euler"
    LCM = "lcm"  # latent consistency sampling: a few-step adapter's (`ootd train distill`)
    TCD = "tcd"  # Trajectory Consistency Distillation's sampler, also for a few-step adapter

    label = nonmember("scheduler")

    @property
    def few_step(self) -> bool:
        """A consistency sampler: its timesteps come from the distillation's grid of CONSISTENCY_GRID points."""
        return self in (SchedulerName.LCM, SchedulerName.TCD)


# The timestep grid a few-step adapter is distilled on and its samplers pick from (diffusers' LCMScheduler and
# TCDScheduler `original_inference_steps`): every 20th of the 1000 training timesteps, so 1 to 50 steps.
CONSISTENCY_GRID = 50


GUIDANCE_ON = 1.0  # image guidance runs at scales from here up (as the original); below it is off
MAX_SAMPLES, MAX_STEPS = 64, 1000  # what one call may ask for (a server may allow less: ootd/serve/limits.py)
MAX_SCALE = 50.0  # image guidance scale
SEED_LIMIT = 2**63  # a seed is a non-negative 64-bit integer, below this


@dataclass(frozen=True)
class SamplingSettings:
    """What one call of the pipeline does besides its inputs (the speed modes are ootd.speedups.modes)."""

    num_samples: int = 1  # images per call, each from its own noise
    steps: int = 20  # denoising steps
    guidance_scale: float = 2.0  # image guidance; off below GUIDANCE_ON
    seed: int | None = None  # None: a random seed, reported back
    resolution: Resolution = RESOLUTIONS["768x1024"]
    scheduler: SchedulerName = SchedulerName.UNIPC

    def validate(self) -> None:
        if not 1 <= self.num_samples <= MAX_SAMPLES:
            raise UsageError.about("samples", "{@samples} must be between 1 and {most}, got {value}",
                                   value=self.num_samples, most=MAX_SAMPLES)
        if not 1 <= self.steps <= MAX_STEPS:
            raise UsageError.about("steps", "{@steps} must be between 1 and {most}, got {value}", value=self.steps,
                                   most=MAX_STEPS)
        if self.scheduler.few_step and self.steps > CONSISTENCY_GRID:
            raise UsageError.about("steps", "{@steps} must be between 1 and {most} with the {scheduler} scheduler "
                                   "(its timesteps are a grid of {most}), got {value}", value=self.steps,
                                   most=CONSISTENCY_GRID, scheduler=self.scheduler.value)
        if not 0.0 <= self.guidance_scale <= MAX_SCALE:
            raise UsageError.about("scale", "{@scale} must be between 0 and {most:g}, got {value}",
                                   value=self.guidance_scale, most=MAX_SCALE)
        if self.seed is not None and not 0 <= self.seed < SEED_LIMIT:
            raise UsageError.about("seed", "{@seed} must be a non-negative 64-bit integer, got {value}",
                                   value=self.seed)

    @property
    def guidance(self) -> bool:
        """Whether image guidance runs (a conditional and an unconditional half per step)."""
        return self.guidance_scale >= GUIDANCE_ON

    @property
    def unet_evaluations(self) -> int:
        """Try-on UNet evaluations a picture takes: one per step, two with guidance (what a step count costs)."""
        return self.steps * (2 if self.guidance else 1)

    @classmethod
    def from_words(cls, *, seed: int | None = None, resolution: str | tuple[int, int] | Resolution | None = None,
                   scheduler: str | SchedulerName | None = None, **numbers: float) -> SamplingSettings:
        """Validated settings from what a user gave (num_samples, steps, guidance_scale as `numbers`; anything
        omitted keeps its default). A random seed is drawn when none is given, so it can be reported."""
        settings = cls(
            seed=seed if seed is not None else secrets.randbelow(2**32),
            resolution=parse_resolution(resolution) if resolution is not None else cls.resolution,
            scheduler=SchedulerName.parse(scheduler) if scheduler is not None else cls.scheduler,
            **numbers,
        )
        settings.validate()
        return settings

    def updated(self, *, seed: int | None = None, resolution: str | Resolution | None = None,
                scheduler: str | SchedulerName | None = None, **numbers: float | None) -> SamplingSettings:
        """These settings with what a user gave on top (None keeps the value here; an absent seed is drawn
        afresh), validated: a per-request override keeps every other field."""
        words = {"seed", "resolution", "scheduler"}
        kept = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in words}
        kept.update({name: value for name, value in numbers.items() if value is not None})
        return type(self).from_words(seed=seed, resolution=resolution or self.resolution,
                                     scheduler=scheduler or self.scheduler, **kept)


class EngineName(Choice):
    """Where `ootd batch` runs its pairs (in this process, or on the actors of a Ray cluster: the `ray` extra) and
    `ootd serve` its try-ons (this process's device, or Ray Serve replicas: the `ray-serve` extra)."""

    label = nonmember("engine")

    LOCAL = "local"
    RAY = "ray"
