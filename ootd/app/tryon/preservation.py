"""What a try-on changed that it should have kept: a result file measured against the person photo it was made
from (ootd/evaluation/preservation.py has the figures), as `ootd eval --preservation`, `ootd batch` and `ootd run`
(`measure_made`) do it.

The result's record (ootd/app/tryon/provenance.py `recorded_framing`) says how the photo was framed (working size,
fit, mask growth), whether the picture is at the working size or the photo's (and kept outside the mask), and
each pass's category, model and mask. The photo is framed again exactly as the try-on framed it, parsed by the
project's pose and parsing models (`parser`: the Preprocessor, loaded by whoever calls; not at all when the
parse the try-on's automatic mask came from is at hand: `ootd run`, a batch's pairs) and its masks made by the
code that made them (ootd/preprocessing.py `mask_person`): an automatic mask is the same mask; a user's mask
is read from its file (`masks`: its recorded name -> path). The parse also gives the regions
(preprocess/regions.py). Everything is then brought to the result's own frame: the working size with the padding
cut away, or the photo's size (ootd/imaging/photo.py's mapping, the same binarised mask `--keep-unmasked`
blended through).

The seam left out of the kept parts: at the working size the latents' pixel (SEAM_LATENT working pixels, scaled
to the picture), for `--keep-unmasked` its feather (outside it every pixel is the photo's).

Every problem is one line (an OotdError): a result without a record, a photo that is missing or not the one it
was made from (another size), a mask not found, nobody found in the photo.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.inputs import JobInputs
from ootd.app.tryon.provenance import is_intermediate_record, is_ours, read_record, recorded_framing
from ootd.app.tryon.record import AUTO_MASK
from ootd.errors import InputImageError, NoPersonError, OotdError, printable
from ootd.evaluation.preservation import (
    SEAM_LATENT,
    Preservation,
    measure_preservation,
    percent,
    regions_at_working_size,
)
from ootd.imaging.files import load_image, load_photo
from ootd.imaging.framing import FitInfo, frame_of, restore_framing
from ootd.imaging.opener import open_image
from ootd.imaging.photo import feather_pixels, in_photo_frame, photo_mask
from ootd.preprocessing import PhotoParse, parse_view, view_key
from ootd.settings import Category, FitMode, ModelType, OutputSize, PhotoOutput, Resolution, parse_resolution

logger = logging.getLogger(__name__)

PARSES_KEPT = 32  # distinct photos whose parse a ParseCache keeps (a batch's people cycle once per garment)
Parser = Callable[[], Any]  # the pose + parsing models (a Preprocessor), loaded when first asked for


def parser_for(config: RunConfig) -> Parser:
    """The pose and parsing models as a try-on with `config` gets them (from the model owner of its config:
    checkpoints, device, parsing provider, threads; the `use_models` seam applies), loaded when first called."""
    from ootd.app.tryon.loader import models_for

    return models_for(config).preprocessor


class PreservationError(OotdError):
    """A result that cannot be measured, and why (one line)."""


@dataclass(frozen=True)
class PreservationChoice:
    """Whether a batch measures each pair it makes (`ootd batch --no-preservation`: not), and the share (0 to 1)
    above which a pair is marked for review (None: none is)."""

    on: bool = True
    review_above: float | None = None


@dataclass(frozen=True)
class Making:
    """How a result was made from its photo, typed from its record."""

    resolution: Resolution
    fit: FitMode
    grow: int
    photo: PhotoOutput
    passes: tuple[tuple[Category, ModelType, str | None], ...]  # category, model, user mask name (None: auto)

    @classmethod
    def of(cls, record: dict[str, str]) -> Making:
        if not is_ours(record) or is_intermediate_record(record):
            raise PreservationError("not a result of ootd's (its PNG has no try-on record), so its photo, "
                                    "framing and mask are not known")
        words = recorded_framing(record)
        try:
            size = OutputSize.parse(words.output_size)
            photo = PhotoOutput(size, words.keep_unmasked, int(words.feather) if words.keep_unmasked else 0)
            passes = tuple((Category.parse(p.category), ModelType.parse(p.model_type),
                            None if p.mask == AUTO_MASK else p.mask) for p in words.passes)
            return cls(parse_resolution(words.resolution), FitMode.parse(words.fit), int(words.mask_grow), photo,
                       passes)
        except (OotdError, ValueError) as exc:
            raise PreservationError(f"its record does not say how it was made ({exc})") from None


class ParseCache:
    """The parse (keypoints, labels) of the last PARSES_KEPT framed photos, and the failures (nobody found), keyed
    by the view pose and parsing see (ootd/preprocessing.py `view_key`), so a photo is parsed once for all its
    results; a parse its try-on already made is `remember`ed instead of made again. The parser loads at the first
    parse."""

    def __init__(self, parser: Parser, size: int = PARSES_KEPT) -> None:
        self.parser, self.size = parser, size
        self.items: OrderedDict[str, Any] = OrderedDict()
        self.parses = 0
        self._loaded: Any = None

    def preprocessor(self) -> Any:
        """The parser, loaded once; a failure to load it is remembered (every later result gets it at once)."""
        if isinstance(self._loaded, BaseException):
            raise self._loaded.with_traceback(None)
        if self._loaded is None:
            try:
                self._loaded = self.parser()
            except OotdError as exc:
                self._loaded = exc
                raise
        return self._loaded

    def remember(self, parse: PhotoParse | None) -> None:
        """Keep a parse made elsewhere (a try-on's, for its masks): the photo framed as it was is not parsed
        again."""
        if parse is not None:
            self._keep(parse.key, (parse.keypoints, parse.labels))

    def _keep(self, key: str, found: Any) -> None:
        self.items[key] = found
        self.items.move_to_end(key)
        while len(self.items) > self.size:
            self.items.popitem(last=False)

    def parse(self, framed: Image.Image) -> tuple[np.ndarray, np.ndarray]:
        """The keypoints and labels of the framed photo `framed`, parsed only when no parse of its view is kept."""
        key = view_key(parse_view(framed))
        if key in self.items:
            self.items.move_to_end(key)
        else:
            try:
                self.parses += 1
                _, keypoints, labels = self.preprocessor().parse(framed)
                self._keep(key, (keypoints, labels))
            except NoPersonError:
                self._keep(key, PreservationError("nobody found in the photo (pose estimation), so it has no "
                                                  "regions to measure"))
        found = self.items[key]
        if isinstance(found, BaseException):
            raise found.with_traceback(None)
        return found


class _Parsed:
    """What `mask_person` calls for an automatic mask: the cached parse of the framed photo, its mask rules."""

    def __init__(self, cache: ParseCache) -> None:
        self.cache = cache
        self.parse: tuple[np.ndarray, np.ndarray] | None = None

    def of(self, framed: Image.Image) -> tuple[np.ndarray, np.ndarray]:
        if self.parse is None:
            self.parse = self.cache.parse(framed)
        return self.parse

    def __call__(self, person: Image.Image, category: Category, model_type: ModelType, grow: int = 0) -> Any:
        keypoints, labels = self.of(person)
        small = person.convert("RGB").resize((labels.shape[1], labels.shape[0]))
        return self.cache.preprocessor().mask_from(small, keypoints, labels, category, model_type, grow)


def _read_result(path: Path) -> np.ndarray:
    def fail(problem: str) -> InputImageError:
        return InputImageError(f"the result: {' '.join(problem.split())}")

    with open_image(path, fail, min_side=1) as im:  # the numbers as stored: the photo's own colours for a picture
        return np.asarray(im.convert("RGB"))    # that is the photo, sRGB for one at the working size (as measured)


def _cut_size(info: FitInfo) -> tuple[int, int]:
    """The working-size picture's size once the padding is cut away (what the pipeline returns)."""
    left, top, right, bottom = info.box
    return (right - left, bottom - top) if info.mode == "pad" else info.size


def _frame_size(making: Making, info: FitInfo) -> tuple[int, int]:
    """The size the result has when it was made from a photo framed as `info`."""
    if not making.photo.at_photo_size:
        return _cut_size(info)
    if info.mode == "crop" and not making.photo.keep_unmasked:
        return info.box[2] - info.box[0], info.box[3] - info.box[1]
    return info.original_size


def _to_result_frame(picture: Image.Image, making: Making, info: FitInfo, fill: int) -> Image.Image:
    """A map made at the working frame (padding cut away) brought to the result's frame, NEAREST."""
    if not making.photo.at_photo_size:
        return picture
    region, offset = in_photo_frame(picture, info, Image.NEAREST)
    if info.mode == "crop" and not making.photo.keep_unmasked:
        return region
    canvas = Image.new("L", info.original_size, fill)
    canvas.paste(region, offset)
    return canvas


def _seam(making: Making, height: int, cut_height: int) -> int:
    if making.photo.keep_unmasked:
        return feather_pixels(making.photo.feather, height)
    return math.ceil(SEAM_LATENT * height / cut_height)


def _user_mask(name: str, masks: Mapping[str, Path]) -> Image.Image:
    path = masks.get(name)
    if path is None:
        raise PreservationError.about("masks", "it was made with the mask {mask}, which is not found (give "
                                      "the folder of the masks: {@masks})", mask=printable(name))
    return load_image(path, "mask")


def _masks_and_parse(person: Image.Image, making: Making, masks: Mapping[str, Path], parsed: _Parsed
                     ) -> tuple[Image.Image, Image.Image, FitInfo, tuple[np.ndarray, np.ndarray]]:
    """The person framed at the working size, the union of the passes' masks there, the framing, the parse."""
    from ootd.preprocessing import mask_person

    union, made = None, None
    for category, model_type, mask_name in making.passes:
        given = _user_mask(mask_name, masks) if mask_name is not None else None
        made = mask_person(person, category, model_type, making.resolution, making.fit, making.grow, mask=given,
                           preprocessor=parsed)
        union = made.mask if union is None else Image.fromarray(np.maximum(np.asarray(union), np.asarray(made.mask)))
    assert made is not None and union is not None
    return made.person, union, made.fit, parsed.of(made.person)


def measure_result(result: Path, person: Path, cache: ParseCache, masks: Mapping[str, Path] | None = None
                   ) -> Preservation:
    """The preservation figures of the result file `result`, made from the photo `person` (module docstring);
    `cache` parses each photo once. A PreservationError (or the input's own error) when it cannot be measured."""
    from preprocess.regions import NO_REGION

    picture = _read_result(result)
    making = Making.of(read_record(result))
    photo = load_image(person, "person")  # as the try-on saw it (orientation applied)
    info = frame_of(photo.size, making.resolution.size, making.fit)
    expected = _frame_size(making, info)
    if (picture.shape[1], picture.shape[0]) != expected:
        raise PreservationError(f"it is {picture.shape[1]}x{picture.shape[0]}, but {printable(person)} "
                                f"({photo.size[0]}x{photo.size[1]}) framed as its record says gives "
                                f"{expected[0]}x{expected[1]}: not the photo it was made from")
    framed, mask, fit, (keypoints, labels) = _masks_and_parse(photo, making, masks or {}, _Parsed(cache))
    regions = Image.fromarray(regions_at_working_size(labels, keypoints, making.passes[-1][1].value, fit))
    mask = restore_framing(mask, fit, keep_scale=True)
    if making.photo.at_photo_size:
        reference = load_photo(person, printable(person)).convert("RGB")
        if info.mode == "crop" and not making.photo.keep_unmasked:
            reference = reference.crop(info.box)
        mask = photo_mask(mask, info, 0)
        if info.mode == "crop" and not making.photo.keep_unmasked:
            mask = mask.crop(info.box)
    else:
        reference = restore_framing(framed, fit, keep_scale=True)
    regions = _to_result_frame(regions, making, info, NO_REGION)
    seam = _seam(making, picture.shape[0], _cut_size(info)[1])
    return measure_preservation(picture, np.asarray(reference.convert("RGB")), np.asarray(regions),
                                np.asarray(mask) >= 128, seam)


@dataclass(frozen=True)
class Measured:
    """One result's figures, or why it could not be measured."""

    result: str
    figures: Preservation | None = None
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.figures is None:
            return {"result": self.result, "problem": self.problem}
        return {"result": self.result, **self.figures.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measured:
        if data.get("problem") is not None or "regions" not in data:
            return cls(str(data.get("result", "")), problem=str(data.get("problem")))
        return cls(str(data["result"]), Preservation.from_json(data))


@dataclass(frozen=True)
class PairPreservation:
    """A pair's results measured (one per sample): the typed value a batch's report, its JSON and the Python API
    carry. `score` and `summary` are its worst result's; `review`: above the threshold a reviewer was asked for."""

    results: tuple[Measured, ...]
    review: bool = False

    @property
    def measured(self) -> list[Measured]:
        return [m for m in self.results if m.figures is not None]

    @property
    def worst(self) -> Measured | None:
        return max(self.measured, key=lambda m: m.figures.score if m.figures else 0.0, default=None)

    @property
    def score(self) -> float | None:
        worst = self.worst
        return worst.figures.score if worst is not None and worst.figures is not None else None

    def summary(self) -> str:
        """`hands 6.1%, face 0.2% changed` (its worst result's), or why nothing was measured."""
        worst = self.worst
        if worst is None or worst.figures is None:
            problem = next((m.problem for m in self.results if m.problem), "nothing measured")
            return f"not measured: {problem}"
        several = f" (worst: {Path(worst.result).name})" if len(self.measured) > 1 else ""
        return worst.figures.summary() + several

    def line(self) -> str:
        """`summary`, with ` · review` when the pair is marked for review."""
        return self.summary() + (" · review" if self.review else "")

    def to_json(self) -> dict[str, Any]:
        score = self.score
        return {"score": round(score, 6) if score is not None else None, "summary": self.summary(),
                "review": self.review, "results": [m.to_json() for m in self.results]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PairPreservation:
        """What `to_json` wrote (a batch report's line); a ValueError when it is not that."""
        try:
            return cls(tuple(Measured.from_json(m) for m in data["results"]), bool(data.get("review")))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a pair's preservation ({exc})") from None


def measure_pair(results: list[Path], person: Path, cache: ParseCache, masks: Mapping[str, Path] | None = None,
                 review_above: float | None = None) -> PairPreservation:
    """Each of a pair's results measured (a problem is its line, not an error); `review_above`: a share (0 to 1)
    above which the pair is marked for review."""
    measured = []
    for path in results:
        try:
            measured.append(Measured(str(path), measure_result(path, person, cache, masks)))
        except OotdError as exc:
            measured.append(Measured(str(path), problem=" ".join(str(exc).split())))
    pair = PairPreservation(tuple(measured))
    score = pair.score
    return PairPreservation(pair.results, review_above is not None and score is not None and score > review_above)


def measure_made(results: Sequence[Path], inputs: JobInputs, parser: Parser, review_above: float | None = None,
                 parse: PhotoParse | None = None) -> PairPreservation:
    """What one job (`ootd run`) made changed of its person photo: `measure_pair` on its results, the photo and the
    masks as the user gave them (paths), with `parse` (the parse its automatic mask came from, `JobOutcome.parse`:
    the photo is not parsed again) or else `parser` (the pose and parsing models the job's model owner holds).
    Never raises: the try-on is done and saved, so whatever stops the measuring is each result's `problem`."""
    person = inputs.photo_source
    if not isinstance(person, str | Path):
        return _unmeasured(results, "the person photo was not given as a file, so it cannot be read again")
    masks = {Path(g.mask).name: Path(g.mask) for g in inputs.garments if isinstance(g.mask, str | Path)}
    cache = ParseCache(parser, 1)
    cache.remember(parse)
    try:
        return measure_pair(list(results), Path(person), cache, masks, review_above)
    except Exception as exc:  # measuring must not fail a run whose pictures are written: said, not hidden
        logger.warning("preservation: %s", exc, exc_info=True)
        return _unmeasured(results, f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())}")


def _unmeasured(results: Sequence[Path], problem: str) -> PairPreservation:
    return PairPreservation(tuple(Measured(str(path), problem=problem) for path in results))


__all__ = ["Measured", "PairPreservation", "ParseCache", "PreservationChoice", "PreservationError", "measure_made",
           "measure_pair", "measure_result", "parser_for", "percent"]
