"""The contract /openapi.json publishes, completed from what the server enforces: every status each route can
answer with its one error body, the rules of the try-on form, and the links between the job operations.

FastAPI documents the routes' own parameters; the rest happens where FastAPI does not see it: the middleware
(401 without credentials, 421 for a host name this server does not answer to, 403 for another site's page, 413
over the upload limit), the form read by the route itself (forms.py: the rules between its fields, its files'
types; each field's type, bounds and choices are schema.py's, from the settings' declarations), the job queue
(503), the disk (507). This module states them, so that a client generated from the document, or a
property-based client driven by it, meets no answer the document does not list. docs/api.md words the same
contract for people.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.requests import Request
from starlette.routing import Match

from ootd.app.tryon.config import RunConfig
from ootd.imaging.opener import FORMATS
from ootd.serve.forms import FILES, FLAGS, OPTIONAL_FILES
from ootd.serve.limits import Limits, MiB
from ootd.serve.schema import FORM_FAILURES, form_schema
from ootd.serve.worker import CANCELLED, DONE, FAILED, QUEUED, RUNNING
from ootd.settings import OutputSize

ERROR_REF = {"$ref": "#/components/schemas/Error"}
ERROR_SCHEMA = {"type": "object", "required": ["error"], "additionalProperties": False,
                "properties": {"error": {"type": "string", "minLength": 1,
                                         "description": "what went wrong, one line, in the API's words"}}}
STATES = [QUEUED, RUNNING, DONE, FAILED, CANCELLED]
PRESERVATION_REF = {"$ref": "#/components/schemas/Preservation"}
_SHARE = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
# what a finished job's results changed of its photo (docs/preservation.md): `ootd run --json`'s `preservation`
PRESERVATION_SCHEMA = {
    "type": ["object", "null"], "required": ["score", "summary", "review", "results"],
    "description": "what the pictures changed of the person photo, region by region (docs/preservation.md), as "
                   "`ootd run --json` gives it; a picture that could not be measured has its `problem`",
    "properties": {
        "score": {**_SHARE, "description": "the worst picture's: the largest share of a region outside the mask "
                                           "that changed (null: none measured)"},
        "summary": {"type": "string", "description": "`hands 6.1% changed`, or `not measured: why`"},
        "review": {"type": "boolean"},
        "results": {"type": "array", "items": {
            "type": "object", "required": ["result"],
            "properties": {"result": {"type": "string", "description": "the picture's name (`names`)"},
                           "problem": {"type": "string", "description": "why it was not measured"},
                           "size": {"type": "string"}, "seam": {"type": "integer", "minimum": 0},
                           "changed_delta_e": {"type": "number"}, "score": _SHARE, "summary": {"type": "string"},
                           "regions": {"type": "object", "description": "each region's kept and redrawn figures, "
                                       "or {\"absent\": true}"}}}}}}
# the media types of the formats the server decodes (ootd/imaging/opener.py), for the form's file parts
IMAGE_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "AVIF": "image/avif",
               "BMP": "image/bmp", "TIFF": "image/tiff", "GIF": "image/gif", "PPM": "image/x-portable-pixmap"}
# operation ids, for the links and for clients generated from the document
OPERATIONS = {("/api/health", "get"): "health", ("/api/options", "get"): "options",
              ("/api/tryon", "post"): "tryon", ("/api/jobs", "post"): "createJob",
              ("/api/jobs/{job_id}", "get"): "getJob", ("/api/jobs/{job_id}", "delete"): "cancelJob",
              ("/api/jobs/{job_id}/files/{name}", "get"): "getJobFile"}
JOB_GONE = {404: "no such job (finished jobs are kept for a while, then deleted)",
            410: "the job was cancelled by its client (DELETE): it is gone, with its files"}


def _json(schema: dict[str, Any], description: str, **extra: Any) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}, **extra}


def _error(description: str) -> dict[str, Any]:
    return _json(ERROR_REF, description)


def _form(body: dict[str, Any], config: RunConfig, limits: Limits) -> None:
    """The try-on form's schema (schema.py: each field from its declaration) completed in place with what is no one
    field's: the rules between fields, each file part's image types, the upload limit. The fields are put again:
    FastAPI's model of a schema holds bounds as floats, which would publish the seed's as 2^63."""
    schema = body["content"]["multipart/form-data"]["schema"] = form_schema(limits)
    on = sorted(word for word, value in FLAGS.items() if value)
    rules = [
        # an outfit's masks: for both garments or for neither (forms.py `_garments`)
        {"if": {"required": ["garment2", "mask"]}, "then": {"required": ["mask2"]}},
        # the photo itself, at its own size: never at the working size
        {"if": {"required": ["keep_unmasked"], "properties": {"keep_unmasked": {"enum": on}}},
         "then": {"properties": {"output_size": {"not": {"const": OutputSize.WORKING.value}}}}},
    ]
    if not config.photo.keep_unmasked:  # the seam of keep_unmasked: only with it (the server's own, or asked)
        rules.append({"if": {"required": ["feather"]},
                      "then": {"required": ["keep_unmasked"], "properties": {"keep_unmasked": {"enum": on}}}})
    schema["allOf"] = rules
    schema["dependentRequired"] = {"mask2": ["garment2", "mask"]}
    types = ", ".join(IMAGE_TYPES[name] for name in FORMATS)
    body["content"]["multipart/form-data"]["encoding"] = {name: {"contentType": types} for name in FILES}
    body["description"] = (f"at most {limits.max_upload_bytes / MiB:.0f} MiB in all (413 beyond); files: "
                           f"{', '.join(FILES)} ({', '.join(OPTIONAL_FILES)} optional)")


def _links() -> dict[str, dict[str, Any]]:
    by_id = {"job_id": "$response.body#/id"}
    return {"GetJob": {"operationId": "getJob", "parameters": by_id},
            "CancelJob": {"operationId": "cancelJob", "parameters": by_id}}


def _answers(path: str, method: str, auth: bool) -> dict[str, Any]:
    """What a route answers besides FastAPI's own view of it."""
    common = {421: _error("a host name this server does not answer to")}
    if auth:
        common[401] = _error("no or wrong credentials (WWW-Authenticate says how to log in)")
    if method != "get":
        common[403] = _error("a page of another site, not allowed by --allow-origin")
    job = {"type": "object", "required": ["id", "state", "position"],
           "properties": {"id": {"type": "string"}, "state": {"type": "string", "enum": STATES},
                          "position": {"type": "integer", "minimum": 0}}}
    operation = OPERATIONS.get((path, method))
    if operation in ("tryon", "createJob"):
        answers = {**{code: _error(text) for code, text in FORM_FAILURES.items()}}
        if operation == "createJob":
            answers[202] = _json(job, "the job's id and place in line", links=_links())
        else:
            answers[200] = _json({"type": "object", "required": ["images", "names", "seed", "preservation"],
                                  "properties": {"preservation": PRESERVATION_REF}},
                                 "the pictures, as data: URLs, and what they changed of the photo")
        return {**common, **answers}
    if operation == "getJob":
        status = {**job, "required": [*job["required"], "stage", "done", "total"],
                  "properties": {**job["properties"], "preservation": PRESERVATION_REF}}  # once done
        result = {"GetFile": {"operationId": "getJobFile",
                              "parameters": {"job_id": "$response.body#/id", "name": "$response.body#/names/0"}},
                  **_links()}
        return {**common, 200: _json(status, "the job", links=result),
                **{code: _error(text) for code, text in JOB_GONE.items()}}
    if operation == "cancelJob":
        return {**common, 202: _json(job | {"required": ["id", "state"]}, "cancelled: it left the line, or stops "
                                     "at its next step", links={"GetJob": _links()["GetJob"]}),
                **{code: _error(text) for code, text in JOB_GONE.items()}}
    if operation == "getJobFile":
        png = {"image/png": {"schema": {"type": "string", "format": "binary"}}}
        return {**common, 200: {"description": "the PNG", "content": png},
                206: {"description": "the part of the PNG asked for by Range", "content": png},
                400: _error("a malformed Range header"),
                404: _error("no such job, or no such file in it (not finished, or not one of its names)"),
                410: _error(JOB_GONE[410]),
                416: _error("a Range outside the file (Content-Range gives its size)")}
    return common


def document(app: FastAPI, config: RunConfig, limits: Limits, auth: bool) -> dict[str, Any]:
    """The app's OpenAPI document with the whole contract (see the module's docstring)."""
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    doc.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    doc["components"]["schemas"]["Preservation"] = PRESERVATION_SCHEMA
    doc["components"]["schemas"].pop("HTTPValidationError", None)  # FastAPI's; never answered here
    doc["components"]["schemas"].pop("ValidationError", None)
    if auth:
        doc["components"]["securitySchemes"] = {"basic": {"type": "http", "scheme": "basic"},
                                                "bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"basic": []}, {"bearer": []}]
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            operation["operationId"] = OPERATIONS.get((path, method), operation.get("operationId"))
            responses = {code: answer for code, answer in operation.get("responses", {}).items() if code != "422"}
            for code, answer in _answers(path, method, auth).items():
                mine = responses.get(str(code), {})
                examples = mine.get("content", {}).get("application/json", {})
                merged = {**mine, **answer}
                if "example" in examples or "examples" in examples:  # keep the examples schema.py gives
                    media = merged["content"]["application/json"]
                    merged["content"] = {"application/json": {**examples, **media}}
                responses[str(code)] = merged
            operation["responses"] = responses
            if "requestBody" in operation and "multipart/form-data" in operation["requestBody"]["content"]:
                _form(operation["requestBody"], config, limits)
    return doc


def publish(app: FastAPI, config: RunConfig, limits: Limits, auth: bool) -> None:
    """Serve `document` as /openapi.json (made once, on the first request)."""
    made: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if not made:
            made.update(document(app, config, limits, auth))
        return made

    app.openapi = openapi  # type: ignore[method-assign]


def allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Every method some route of this path answers (a 405's Allow header: FastAPI names the first route's)."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match is not Match.NONE and getattr(route, "methods", None):
            methods |= set(route.methods)
    return sorted(methods)

