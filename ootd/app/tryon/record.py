"""The record of a picture: what it was made with, typed, built by the job (ootd/app/tryon/job.py) for each
picture it writes. Its PNG text, its JSON (`--json`, the API's answers), what resume expects of a finished pair and
the record of `ootd mask` files are all derived here, so a key name is spelt in this module and nowhere else
(reading a PNG's text back is ootd/app/tryon/provenance.py).

A picture of one garment records its pass: model, category, sampling and speed settings, its inputs' names, the
framing and mask growth (and, for `--category auto`, the classification's probability), then where it was
computed (device, precision, attention, CPU threads) and its sample number. An outfit's picture records its last
pass that way and, after it, each pass's garment, category, model, seed and mask under the pass's name
(`lower_seed`, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ootd import __version__
from ootd.settings import Category, FitMode, ModelType, PhotoOutput, SamplingSettings, SpeedPreset
from ootd.speedups.modes import SpeedModes
from ootd.weights.lora import LoraChoice

if TYPE_CHECKING:
    from ootd.app.tryon.config import RunConfig
    from ootd.app.tryon.request import TryOnRequest

SOFTWARE_KEY = "software"
SOFTWARE_PREFIX = "ootd"
AUTO_MASK = "auto"  # the mask name of a mask made from pose and parsing
# the keys that record what determines the pixels (and which inputs they came from): what resume compares
PIXEL_SETTINGS = ("model_type", "category", "samples", "steps", "scale", "seed", "resolution", "scheduler",
                  "cache_interval", "token_merge", "quantize", "person", "garment", "mask", "fit", "mask_grow",
                  "lora_sha256", "lora_scale", "output_size", "keep_unmasked", "feather")
NO_LORA = {"lora": "none", "lora_sha256": "none", "lora_scale": "none"}  # what a record without an adapter means
NO_PHOTO = {"output_size": "working", "keep_unmasked": "no", "feather": "none"}  # ... without --output-size photo
PASS_KEYS = ("garment", "category", "category_p", "model_type", "seed", "mask")  # recorded per pass of an outfit
# what an outfit's pictures share across their passes (the rest is compared per pass)
SHARED_SETTINGS = tuple(k for k in PIXEL_SETTINGS if k not in ("model_type", "category", "samples", "seed",
                                                                 "garment", "mask", "mask_grow"))
GIVEN_CATEGORY = "given"  # a pass's category_p when the category was given, not classified
# How the inputs' colours were read (ootd/imaging/icc.py): each input's embedded ICC profile applied, so the models
# saw sRGB; the picture is sRGB, or in the ICC profile its PNG carries (a picture that is the person photo). Not a
# pixel setting: an input without a profile gives the pixels it gave before this was recorded.
COLOUR = {"colour": "sRGB (inputs through their ICC profiles)"}
INPUT_KEYS = ("person", "garment", "mask")  # the keys that name a picture's inputs, not how it was made
# what `ootd compare` names when two pictures' records differ: the pixel settings and the adapter's file name, not
# the inputs' names
COMPARED_SETTINGS = tuple(k for k in (*PIXEL_SETTINGS, "lora") if k not in INPUT_KEYS)


def software() -> dict[str, str]:
    return {SOFTWARE_KEY: f"{SOFTWARE_PREFIX} {__version__}"}


@dataclass(frozen=True)
class PassRecord:
    """What one pass of a job was made with (one garment: the picture's own pass)."""

    model_type: ModelType
    category: Category
    sampling: SamplingSettings
    modes: SpeedModes
    person: str  # the inputs' file names
    garment: str
    mask: str  # AUTO_MASK for a mask made from pose and parsing
    fit: FitMode
    mask_grow: int
    category_p: float | None = None  # classified by `--category auto`, with this probability
    name: str = ""  # the pass's name in an outfit (`lower`, `upper`)
    lora: LoraChoice | None = None  # the adapter merged into the UNets, at its scale

    @classmethod
    def of(cls, request: TryOnRequest, config: RunConfig, name: str = "") -> PassRecord:
        """The record of `request` run with `config`."""
        return cls(config.model_type_for(request.category), request.category, config.sampling, config.speed,
                   request.name("person"), request.name("garment"),
                   request.name("mask") if request.mask is not None else AUTO_MASK, config.fit, config.mask_grow,
                   request.category_p, name, config.lora)

    def text(self) -> dict[str, str]:
        """This pass's part of the PNG text, in the order it is written."""
        s, m = self.sampling, self.modes
        text = {"model_type": self.model_type.value, "category": self.category.value,
                "samples": str(s.num_samples), "steps": str(s.steps), "scale": str(s.guidance_scale),
                "seed": str(s.seed), "resolution": str(s.resolution), "scheduler": s.scheduler.value,
                **_speed_words(m), **_lora_words(self.lora), "person": self.person, "garment": self.garment,
                "mask": self.mask, "fit": self.fit.value, "mask_grow": str(self.mask_grow)}
        if self.category_p is not None:
            text.update(category_source="auto", category_p=_probability(self.category_p))
        return text

    def settings(self) -> dict[str, Any]:
        """The sampling and speed settings for JSON (numbers as numbers)."""
        s, m = self.sampling, self.modes
        return {"model_type": self.model_type.value, "category": self.category.value, "samples": s.num_samples,
                "steps": s.steps, "scale": float(s.guidance_scale), "seed": s.seed, "resolution": str(s.resolution),
                "scheduler": s.scheduler.value, "speed": m.label(), "token_merge": m.token_merge.ratio,
                "cache_interval": m.feature_cache.interval, "quantize": m.quantize.value,
                **({"lora": self.lora.path.name, "lora_sha256": self.lora.sha256, "lora_scale": self.lora.scale,
                    **_few_step_settings(self.lora)} if self.lora is not None else {})}

    def pass_words(self) -> dict[str, str]:
        """What an outfit records of this pass (PASS_KEYS), as written."""
        return {"garment": self.garment, "category": self.category.value,
                "category_p": _probability(self.category_p) if self.category_p is not None else GIVEN_CATEGORY,
                "model_type": self.model_type.value, "seed": str(self.sampling.seed), "mask": self.mask}


@dataclass(frozen=True)
class Record:
    """What a picture was made with: its own pass, an outfit's passes in order (none for one garment), where it
    was computed and which sample it is (None: an intermediate picture of the job)."""

    picture: PassRecord
    passes: tuple[PassRecord, ...] = ()
    device: str = ""
    precision: str = ""
    attention: str = ""
    sample: int | None = None
    threads: str = ""  # the CPU threads of the process that made it (RunConfig.threads); empty: not known
    photo: PhotoOutput = field(default_factory=PhotoOutput)  # what the pictures are: working size, or the photo's
    run_seed: int | None = None  # the run's seed (an outfit's passes derive theirs from it); None: the picture's
    listed: tuple[str, ...] = ()  # an outfit's passes by name, in the order their garments were given

    def text(self) -> dict[str, str]:
        """The PNG text, in the order it is written."""
        text = {**software(), **self.picture.text(), **_photo_words(self.photo), **COLOUR, "device": self.device,
                "precision": self.precision, "attention": self.attention}
        if self.threads:
            text["threads"] = self.threads
        if self.sample is not None:
            text["sample"] = str(self.sample)
        for one in self.passes:
            text.update({f"{one.name}_{key}": value for key, value in one.pass_words().items()})
        if self.passes:
            text["outfit"] = "+".join(one.name for one in self.passes)
        return text

    def settings(self) -> dict[str, Any]:
        """The picture's settings for JSON: `ootd run --json`, the API's answers."""
        photo = self.photo
        at_photo = {"output_size": photo.size.value, "keep_unmasked": photo.keep_unmasked,
                    **({"feather": photo.feather} if photo.keep_unmasked else {})} if photo.at_photo_size else {}
        return {**self.picture.settings(), **at_photo}

    def speed_summary(self) -> str:
        """`speed fast (token merge 0.5, cache interval 3)`; empty for the exact method."""
        text = self.picture.text()
        if text["speed"] == SpeedPreset.EXACT.value:
            return ""
        on = [f"{key.replace('_', ' ')} {text[key]}" for key in EXACT_WORDS if text[key] != EXACT_WORDS[key]]
        return f"speed {text['speed']}" + (f" ({', '.join(on)})" if on else "")

    def report_fields(self, seed: int | None = None, *, resumed: bool = False) -> dict[str, Any]:
        """A batch report line's settings (ootd/app/batch/report.py `PairReport`): the category of the garment
        given first (the line's `garment`), every pass's model in the order they run, and the run's seed, or for
        a pair `resumed` from an earlier run the `seed` its files record as resume compares them (None: none)."""
        first = next((one for one in self.passes if self.listed and one.name == self.listed[0]), self.picture)
        models = "+".join(one.model_type.value for one in self.passes or (self.picture,))
        if not resumed:
            seed = self.run_seed if self.run_seed is not None else self.picture.sampling.seed
        return {"category": first.category.value, "model_type": models, "seed": seed}

    def garment_lines(self, words: Callable[[Category, float | None], str]) -> list[str]:
        """What `ootd run`'s summary says of the garments, each category as `words` puts it (autocategory's
        `category_words`): an outfit's passes in the order they ran, or a classified garment's category (a given
        one is not repeated back), so the summary need not tell one garment from an outfit."""
        if self.passes:
            return ["outfit: " + ", then ".join(f"{p.garment} {words(p.category, p.category_p)} with "
                                                f"{p.model_type.value}" for p in self.passes)]
        picture = self.picture
        return [] if picture.category_p is None else [f"category: {words(picture.category, picture.category_p)}"]

    def pass_summary(self) -> list[dict[str, str]]:
        """Each pass of an outfit as its record says it (garment, category, category_p, model, seed, mask)."""
        return [one.pass_words() for one in self.passes]

    def expected(self, seed_random: bool) -> dict[str, str]:
        """What resume compares (without the seed when it was drawn at random: a resumed batch keeps its files'
        seed). One garment: the picture's PIXEL_SETTINGS. An outfit: each pass's garment, category and model,
        the settings its passes share, and the first pass's seed (each picture's last pass has its own)."""
        photo = {**NO_PHOTO, **_photo_words(self.photo)}
        if not self.passes:
            full = {**NO_LORA, **self.picture.text(), **photo}
            return {key: full[key] for key in PIXEL_SETTINGS if not (seed_random and key == "seed")}
        expected = {"outfit": "+".join(one.name for one in self.passes)}
        first = self.passes[0]
        for one in self.passes:
            words = one.pass_words()
            expected.update({f"{one.name}_{key}": words[key] for key in ("garment", "category", "model_type")})
            if one is first:
                full = {**NO_LORA, **one.text(), **photo}
                expected.update({key: full[key] for key in SHARED_SETTINGS})
        if not seed_random:
            expected[f"{first.name}_seed"] = str(first.sampling.seed)
        return {**expected, **photo}


def comparable(text: dict[str, str]) -> dict[str, str]:
    """A picture's PNG text as resume compares it: an outfit's pictures (each with its last pass's own seed)
    compare their first pass's seed, which all of them share."""
    names = text.get("outfit", "").split("+")
    if not text or not names[0]:
        return text
    return {**text, "seed": text.get(f"{names[0]}_seed", "")}


def mask_record(person: str, category: Category, model_type: ModelType, config: RunConfig) -> dict[str, str]:
    """The PNG text of `ootd mask` files: what made the mask (a try-on with these settings makes the same)."""
    return {**software(), "person": person, "category": category.value, "model_type": model_type.value,
            "resolution": str(config.sampling.resolution), "fit": config.fit.value, "mask_grow": str(config.mask_grow),
            **COLOUR}


def _speed_words(modes: SpeedModes) -> dict[str, str]:
    return {"speed": modes.label(), "token_merge": str(modes.token_merge.ratio),
            "cache_interval": str(modes.feature_cache.interval), "quantize": modes.quantize.value}


def _lora_words(lora: LoraChoice | None) -> dict[str, str]:
    """A merged adapter's keys (none without one: a record without them means no adapter, NO_LORA)."""
    if lora is None:
        return {}
    return {"lora": lora.path.name, "lora_sha256": lora.sha256, "lora_scale": f"{lora.scale:g}",
            **{key: str(value) for key, value in _few_step_settings(lora).items()}}


# -- few-step adapters (`ootd train distill`): the sampling the adapter carries, recorded beside what was used --
def _few_step_settings(lora: LoraChoice) -> dict[str, Any]:
    """A few-step adapter's own steps, scheduler and guidance (none for a plain adapter)."""
    few = lora.few_step
    if few is None:
        return {}
    return {"lora_steps": few.steps, "lora_scheduler": few.scheduler.value, "lora_guidance": few.guidance}


def _photo_words(photo: PhotoOutput) -> dict[str, str]:
    """What pictures at the photo's size record (none for the working size: a record without them means it)."""
    if not photo.at_photo_size:
        return {}
    return {"output_size": photo.size.value, "keep_unmasked": "yes" if photo.keep_unmasked else "no",
            "feather": str(photo.feather) if photo.keep_unmasked else "none"}


def _probability(p: float) -> str:
    return f"{p:.4f}"


# what a record without the speed keys means (written before the speed modes existed): the exact path
EXACT_WORDS = {key: value for key, value in _speed_words(SpeedModes()).items() if key != "speed"}
DEFAULT_WORDS = {**EXACT_WORDS, **NO_LORA, **NO_PHOTO}  # what a record without these keys was made with
