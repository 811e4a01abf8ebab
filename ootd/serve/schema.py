"""What /openapi.json says about the routes that read their multipart form themselves (to stream it under the
upload limit): the one place that builds the form's schema, and an example of each answer.

The form's fields are its inputs (forms.py: files, categories) and the settings a request may give, each from its
declaration (`Setting.json_schema()`: type, bounds, choices, help), narrowed by this server's own limits where they
are narrower (--max-steps, --max-samples), a switch in the words the form takes. contract.py adds what is no one
field's: the rules between fields, the file parts' media types, the upload limit, the statuses.
"""

from __future__ import annotations

from typing import Any

from ootd.app.tryon.settings import Setting
from ootd.serve import forms
from ootd.serve.forms import FILES, FLAGS, INPUT_HELP, REQUIRED, api_name
from ootd.serve.limits import Limits
from ootd.settings import AUTO_CATEGORY, Category

CATEGORY_FIELDS = ("category", "category2")
CATEGORY_WORDS = [*(c.value for c in Category), AUTO_CATEGORY, ""]  # empty: auto (category2: the first's word)


def setting_field(setting: Setting, limits: Limits) -> dict[str, Any]:
    """A setting's form field: its declaration as JSON Schema, in the form's words (a switch takes FLAGS' words),
    within this server's limits (what `Limits.check_request` refuses)."""
    field = setting.json_schema(lambda name: api_name(name) or name)
    if setting.kind is bool:
        field.update(type="string", enum=sorted(FLAGS))
    narrower = {"steps": limits.max_steps, "samples": limits.max_samples}.get(setting.name)
    if narrower is not None:
        field["maximum"] = min(field.get("maximum", narrower), narrower)
    return field


def form_schema(limits: Limits) -> dict[str, Any]:
    """The try-on form: every field it takes, no other, none twice (forms.py refuses the rest with a 422)."""
    properties: dict[str, Any] = {name: {"type": "string", "format": "binary", "description": INPUT_HELP[name]}
                                  for name in FILES}
    properties.update({name: {"type": "string", "enum": CATEGORY_WORDS, "description": INPUT_HELP[name]}
                       for name in CATEGORY_FIELDS})
    properties.update({one.name: setting_field(one, limits) for one in forms.API_SETTINGS})  # as the app is built
    return {"type": "object", "required": list(REQUIRED), "properties": properties, "additionalProperties": False,
            "maxProperties": len(properties)}


def form_body(limits: Limits | None = None) -> dict[str, Any]:
    """The request body of POST /api/tryon and /api/jobs."""
    schema = form_schema(limits or Limits())
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
    "preservation": {"score": 0.002, "summary": "face 0.2% changed", "review": False, "results": [
        {"result": "person__tshirt__0.png", "size": "768x1024", "seam": 8, "changed_delta_e": 10.0, "score": 0.002,
         "summary": "face 0.2% changed", "regions": {"face": {"absent": False, "pixels": 20480, "kept": {
             "pixels": 19000, "share": 0.024, "ssim": 0.97, "delta_e": 1.1, "changed": 0.002}, "redrawn": {
             "pixels": 0, "share": 0.0, "ssim": None, "delta_e": None, "changed": None}}, "legs": {"absent": True}}}]},
}
# what the try-on form's routes answer with an error, in the document's words (contract.py publishes them)
FORM_FAILURES = {
    400: "a body that is not well-formed multipart, an upload that is not a usable image (not decodable, too "
         "small or too large, a mask of another shape), no person found, or an impossible combination (the hd "
         "model with a lower-body garment, an outfit of two garments of one kind, `auto` unsure of the garment), "
         "what the pictures contain, which no schema states; or a setting this server cannot run (a device, "
         "precision or extra its machine lacks: no use retrying)",
    413: "the request is larger than the server's upload limit",
    415: "the body is not multipart/form-data",
    422: "a field is missing, unknown, repeated past the form's size, not of its type, out of range, or not "
         "allowed with another field (what this document's form schema says)",
    503: "busy (Retry-After: seconds), stopping, out of memory, or models that cannot load here",
    507: "the server's disk is full: nothing of the request was kept; the same request works once space is freed",
}
FAILURES = {code: {"description": text, "content": ERROR} for code, text in FORM_FAILURES.items()}


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
