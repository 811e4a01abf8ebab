"""A multipart try-on request -> a JobSpec, with each problem as one line and its HTTP status.

The form's setting fields are the settings declared as offered by the API (ootd/app/tryon/settings.py), each read
as its declared type and applied over the server's config by `update_config`; its other fields are the request's
inputs (files, categories). Errors are worded in the API's terms (`api_name`: the form's fields).

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

from ootd.app.tryon.config import RunConfig, update_config
from ootd.app.tryon.declaration import FLAG_WORDS
from ootd.app.tryon.inputs import GarmentInput, JobInputs
from ootd.app.tryon.settings import API, SETTINGS, Setting
from ootd.errors import CheckpointError, OotdError, UsageError, worded
from ootd.imaging.atomic import write_atomic
from ootd.serve.limits import Limits
from ootd.serve.service import JobSpec
from ootd.settings import AUTO_CATEGORY, Category, CategoryWord, parse_category_word

if TYPE_CHECKING:
    from ootd.models import Models

FILES = ("person", "garment", "mask", "garment2", "mask2")
OPTIONAL_FILES = ("mask", "garment2", "mask2")
API_SETTINGS: tuple[Setting, ...] = tuple(SETTINGS.offered_by(API))  # the settings a request may give
TEXT_FIELDS = ("category", "category2", *(one.name for one in API_SETTINGS))
FLAGS = FLAG_WORDS  # the words a switch field takes (the declarations')
REQUIRED = ("person", "garment", "category")
# what each input field of the form means (the OpenAPI schema's descriptions; a setting's is its declared help)
INPUT_HELP = {
    "person": "photo of the person (PNG, JPEG, WebP...)",
    "garment": "photo of the garment",
    "mask": "optional mask, white = repaint, the person photo's shape: skips pose and parsing",
    "garment2": "optional second garment: an outfit (one upper and one lower garment; the lower is tried on first)",
    "mask2": "optional mask of the second garment (with a mask of the first)",
    "category2": "the second garment's category (default: the first's word, e.g. auto)",
    "category": "upper, lower or dress (or the aliases of ootd run), or auto: classified from the garment photo "
                "(empty: auto)",
}
# what the library's messages point to, in the API's words
TERMS = {"automatic_mask": "the `person_mask` of an earlier answer"}


def api_name(name: str) -> str | None:
    """The API's word for a setting or input a message names: its form field (`steps`); None where a request
    cannot give it (the server's own settings)."""
    if name in FILES or name in TEXT_FIELDS:
        return f"`{name}`"
    return TERMS.get(name)


class FieldError(UsageError):
    """A field is missing or has a bad value (HTTP 422)."""


class BadRequest(OotdError):
    """Unusable upload or impossible combination (HTTP 400)."""


def _text(form: Any, name: str) -> str | None:
    value = form.get(name)
    if isinstance(value, UploadFile):
        raise FieldError(f"{name} must be a form field, not a file")
    return None if value is None or not value.strip() else value.strip()


def _word(form: Any, setting: Setting) -> Any:
    """A setting's field as its declared type (None: absent)."""
    name, kind = setting.name, setting.kind
    value = _text(form, name)
    if value is None or kind not in (int, float, bool):
        return value
    if kind is bool:
        if value.lower() not in FLAGS:
            raise FieldError(f"{name} must be true or false, got {value!r}")
        return FLAGS[value.lower()]
    try:
        return kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise FieldError(f"{name} must be {what}, got {value!r}") from None


def parse_settings(form: Any, base: RunConfig, limits: Limits) -> tuple[CategoryWord, RunConfig]:
    """The category and this request's config: the server's config with the request's settings on top, within
    the server's limits. An absent seed means a fresh random one."""
    unknown = sorted(set(form.keys()) - set(TEXT_FIELDS) - set(FILES))
    if unknown:
        raise FieldError(f"unknown field {unknown[0]!r}: use {', '.join(FILES + TEXT_FIELDS)}")
    if form.get("category") is None:
        raise FieldError(f"category is required: {', '.join(c.value for c in Category)} or {AUTO_CATEGORY}")
    words = _text(form, "category") or AUTO_CATEGORY  # empty: auto, as a batch row's empty category
    try:
        category = parse_category_word(words)
        given = {one.name: _word(form, one) for one in API_SETTINGS}
        for name in ("steps", "samples"):  # the bound that applies here, in one message whichever it is
            beyond = limits.out_of_range(name, given[name])
            if beyond is not None:
                raise FieldError(beyond)
        config = update_config(base, given)
    except FieldError:
        raise
    except UsageError as exc:
        raise FieldError(worded(exc, api_name)) from None
    beyond = limits.check_request(config.sampling.steps, config.sampling.num_samples)
    if beyond is not None:
        raise FieldError(beyond)
    try:
        if category != AUTO_CATEGORY:  # `auto`: checked once the garment is classified (build_spec)
            config.model_type_for(category)
    except UsageError as exc:
        raise BadRequest(worded(exc, api_name)) from None
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
            raise FieldError(worded(exc, api_name)) from None
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
        raise BadRequest(client_words(worded(exc, api_name), saved)) from None
    return JobSpec(job, job.inputs.person.size, inputs)


def client_words(message: str, saved: dict[str, tuple[Path, str]]) -> str:
    """A message with the uploads named by the client's file names, never by this server's folders."""
    for path, name in saved.values():
        message = message.replace(str(path), name)
    return message
