"""The record of a picture: what it was made with, typed, built by the job (ootd/app/tryon/job.py) for each
picture it writes. Its PNG text, its JSON (`--json`, the API's answers), what resume expects of a finished pair and
the record of `ootd mask` files are all derived here; a setting's keys are declared with the setting
(ootd/app/tryon/settings.py: `Setting.record`), and the keys of what is not a setting (the inputs, the model, where
it ran) are spelt once, below (reading a PNG's text back is ootd/app/tryon/provenance.py).

A picture of one garment records its pass: model, category, every recorded setting (sampling, speed, adapter,
framing, mask growth, the pictures' size) in the order they are declared, its inputs' names (and, for `--category
auto`, the classification's probability), then where it was computed (device, precision, attention, CPU threads)
and its sample number. An outfit's picture records its last pass that way and, after it, each pass's garment,
category, model, seed and mask under the pass's name (`lower_seed`, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ootd import __version__
from ootd.app.tryon.settings import MASK, SETTINGS, value_of
from ootd.settings import AUTO_CATEGORY, Category, ModelType, SamplingSettings, SpeedPreset

if TYPE_CHECKING:
    from ootd.app.tryon.config import RunConfig
    from ootd.app.tryon.request import TryOnRequest

SOFTWARE_KEY = "software"
SOFTWARE_PREFIX = "ootd"
AUTO_MASK = "auto"  # the mask name of a mask made from pose and parsing
# the keys of what is not a setting: what a pass was made of, where it ran, which picture it is
MODEL_KEY, CATEGORY_KEY = "model_type", "category"
# How the inputs' colours were read (ootd/imaging/icc.py): each input's embedded ICC profile applied, so the models
# saw sRGB; the picture is sRGB, or in the ICC profile its PNG carries (a picture that is the person photo). Not a
# pixel setting: an input without a profile gives the pixels it gave before this was recorded.
COLOUR = {"colour": "sRGB (inputs through their ICC profiles)"}
INPUT_KEYS = ("person", "garment", "mask")  # the keys that name a picture's inputs, not how it was made
PERSON_KEY, GARMENT_KEY, MASK_KEY = INPUT_KEYS
CATEGORY_SOURCE_KEY, CATEGORY_P_KEY = "category_source", "category_p"
RAN_KEYS = ("device", "precision", "attention", "threads")  # where and how it was computed (not compared)
SAMPLE_KEY, OUTFIT_KEY = "sample", "outfit"
SEED_KEY = SETTINGS["seed"].record[0].key  # the settings' keys that this module reads back
SPEED_KEY = SETTINGS["speed"].record[0].key
PASS_KEYS = (GARMENT_KEY, CATEGORY_KEY, CATEGORY_P_KEY, MODEL_KEY, SEED_KEY, MASK_KEY)  # per pass of an outfit
# the keys that record what determines the pixels (and which inputs they came from): what resume compares
PIXEL_SETTINGS = (MODEL_KEY, CATEGORY_KEY, *(kept.key for _, kept in SETTINGS.recorded() if kept.pixels),
                  *INPUT_KEYS)
_PER_PASS = {kept.key for _, kept in SETTINGS.recorded() if kept.per_pass}
# what an outfit's pictures share across their passes (the rest is compared per pass)
SHARED_SETTINGS = tuple(k for k in PIXEL_SETTINGS
                        if k not in (MODEL_KEY, CATEGORY_KEY, GARMENT_KEY, MASK_KEY) and k not in _PER_PASS)
GIVEN_CATEGORY = "given"  # a pass's category_p when the category was given, not classified
# what `ootd compare` names when two pictures' records differ: the pixel settings and the keys declared compared
# (the adapter's file name), not the inputs' names
COMPARED_SETTINGS = tuple(k for k in (*PIXEL_SETTINGS, *(kept.key for _, kept in SETTINGS.recorded()
                                                           if kept.compared)) if k not in INPUT_KEYS)
# what a record without a setting's key means (written before it existed, or only written sometimes)
DEFAULT_WORDS = {kept.key: kept.absent for _, kept in SETTINGS.recorded() if kept.absent is not None}
# the speed modes' words of the exact method (a record's `speed` summary names the others)
EXACT_WORDS = {kept.key: kept.absent for one, kept in SETTINGS.recorded()
               if one.group == "speed" and kept.absent is not None}


def software() -> dict[str, str]:
    return {SOFTWARE_KEY: f"{SOFTWARE_PREFIX} {__version__}"}


def setting_text(config: RunConfig, front_end: str | None = None) -> dict[str, str]:
    """The PNG words of every recorded setting of `config` (of those `front_end` offers, when given), in the
    declarations' order; a key whose setting is not there (no adapter, the working size) is left out."""
    words = {}
    for one, kept in SETTINGS.recorded():
        if front_end is None or front_end in one.offered:
            text = kept.text(value_of(one, config))
            if text is not None:
                words[kept.key] = text
    return words


def setting_json(config: RunConfig) -> dict[str, Any]:
    """The JSON values of every recorded setting of `config` that has one (numbers as numbers)."""
    values = {}
    for one, kept in SETTINGS.recorded():
        value = kept.json(value_of(one, config)) if kept.json is not None else None
        if value is not None:
            values[kept.key] = value
    return values


@dataclass(frozen=True)
class PassRecord:
    """What one pass of a job was made with (one garment: the picture's own pass): its model and category, the
    pass's config (its settings' values), its inputs' names."""

    model_type: ModelType
    category: Category
    config: RunConfig  # the pass's own (an outfit's passes differ in seed, samples, mask growth)
    person: str  # the inputs' file names
    garment: str
    mask: str  # AUTO_MASK for a mask made from pose and parsing
    category_p: float | None = None  # classified by `--category auto`, with this probability
    name: str = ""  # the pass's name in an outfit (`lower`, `upper`)

    @classmethod
    def of(cls, request: TryOnRequest, config: RunConfig, name: str = "") -> PassRecord:
        """The record of `request` run with `config`."""
        return cls(config.model_type_for(request.category), request.category, config, request.name("person"),
                   request.name("garment"), request.name("mask") if request.mask is not None else AUTO_MASK,
                   request.category_p, name)

    @property
    def sampling(self) -> SamplingSettings:
        return self.config.sampling

    def text(self) -> dict[str, str]:
        """This pass's part of the PNG text, in the order it is written."""
        text = {MODEL_KEY: self.model_type.value, CATEGORY_KEY: self.category.value, **setting_text(self.config),
                PERSON_KEY: self.person, GARMENT_KEY: self.garment, MASK_KEY: self.mask}
        if self.category_p is not None:
            text.update({CATEGORY_SOURCE_KEY: AUTO_CATEGORY, CATEGORY_P_KEY: _probability(self.category_p)})
        return text

    def settings(self) -> dict[str, Any]:
        """The settings for JSON (numbers as numbers)."""
        return {MODEL_KEY: self.model_type.value, CATEGORY_KEY: self.category.value, **setting_json(self.config)}

    def pass_words(self) -> dict[str, str]:
        """What an outfit records of this pass (PASS_KEYS), as written."""
        p = _probability(self.category_p) if self.category_p is not None else GIVEN_CATEGORY
        return dict(zip(PASS_KEYS, (self.garment, self.category.value, p, self.model_type.value,
                                    str(self.sampling.seed), self.mask), strict=True))


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
    run_seed: int | None = None  # the run's seed (an outfit's passes derive theirs from it); None: the picture's
    listed: tuple[str, ...] = ()  # an outfit's passes by name, in the order their garments were given

    def text(self) -> dict[str, str]:
        """The PNG text, in the order it is written."""
        ran = dict(zip(RAN_KEYS, (self.device, self.precision, self.attention, self.threads), strict=True))
        text = {**software(), **self.picture.text(), **COLOUR, **{key: value for key, value in ran.items()
                                                                  if value or key != RAN_KEYS[-1]}}
        if self.sample is not None:
            text[SAMPLE_KEY] = str(self.sample)
        for one in self.passes:
            text.update({f"{one.name}_{key}": value for key, value in one.pass_words().items()})
        if self.passes:
            text[OUTFIT_KEY] = "+".join(one.name for one in self.passes)
        return text

    def settings(self) -> dict[str, Any]:
        """The picture's settings for JSON: `ootd run --json`, the API's answers."""
        return self.picture.settings()

    def speed_summary(self) -> str:
        """`speed fast (token merge 0.5, cache interval 3)`; empty for the exact method."""
        text = self.picture.text()
        if text[SPEED_KEY] == SpeedPreset.EXACT.value:
            return ""
        on = [f"{key.replace('_', ' ')} {text[key]}" for key in EXACT_WORDS if text[key] != EXACT_WORDS[key]]
        return f"speed {text[SPEED_KEY]}" + (f" ({', '.join(on)})" if on else "")

    def report_fields(self, seed: int | None = None, *, resumed: bool = False) -> dict[str, Any]:
        """A batch report line's settings (ootd/app/batch/report.py `PairReport`): the category of the garment
        given first (the line's `garment`), every pass's model in the order they run, and the run's seed, or for
        a pair `resumed` from an earlier run the `seed` its files record as resume compares them (None: none)."""
        first = next((one for one in self.passes if self.listed and one.name == self.listed[0]), self.picture)
        models = "+".join(one.model_type.value for one in self.passes or (self.picture,))
        if not resumed:
            seed = self.run_seed if self.run_seed is not None else self.picture.sampling.seed
        return {CATEGORY_KEY: first.category.value, MODEL_KEY: models, SEED_KEY: seed}

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
        if not self.passes:
            full = {**DEFAULT_WORDS, **self.picture.text()}
            return {key: full[key] for key in PIXEL_SETTINGS if not (seed_random and key == SEED_KEY)}
        expected = {OUTFIT_KEY: "+".join(one.name for one in self.passes)}
        first = self.passes[0]
        for one in self.passes:
            words = one.pass_words()
            expected.update({f"{one.name}_{key}": words[key] for key in (GARMENT_KEY, CATEGORY_KEY, MODEL_KEY)})
            if one is first:
                full = {**DEFAULT_WORDS, **one.text()}
                expected.update({key: full[key] for key in SHARED_SETTINGS})
        if not seed_random:
            expected[f"{first.name}_{SEED_KEY}"] = str(first.sampling.seed)
        return expected


def comparable(text: dict[str, str]) -> dict[str, str]:
    """A picture's PNG text as resume compares it: an outfit's pictures (each with its last pass's own seed)
    compare their first pass's seed, which all of them share."""
    names = text.get(OUTFIT_KEY, "").split("+")
    if not text or not names[0]:
        return text
    return {**text, SEED_KEY: text.get(f"{names[0]}_{SEED_KEY}", "")}


def mask_record(person: str, category: Category, model_type: ModelType, config: RunConfig) -> dict[str, str]:
    """The PNG text of `ootd mask` files: what made the mask (a try-on with these settings makes the same)."""
    return {**software(), PERSON_KEY: person, CATEGORY_KEY: category.value, MODEL_KEY: model_type.value,
            **setting_text(config, MASK), **COLOUR}


def _probability(p: float) -> str:
    return f"{p:.4f}"
