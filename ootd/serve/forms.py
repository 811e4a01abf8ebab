"""A multipart try-on request -> a JobSpec, with each problem as one line and its HTTP status.

422: a field is missing or has a bad value. 400: an upload is not a usable image, or the combination is impossible
(the hd model with a lower-body garment). The uploads are copied into the job's folder (the per-process temporary
folder) and checked there as `ootd run` checks files, before the request takes a place in the queue.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.datastructures import UploadFile

from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.inputs import GarmentInput, JobInputs
from ootd.errors import CheckpointError, OotdError, UsageError
from ootd.imaging.atomic import write_atomic
from ootd.serve.limits import Limits
from ootd.serve.service import JobSpec
from ootd.settings import AUTO_CATEGORY, Category, CategoryWord, FitMode, PhotoOutput, parse_category_word

if TYPE_CHECKING:
    from ootd.models import Models

FILES = ("person", "garment", "mask", "garment2", "mask2")
OPTIONAL_FILES = ("mask", "garment2", "mask2")
TEXT_FIELDS = ("category", "category2", "samples", "steps", "scale", "seed", "resolution", "scheduler", "fit",
               "keep_unmasked", "output_size", "feather")
NUMBERS = {"samples": int, "steps": int, "seed": int, "scale": float, "feather": int}
FLAGS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
REQUIRED = ("person", "garment", "category")
# what each field of the form means (the OpenAPI schema's descriptions)
FIELD_HELP = {
    "person": "photo of the person (PNG, JPEG, WebP...)",
    "garment": "photo of the garment",
    "mask": "optional mask, white = repaint, the person photo's shape: skips pose and parsing",
    "garment2": "optional second garment: an outfit (one upper and one lower garment; the lower is tried on first)",
    "mask2": "optional mask of the second garment (with a mask of the first)",
    "category2": "the second garment's category (default: the first's word, e.g. auto)",
    "category": "upper, lower or dress (or the aliases of ootd run), or auto: classified from the garment photo",
    "samples": "pictures to make (the server's --max-samples at most)",
    "steps": "denoising steps (the server's --max-steps at most)",
    "scale": "guidance scale, 0 to 50",
    "seed": "random seed; absent: a fresh random one (the answer says which)",
    "resolution": "384x512 or 768x1024",
    "scheduler": "the sampler (GET /api/options lists them)",
    "fit": "how a photo that is not 3:4 is framed: pad, crop or stretch",
    "keep_unmasked": "true: the answer's pictures are the person photo itself, at its own size, with only the "
                     "garment's region replaced (the page's default); absent: the server's setting",
    "output_size": "working (the pictures at the resolution) or photo (the generated picture at the photo's size)",
    "feather": "with keep_unmasked: the seam's width in pixels of a 1024 px high picture (default 4)",
}


class FieldError(UsageError):
    """A field is missing or has a bad value (HTTP 422)."""


class BadRequest(OotdError):
    """Unusable upload or impossible combination (HTTP 400)."""


def _text(form: Any, name: str) -> str | None:
    value = form.get(name)
    if isinstance(value, UploadFile):
        raise FieldError(f"{name} must be a form field, not a file")
    return None if value is None or not value.strip() else value.strip()


def _number(form: Any, name: str) -> int | float | None:
    value = _text(form, name)
    if value is None:
        return None
    kind = NUMBERS[name]
    try:
        return kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise FieldError(f"{name} must be {what}, got {value!r}") from None


def _photo(form: Any, base: RunConfig) -> PhotoOutput:
    """What the answer's pictures are: the server's setting, or the request's fields (all of them together)."""
    keep, size, feather = _text(form, "keep_unmasked"), _text(form, "output_size"), _number(form, "feather")
    if keep is None and size is None and feather is None:
        return base.photo
    if keep is not None and keep.lower() not in FLAGS:
        raise FieldError(f"keep_unmasked must be true or false, got {keep!r}")
    kept = FLAGS[keep.lower()] if keep is not None else base.photo.keep_unmasked
    return PhotoOutput.from_words(size, kept, feather)


def parse_settings(form: Any, base: RunConfig, limits: Limits) -> tuple[CategoryWord, RunConfig]:
    """The category and this request's config: the server's config with the request's sampling and framing,
    within the server's limits. An absent seed means a fresh random one."""
    unknown = sorted(set(form.keys()) - set(TEXT_FIELDS) - set(FILES))
    if unknown:
        raise FieldError(f"unknown field {unknown[0]!r}: use {', '.join(FILES + TEXT_FIELDS)}")
    if form.get("category") is None:
        raise FieldError(f"category is required: {', '.join(c.value for c in Category)} or {AUTO_CATEGORY}")
    words = _text(form, "category") or AUTO_CATEGORY  # empty: auto, as a batch row's empty category
    try:
        category = parse_category_word(words)
        numbers = {name: _number(form, name) for name in NUMBERS}
        for name in ("steps", "samples"):  # the bound that applies here, in one message whichever it is
            beyond = limits.out_of_range(name, numbers[name])
            if beyond is not None:
                raise FieldError(beyond)
        sampling = base.sampling.updated(
            seed=numbers["seed"], resolution=_text(form, "resolution"), scheduler=_text(form, "scheduler"),
            num_samples=numbers["samples"], steps=numbers["steps"], guidance_scale=numbers["scale"],
        )
        fit = FitMode.parse(_text(form, "fit") or base.fit, "fit")
        photo = _photo(form, base)
    except FieldError:
        raise
    except UsageError as exc:
        raise FieldError(str(exc)) from None
    beyond = limits.check_request(sampling.steps, sampling.num_samples)
    if beyond is not None:
        raise FieldError(beyond)
    config = replace(base, sampling=sampling, fit=fit, photo=photo)
    try:
        if category != AUTO_CATEGORY:  # `auto`: checked once the garment is classified (build_spec)
            config.model_type_for(category)
    except UsageError as exc:
        raise BadRequest(str(exc)) from None
    return category, config


def save_uploads(form: Any, folder: Path) -> dict[str, tuple[Path, str]]:
    """Copy each uploaded file into `folder/inputs/<role>/`: role -> (path, the client's file name)."""
    saved: dict[str, tuple[Path, str]] = {}
    for role in FILES:
        upload = form.get(role)
        if upload is None:
            if role in OPTIONAL_FILES:
                continue
            raise FieldError(f"{role} is required: a {role} image file")
        if not isinstance(upload, UploadFile):
            raise FieldError(f"{role} must be a file upload")
        name = _safe_name(upload.filename, role)
        target = folder / "inputs" / role / name
        target.parent.mkdir(parents=True, exist_ok=True)
        upload.file.seek(0)
        write_atomic(target, lambda out, upload=upload: shutil.copyfileobj(upload.file, out, 1 << 20), overwrite=True)
        saved[role] = (target, name)
    return saved


def _garments(form: Any, word: CategoryWord, saved: dict[str, tuple[Path, str]]) -> list[GarmentInput]:
    """The request's garments: one, or two with `garment2` (both with a mask, or neither), each with its word."""
    roles = [("garment", "mask", word)]
    if "garment2" in saved or "mask2" in saved:
        if "garment2" not in saved:
            raise FieldError("mask2 is the second garment's mask: it needs garment2")
        if ("mask" in saved) != ("mask2" in saved):
            raise FieldError("give a mask for both garments (mask and mask2), or for neither")
        try:
            roles.append(("garment2", "mask2", parse_category_word(_text(form, "category2") or word)))
        except UsageError as exc:
            raise FieldError(str(exc)) from None
    garments = []
    for role, mask_role, each in roles:
        path, name = saved[role]
        mask = saved.get(mask_role)
        garments.append(GarmentInput(path, each, mask[0] if mask else None, name, mask[1] if mask else None))
    return garments


def _safe_name(filename: str | None, role: str) -> str:
    """The client's base name, with only harmless characters (it names outputs and appears in metadata)."""
    base = Path((filename or "").replace("\\", "/")).name
    cleaned = "".join(ch if ch.isalnum() or ch in "._- " else "_" for ch in base).strip(" .")
    return cleaned[:120] or f"{role}.png"


def build_spec(form: Any, base: RunConfig, folder: Path, limits: Limits, models: Models) -> JobSpec:
    """Everything checked that can be checked before queueing: fields, then every image of the request (steps 1
    and 2 of the pre-flight: ootd/app/tryon/preflight.py), each garment's `auto` classified (by the classifier of
    `models`, the server's model owner). The job writes what `ootd run --save-intermediates` writes: the mask and
    masked person framed as the results."""
    from ootd.app.tryon.autocategory import resolve_inputs
    from ootd.app.tryon.preflight import plan_inputs

    word, config = parse_settings(form, base, limits)
    saved = save_uploads(form, folder)
    garments = _garments(form, word, saved)
    config = replace(config, output=folder / "results", save_intermediates=True)
    inputs = JobInputs.of(saved["person"][0], garments, person_name=saved["person"][1])
    try:  # the file checks of `ootd run`: not an image, truncated, too small or large, a mask of another aspect
        job = plan_inputs(config, resolve_inputs(inputs, models, config.category_margin))
    except CheckpointError:
        raise
    except OotdError as exc:
        raise BadRequest(client_words(str(exc), saved)) from None
    return JobSpec(job, job.inputs.person.size)


def client_words(message: str, saved: dict[str, tuple[Path, str]]) -> str:
    """A message with the uploads named by the client's file names, never by this server's folders."""
    for path, name in saved.values():
        message = message.replace(str(path), name)
    return message
