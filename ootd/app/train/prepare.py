"""`ootd train prepare`: a training set's pairs -> the cache every epoch reads (ootd/training/cache.py).

Per pair, once: the photos decoded and checked as `ootd run` checks them, the person framed at the working
resolution and masked by ootd's own pose + parsing (or the given mask), the latents and the garment's prompt
embedding computed as inference computes them. The order of the work:

1. every row read and its files checked (a bad row is listed with its number and skipped, never a traceback);
2. the split: a fraction of the people (a person is a person photo) is held out for validation, never a person on
   both sides;
3. each pair whose entry is not in the cache yet is prepared and written (complete or absent), so an interrupted
   prepare resumes where it stopped and a finished one does no work at all (no model is even loaded); the pairs of
   one person photo are prepared one after the other, so the photo is parsed once for all of them (the one parse
   held at a time), whatever the order the rows list them in;
4. the index, written last, in the rows' order.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from ootd.app.train.layouts import Row, read_rows
from ootd.errors import InputImageError, NoPersonError, OotdError, UsageError, printable
from ootd.models import Models
from ootd.pipeline_types import Progress
from ootd.preprocessing import ParseOnce
from ootd.settings import (
    Category,
    FitMode,
    ModelType,
    ParsingProvider,
    Resolution,
    check_model_category,
    default_model_type,
)
from ootd.training.cache import (
    CacheEntry,
    CacheIndex,
    entry_key,
    entry_path,
    file_sha256,
    image_paths,
    read_index,
    write_entry,
    write_index,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrepareOptions:
    """What `ootd train prepare` was asked for, checked."""

    data: Path
    cache: Path
    checkpoints: Path
    model_type: ModelType | None = None  # None: hd when every garment is upper-body, else dc
    resolution: Resolution = Resolution(768, 1024)
    fit: FitMode = FitMode.PAD
    split: float = 0.0  # the fraction of people held out for validation
    seed: int = 0  # which people are held out
    pairs: Path | None = None  # a VITON-HD folder's pairs list
    device: str | None = None
    parsing_provider: str = "cpu"

    def __post_init__(self) -> None:
        if not 0.0 <= self.split < 1.0:
            raise UsageError.about("split", "{@split} must be from 0 up to (not including) 1, got {value}",
                                   value=self.split)


@dataclass
class PrepareReport:
    layout: str
    index: CacheIndex
    prepared: int = 0  # entries computed by this run
    reused: int = 0  # entries already in the cache (from an earlier run)
    problems: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)  # rows whose photos (and mask) an earlier row has


@dataclass(frozen=True)
class _Checked:
    row: Row
    key: str
    person_id: str


def _check_row(row: Row, model_type: ModelType, options: PrepareOptions) -> _Checked:
    """The row's files decoded and checked (InputImageError/UsageError with the problem), and its key."""
    from ootd.app.tryon.masking import check_mask_input
    from ootd.app.tryon.request import TryOnRequest

    if row.problem is not None:
        raise UsageError(row.problem)
    assert row.category is not None
    check_model_category(model_type, row.category)
    request = TryOnRequest(row.person, row.garment, row.category, row.mask).decoded()
    check_mask_input(request, fit=options.fit)
    hashes = {role: file_sha256(path) if path is not None else "auto"
              for role, path in (("person", row.person), ("garment", row.garment), ("mask", row.mask))}
    key = entry_key(model_type.value, str(options.resolution), options.fit.value, row.category.value,
                    hashes["person"], hashes["garment"], hashes["mask"])
    return _Checked(row, key, hashes["person"])


def held_out(person_ids: list[str], fraction: float, seed: int) -> set[str]:
    """The people held out: fraction x people, rounded to the nearest (at least one, never all), the first of a
    seeded hash order (stable across reruns). 0.34 of 3 people is 1, 0.5 of 3 is 2."""
    people = sorted(set(person_ids))
    if fraction <= 0 or not people:
        return set()
    count = min(len(people) - 1, max(1, math.floor(fraction * len(people) + 0.5)))
    order = sorted(people, key=lambda p: hashlib.sha256(f"{seed}:{p}".encode()).hexdigest())
    return set(order[:count])


def prepare_models(options: PrepareOptions) -> Models:
    """The model owner of a prepare (what it loads, when the first pair needs them: the VAE, the CLIP encoders,
    and pose + parsing for automatic masks; none of the UNets)."""
    from ootd.runtime import RuntimeRequest

    return Models(options.checkpoints, RuntimeRequest(device=options.device),
                  parsing_provider=ParsingProvider.parse(options.parsing_provider, "parsing provider"))


class _Parses:
    """Pose + parsing for the automatic masks of a prepare: the owner's models, loaded at the first automatic mask,
    the latest photo's parse kept (ootd/preprocessing.py `ParseOnce`), so the pairs of one photo, prepared one
    after the other, parse it once."""

    def __init__(self, models: Models) -> None:
        self.models = models
        self._once: ParseOnce | None = None

    def __call__(self) -> ParseOnce:
        if self._once is None:
            self._once = ParseOnce(self.models.preprocessor())
        return self._once

    @property
    def parses(self) -> int:
        return self._once.parses if self._once is not None else 0


def _prepare_one(checked: _Checked, model_type: ModelType, options: PrepareOptions, models: Models,
                 val: bool, parses: _Parses) -> None:
    """Compute and write one entry (and a held-out pair's photos); an automatic mask from `parses`."""
    from ootd.app.tryon.masking import PREPARE_REMEDY, no_person_error
    from ootd.imaging.atomic import save_png_atomic
    from ootd.imaging.files import load_image
    from ootd.imaging.framing import fit_to_aspect
    from ootd.preprocessing import mask_person
    from ootd.training.encode import pair_tensors

    row, cache = checked.row, options.cache
    assert row.category is not None
    person = load_image(row.person, "person")
    garment, _ = fit_to_aspect(load_image(row.garment, "garment"), options.resolution.size, options.fit,
                               pad_color="edge")
    encoders = models.encoders()
    try:
        masked = mask_person(person, row.category, model_type, options.resolution, options.fit, 0,
                             mask=load_image(row.mask, "mask") if row.mask is not None else None,
                             preprocessor=parses() if row.mask is None else None)
    except NoPersonError:
        raise no_person_error(str(row.person), PREPARE_REMEDY) from None
    tensors = pair_tensors(masked.person, masked.masked_person, masked.mask, garment, row.category, model_type,
                           encoders)
    if val:
        person_png, garment_png = image_paths(cache, checked.key)
        person_png.parent.mkdir(parents=True, exist_ok=True)
        save_png_atomic(masked.person, person_png, overwrite=True)
        save_png_atomic(garment, garment_png, overwrite=True)
    write_entry(cache, checked.key, tensors)  # last: an entry on disk means the pair is done


def _is_done(cache: Path, key: str, val: bool) -> bool:
    return entry_path(cache, key).is_file() and (not val or all(p.is_file() for p in image_paths(cache, key)))


def _model_type(rows: list[Row], given: ModelType | None) -> ModelType:
    if given is not None:
        return given
    categories = {row.category for row in rows if row.category is not None}
    return default_model_type(Category.UPPER) if categories <= {Category.UPPER} else ModelType.DC


def _check_cache(options: PrepareOptions, model_type: ModelType) -> None:
    """A cache holds one model type, resolution and framing: refuse to mix them."""
    if not (options.cache / "index.json").is_file():
        return
    index = read_index(options.cache)
    mine = (model_type.value, str(options.resolution), options.fit.value)
    if (index.model_type, index.resolution, index.fit) != mine:
        raise UsageError(f"cache {printable(options.cache)} holds {index.model_type} pairs at {index.resolution}, "
                         f"fit {index.fit}; this prepare is for {mine[0]} at {mine[1]}, fit {mine[2]}: use "
                         "another -o folder")


def _by_person(checked: list[_Checked]) -> list[int]:
    """The rows' positions with each person photo's together, the photos in the order they first appear (O(n))."""
    groups: dict[str, list[int]] = {}
    for position, item in enumerate(checked):
        groups.setdefault(item.person_id, []).append(position)
    return [position for group in groups.values() for position in group]


def _prepare_all(checked: list[_Checked], val_people: set[str], model_type: ModelType, options: PrepareOptions,
                 models: Models, tick: Progress) -> list[tuple[str, str]]:
    """Each row's outcome, by position: ("prepared" | "reused", ""), ("duplicate", the row it repeats) or
    ("problem", why). The rows of one photo are worked on together (`_by_person`), each in the rows' order, so an
    entry, a duplicate and a problem are what they would be row after row."""
    outcomes: list[tuple[str, str]] = [("", "")] * len(checked)
    parses = _Parses(models)
    done: dict[str, _Checked] = {}
    for count, position in enumerate(_by_person(checked), 1):
        item = checked[position]
        val = item.person_id in val_people
        if item.key in done:
            outcomes[position] = ("duplicate", done[item.key].row.where())
        elif _is_done(options.cache, item.key, val):
            outcomes[position], done[item.key] = ("reused", ""), item
        else:
            try:
                _prepare_one(item, model_type, options, models, val, parses)
                outcomes[position], done[item.key] = ("prepared", ""), item
            except (UsageError, NoPersonError, InputImageError) as exc:  # the pair's own problem, not the run's
                outcomes[position] = ("problem", str(exc))
        tick("prepare", count, len(checked))
    logger.debug("prepare: %d pose + parsing runs for %d rows", parses.parses, len(checked))
    return outcomes


def prepare(options: PrepareOptions, progress: Progress | None = None, models: Models | None = None) -> PrepareReport:
    """Prepare every good row into the cache (see the module docstring); `models`: the model owner (None: one of
    the options' own, `prepare_models`), asked for each model when the first pair needs it."""
    tick = progress or (lambda stage, done, total: None)
    layout, rows = read_rows(options.data, options.pairs)
    if not rows:
        raise UsageError(f"training data {printable(options.data)} lists no pairs")
    model_type = _model_type(rows, options.model_type)
    _check_cache(options, model_type)
    options.cache.mkdir(parents=True, exist_ok=True)
    report = PrepareReport(layout, CacheIndex(model_type.value, str(options.resolution), options.fit.value))
    checked: list[_Checked] = []
    for i, row in enumerate(rows, 1):
        try:
            checked.append(_check_row(row, model_type, options))
        except OotdError as exc:
            report.problems.append(f"{row.where()}: {exc}")
        tick("check", i, len(rows))
    val_people = held_out([c.person_id for c in checked], options.split, options.seed)
    outcomes = _prepare_all(checked, val_people, model_type, options, models or prepare_models(options), tick)
    done: dict[str, _Checked] = {}
    for item, (what, detail) in zip(checked, outcomes, strict=True):  # the rows' order, whatever the work's
        if what == "duplicate":
            report.duplicates.append(f"{item.row.where()}: the same photos as {detail}, trained on once")
        elif what == "problem":
            report.problems.append(f"{item.row.where()}: {detail}")
        else:
            report.reused += what == "reused"
            report.prepared += what == "prepared"
            done[item.key] = item
    entries = [CacheEntry(key, str(c.row.person), str(c.row.garment), c.row.category.value,  # type: ignore[union-attr]
                          c.person_id, "val" if c.person_id in val_people else "train") for key, c in done.items()]
    report.index = replace(report.index, entries=entries, skipped=list(report.problems))
    write_index(options.cache, report.index)
    return report
