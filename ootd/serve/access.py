"""One line per request, as uvicorn's access log writes it, with the time the answer took:

    INFO:     127.0.0.1:53124 - "POST /api/jobs HTTP/1.1" 202 Accepted 41 ms

A client that left before its answer shows as 499 (nginx's "client closed request"). The lines go to the
`ootd.serve.access` logger; `ootd serve` prints them on the console (not with -q). uvicorn's own access log is off:
its lines carry no time, and this one also counts what the middleware outside the app answers (413, 421, 401).
"""

from __future__ import annotations

import logging
import sys
import time
from http import HTTPStatus

from ootd.errors import escaped
from ootd.serve.limits import HttpMiddleware, Message, Receive, Scope, Send

logger = logging.getLogger("ootd.serve.access")

CLIENT_GONE = 499


def phrase(status: int) -> str:
    if status == CLIENT_GONE:
        return "Client Closed Request"
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class AccessLog(HttpMiddleware):
    """Logs each HTTP request once it is answered (or fails): client, request line, status, milliseconds."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        status = 500  # what the server answers when the app fails before starting a response

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            if logger.isEnabledFor(logging.INFO):
                logger.info(request_line(scope, status, time.perf_counter() - start))


def request_line(scope: Scope, status: int, seconds: float) -> str:
    client = scope.get("client")
    who = f"{client[0]}:{client[1]}" if client else "-"
    path = scope.get("root_path", "") + scope.get("path", "")
    query = scope.get("query_string", b"")
    if query:
        path += "?" + query.decode("latin-1")
    return (f'{who} - "{scope.get("method", "-")} {escaped(path)} HTTP/{scope.get("http_version", "1.1")}" '
            f"{status} {phrase(status)} {seconds * 1000:.0f} ms")  # the path percent-decoded: a %0A stays \\n


def console_access_log() -> logging.Handler:
    """Print the access lines on stderr with uvicorn's `INFO:     ` prefix (remove the handler to stop)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler
