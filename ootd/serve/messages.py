"""Every failure -> an HTTP status and one line for the client, worded for a web page or a program, never naming
this server's files.

Statuses: 400 unusable image, impossible combination or a setting this server cannot run (UnsupportedError, exit 3
in the CLI: retrying cannot help), 413 too large, 422 bad field, 503 busy (Retry-After), stopping, out of memory or
models that cannot load, 507 the server's disk is full (nothing of the request is kept; the same request works once
space is freed); 500 only for a fault of the server itself.

The library's errors name the settings and inputs they are about, not a front end's words for them; `classify`
words each in the API's terms (`forms.api_name`: the form's fields), and `for_client` replaces every absolute path
by its last part (the checkpoints folder by `<checkpoints>`): a client learns what went wrong, not where this
server keeps its files. The server's log keeps the full message.
"""

from __future__ import annotations

import re

from fastapi.responses import JSONResponse

from ootd.app.console import one_line
from ootd.app.signals import as_no_space
from ootd.errors import (
    CheckpointError,
    DeviceError,
    InputImageError,
    NoPersonError,
    NoSpaceError,
    OotdError,
    UnsupportedError,
    UsageError,
    worded,
)
from ootd.serve.forms import BadRequest, FieldError, api_name
from ootd.serve.worker import QueueFull, ReplicaLost, ShuttingDown

OOM_HINT = "try resolution 384x512 or fewer samples"
# absolute POSIX paths (not inside a URL or a word) and Windows drive paths
_PATH = re.compile(r"(?<![\w.:/>~-])~?/(?:[^\s/'\"`(),;]+/?)+|\b[A-Za-z]:\\[^\s'\"`(),;]+")


def for_client(message: str, roots: dict[str, str] | None = None) -> str:
    """One line for a client, without server paths (`roots`: path -> what to call it, replaced first, e.g. the
    checkpoints folder -> `<checkpoints>`)."""
    text = one_line(message)
    for path, name in sorted((roots or {}).items(), key=lambda item: -len(item[0])):
        if path:
            text = text.replace(path, name)
    return _PATH.sub(lambda match: re.split(r"[\\/]", match.group().rstrip("/\\"))[-1] or "<path>", text)


def classify(exc: BaseException, roots: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    """An exception -> (HTTP status, one line for the client, extra headers)."""
    status, message, headers = _classify(exc)
    return status, for_client(message, roots), headers


def _classify(exc: BaseException) -> tuple[int, str, dict[str, str]]:
    message = worded(exc, api_name)
    if isinstance(exc, QueueFull):
        return 503, message, {"Retry-After": str(exc.retry_after)}
    if isinstance(exc, FieldError):
        return 422, message, {}
    if isinstance(exc, BadRequest | InputImageError | NoPersonError | UsageError):
        return 400, message, {}
    if isinstance(exc, ReplicaLost):
        return 503, message, {"Retry-After": str(exc.retry_after)}
    if isinstance(exc, ShuttingDown):
        return 503, message, {"Retry-After": "5"}
    if isinstance(exc, UnsupportedError):
        return 400, f"this server cannot run that: {message}", {}
    if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in message.lower():
        return 503, f"out of memory: {one_line(message)[:200]}; {OOM_HINT}", {}
    if isinstance(exc, CheckpointError | DeviceError):
        return 503, f"the server cannot run this model: {message}", {}
    if isinstance(exc, NoSpaceError):
        return 507, message, {}
    if isinstance(exc, OSError) and (full := as_no_space(exc)) is not None:  # a library's own write (a folder)
        return 507, str(full), {}
    if isinstance(exc, OotdError):
        return 500, message, {}
    return 500, f"internal error: {type(exc).__name__}: {one_line(exc)[:300]} (details in the server log)", {}


def error_response(exc: BaseException, roots: dict[str, str] | None = None) -> JSONResponse:
    status, message, headers = classify(exc, roots)
    return JSONResponse({"error": message}, status_code=status, headers=headers)
