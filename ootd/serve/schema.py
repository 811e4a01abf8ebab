"""What /openapi.json says about the routes that read their multipart form themselves (to stream it under the
upload limit): the form's fields (its inputs from forms.py, its settings from their declarations: type, bounds,
choices, help; the server's own limits where they are narrower), and an example of each answer."""

from __future__ import annotations

from typing import Any

from ootd.serve.forms import API_SETTINGS, FILES, INPUT_HELP, REQUIRED, api_name
from ootd.serve.limits import Limits

CATEGORY_FIELDS = ("category", "category2")


def _properties(limits: Limits) -> dict[str, Any]:
    properties: dict[str, Any] = {name: {"type": "string", "format": "binary", "description": INPUT_HELP[name]}
                                  for name in FILES}
    properties.update({name: {"type": "string", "description": INPUT_HELP[name]} for name in CATEGORY_FIELDS})
    narrower = {"steps": limits.max_steps, "samples": limits.max_samples}  # what Limits.check_request refuses
    for one in API_SETTINGS:
        field = one.json_schema(lambda name: api_name(name) or name)
        if one.name in narrower:
            field["maximum"] = min(field.get("maximum", narrower[one.name]), narrower[one.name])
        properties[one.name] = field
    return properties


def form_body(limits: Limits | None = None) -> dict[str, Any]:
    """The request body of POST /api/tryon and /api/jobs."""
    schema = {"type": "object", "required": list(REQUIRED), "properties": _properties(limits or Limits())}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


ERROR = {"application/json": {"example": {"error": "person image notes.png: not an image"}}}
RESULT_EXAMPLE = {
    "images": ["http://127.0.0.1:7860/api/jobs/3f2a.../files/person__tshirt__0.png"],
    "names": ["person__tshirt__0.png"], "seed": 42,
    "mask": "http://127.0.0.1:7860/api/jobs/3f2a.../files/person__tshirt__mask.png",
    "masked_person": "http://127.0.0.1:7860/api/jobs/3f2a.../files/person__tshirt__masked_person.png",
    "person_mask": "http://127.0.0.1:7860/api/jobs/3f2a.../files/person__tshirt__mask_editable.png",
    "model_type": "hd",
    "timings": {"queue": 0.01, "run": 41.2, "total": 41.21, "denoise": 37.5, "decode": 2.1},
    "settings": {"model_type": "hd", "category": "upper", "samples": 1, "steps": 20, "scale": 2.0, "seed": 42,
                 "resolution": "768x1024", "scheduler": "unipc", "fit": "pad", "mask": "auto"},
}
FAILURES = {
    400: {"description": "an upload is not a usable image, no person found, an impossible combination, or a "
                         "setting this server cannot run (a precision or attention backend its hardware lacks)",
          "content": ERROR},
    413: {"description": "the request is larger than the server's upload limit", "content": ERROR},
    422: {"description": "a field is missing, unknown, out of range or over the server's limits", "content": ERROR},
    503: {"description": "busy (Retry-After), stopping, out of memory, or models that cannot load here",
          "content": ERROR},
    507: {"description": "the server's disk is full: nothing of the request was kept; the same request works once "
                         "space is freed", "content": ERROR},
}


def tryon_docs(limits: Limits | None = None) -> dict[str, Any]:
    inline = {**RESULT_EXAMPLE, "images": ["data:image/png;base64,iVBORw0KGgo..."], "mask": "data:image/png;...",
              "masked_person": "data:image/png;...", "person_mask": "data:image/png;..."}
    return {"openapi_extra": form_body(limits), "summary": "Try a garment on a person; answered when done",
            "responses": {200: {"description": "the pictures, as data: URLs",
                                "content": {"application/json": {"example": inline}}}, **FAILURES}}


def jobs_docs(limits: Limits | None = None) -> dict[str, Any]:
    return {"openapi_extra": form_body(limits), "summary": "The same try-on, answered at once with a job to follow",
            "responses": {202: {"description": "the job's id and place in line", "content": {"application/json": {
                "example": {"id": "3f2a...", "state": "queued", "position": 1}}}}, **FAILURES}}


def job_docs() -> dict[str, Any]:
    running = {"id": "3f2a...", "state": "running", "position": 0, "stage": "denoise", "done": 7, "total": 20}
    return {"summary": "Where a job stands; its result (file URLs) when done, its error when failed",
            "responses": {200: {"description": "the job", "content": {"application/json": {"examples": {
                "running": {"value": running},
                "done": {"value": {**running, "state": "done", "done": 20, **RESULT_EXAMPLE}},
                "failed": {"value": {**running, "state": "failed", "status": 400, "needs_mask": True,
                                     "error": "no person detected in person.png (...)"}},
            }}}}, 404: {"description": "no such job (finished jobs are kept for a while)", "content": ERROR}}}
