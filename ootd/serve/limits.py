"""What a client may send: the upload size (enforced while the body streams in), the queue length and who may ask.

Both guards are plain ASGI middleware, so they act before any route reads a byte of the body: a request whose
Content-Length is over the limit is answered 413 at once, and one that streams past the limit (chunked, or a
lying Content-Length) is cut off at the limit, never buffered whole.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from ootd.errors import UsageError
from ootd.settings import MAX_SAMPLES, MAX_STEPS

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MiB = 2**20


@dataclass(frozen=True)
class Limits:
    """Per-server limits (and how much it keeps). 20 MiB of upload holds any sane photo, far below the
    50-megapixel decode guard. Steps and samples are bounded per request so that one anonymous request cannot
    hold a shared device for long: 50 steps is 2.5x the released models' default and past the point where more
    steps change the picture; 4 samples is what the original demo offers."""

    max_upload_bytes: int = 20 * MiB  # a whole request body: person + garment + mask + fields
    max_queue: int = 8  # requests waiting behind the running one; more get 503 + Retry-After
    keep_jobs: int = 32  # finished jobs whose results stay downloadable; older ones are deleted
    one_model: bool = False  # hold one model type at a time (switching hd <-> dc reloads) instead of both
    max_steps: int = 50  # denoising steps one request may ask for
    max_samples: int = 4  # pictures one request may ask for

    def validate(self) -> None:
        if self.max_upload_bytes < 64 * 1024:
            raise UsageError(f"the upload limit must be at least 64 KiB, got {self.max_upload_bytes} bytes")
        if self.max_queue < 1:
            raise UsageError(f"the queue length must be at least 1, got {self.max_queue}")
        if self.keep_jobs < 1:
            raise UsageError(f"the number of kept results must be at least 1, got {self.keep_jobs}")
        if self.max_steps < 1:
            raise UsageError(f"--max-steps must be at least 1, got {self.max_steps}")
        if self.max_samples < 1:
            raise UsageError(f"--max-samples must be at least 1, got {self.max_samples}")

    def check_defaults(self, steps: int, samples: int) -> None:
        """The server's own defaults (--steps, --samples) within what it lets a request ask for."""
        if steps > self.max_steps:
            raise UsageError(f"--steps {steps} is over --max-steps {self.max_steps}: lower one or raise the other")
        if samples > self.max_samples:
            raise UsageError(f"--samples {samples} is over --max-samples {self.max_samples}: lower one or raise "
                             "the other")

    def bound(self, field: str) -> tuple[int, str]:
        """The largest `steps` or `samples` a request may ask for here, and whose bound that is (the server's
        when lower than what a call may ask for anywhere)."""
        mine, anywhere = {"steps": (self.max_steps, MAX_STEPS), "samples": (self.max_samples, MAX_SAMPLES)}[field]
        return (mine, " (this server's limit)") if mine < anywhere else (anywhere, "")

    def out_of_range(self, field: str, value: int | None) -> str | None:
        """The one message for a `steps` or `samples` outside 1 to the bound that applies; None when within."""
        top, whose = self.bound(field)
        if value is None or 1 <= value <= top:
            return None
        return f"{field} must be between 1 and {top}{whose}, got {value}"

    def check_request(self, steps: int, samples: int) -> str | None:
        """What a request asks for beyond this server's limits, as a message; None when within them."""
        return self.out_of_range("steps", steps) or self.out_of_range("samples", samples)


class RequestTooLarge(Exception):
    """Raised from `receive` when a body streams past the limit; the middleware turns it into a 413."""


async def send_json(send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


def too_large_message(limit: int) -> str:
    return f"request too large: the limit is {limit / MiB:.0f} MiB for all files together"


class HttpMiddleware:
    """An ASGI middleware that acts on HTTP requests (`http`); every other scope (lifespan, websocket) passes
    through to `app` untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class BodyLimit(HttpMiddleware):
    """413 for bodies over `limit` bytes: from Content-Length before reading, or while streaming."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        super().__init__(app)
        self.limit = limit

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await send_json(send, 413, {"error": too_large_message(self.limit)}, {"connection": "close"})
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise RequestTooLarge
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except RequestTooLarge:
            if not started:
                await send_json(send, 413, {"error": too_large_message(self.limit)}, {"connection": "close"})


@dataclass(frozen=True)
class Auth:
    """`user:password` (HTTP Basic) or a bare token (`Authorization: Bearer TOKEN`, or as the Basic password
    with any user name, so a browser's login prompt works with a token too)."""

    user: str | None
    secret: str

    @classmethod
    def parse(cls, value: str) -> Auth:
        text = value.strip()
        user, sep, password = text.partition(":")
        if sep and (not user or not password):
            raise UsageError("--auth must be USER:PASSWORD or a token, with no empty part")
        if not text:
            raise UsageError("--auth must not be empty")
        return cls(user, password) if sep else cls(None, text)

    def allows(self, header: str | None) -> bool:
        if not header:
            return False
        scheme, _, credentials = header.partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer" and self.user is None:
            return secrets.compare_digest(credentials.strip().encode(), self.secret.encode())
        if scheme != "basic":
            return False
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, _, password = decoded.partition(":")
        user_ok = self.user is None or secrets.compare_digest(user.encode(), self.user.encode())
        return user_ok & secrets.compare_digest(password.encode(), self.secret.encode())


class RequireAuth(HttpMiddleware):
    """401 (with a Basic challenge, so browsers prompt) for any request without the right credentials."""

    def __init__(self, app: ASGIApp, auth: Auth) -> None:
        super().__init__(app)
        self.auth = auth

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.auth.allows(header(scope, b"authorization")):
            await send_json(send, 401, {"error": "authentication required"},
                            {"www-authenticate": 'Basic realm="ootd", charset="UTF-8"'})
            return
        await self.app(scope, receive, send)


def header(scope: Scope, name: bytes) -> str | None:
    """One request header's value (the first of that name), or None."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None
