"""Which web pages may drive this server: the host names it answers to, and the other sites that may post to it.

A browser lets any web page send requests to a server on the user's own machine. Two guards stop that:

- Host: a page on `evil.example` whose name is made to point at 127.0.0.1 (DNS rebinding) reaches a loopback
  server as if it were its own site, but its requests carry `Host: evil.example`. Requests for a host name this
  server does not answer to are refused (421). It answers to the address it listens on (loopback: also
  `localhost`; every address: also any IP address and this machine's name) and to the names given with
  `--allow-host` (`*`: any, for a proxy that checks names itself). A request without Host is no browser's.
- Origin: a page on another site may post a form (`POST /api/jobs`) without asking first. Requests that change
  something (any method but GET, HEAD, OPTIONS) from a page of another origin are refused (403) unless
  `--allow-origin` names it (`*`: any); the page's own origin (scheme, the Host it was loaded from) is always
  allowed. Without an Origin header, `Sec-Fetch-Site: cross-site|same-site` is refused the same way; a request
  with neither (curl, scripts) is not a browser's and passes. Allowed origins also get CORS headers (starlette's
  CORSMiddleware, added by the app), so their pages can read the answers.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from ootd.errors import UsageError
from ootd.serve.limits import ASGIApp, HttpMiddleware, Receive, Scope, Send, header, send_json

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ANY = "*"


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return None


def host_name(value: str) -> str:
    """`Example.COM:7860` -> `example.com`, `[::1]:7860` -> `::1`: the name a Host header or address names."""
    text = value.strip().lower()
    if text.startswith("["):
        return text[1:].split("]", 1)[0]
    if text.count(":") == 1:
        text = text.split(":", 1)[0]
    return text.rstrip(".")


def parse_origin(value: str) -> str:
    """An `--allow-origin` value: `scheme://host[:port]` (lower case, no path), or `*`."""
    text = value.strip()
    if text == ANY:
        return ANY
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment or parts.username:
        raise UsageError(f"--allow-origin {value!r}: give an origin such as https://shop.example or "
                         "http://localhost:3000 (scheme, host and port only), or * for any")
    return f"{parts.scheme}://{parts.netloc.lower()}"


def parse_host(value: str) -> str:
    """An `--allow-host` value: a host name or address (no scheme, no port needed), or `*`."""
    text = value.strip()
    if text == ANY:
        return ANY
    name = host_name(text)
    if not name or "/" in text or any(ch.isspace() for ch in name):
        raise UsageError(f"--allow-host {value!r}: give a host name such as tryon.example or an address")
    return name


@dataclass(frozen=True)
class Access:
    """The host names this server answers to and the other origins allowed to change things."""

    hosts: frozenset[str] = frozenset({"127.0.0.1", "localhost", "::1"})
    any_address: bool = False  # listening on every address: any IP address in Host is fine
    origins: frozenset[str] = frozenset()

    @classmethod
    def for_address(cls, listen: str, allow_hosts: Iterable[str] = (), allow_origins: Iterable[str] = ()) -> Access:
        """The names a server listening on `listen` answers to, plus the allowed ones."""
        name = host_name(listen) if listen.strip() else ""
        address = _ip(name)
        wildcard = name in ("", "0.0.0.0", "::")
        hosts = {*(parse_host(h) for h in allow_hosts), name}
        if wildcard or (address is not None and address.is_loopback) or name == "localhost":
            hosts |= {"127.0.0.1", "localhost", "::1"}
        if wildcard:
            hosts.add(socket.gethostname().lower())
        hosts.discard("")
        return cls(frozenset(hosts), wildcard, frozenset(parse_origin(o) for o in allow_origins))

    def allows_host(self, host: str | None) -> bool:
        if host is None or ANY in self.hosts:
            return True
        name = host_name(host)
        return name in self.hosts or (self.any_address and _ip(name) is not None)

    def allows_origin(self, origin: str, host: str | None) -> bool:
        """The page's own origin (same host and port as the request), or one allowed by --allow-origin."""
        text = origin.strip().lower()
        if text == "null":  # sandboxed frames, local files: no origin to trust
            return False
        if ANY in self.origins or text in self.origins:
            return True
        parts = urlsplit(text)
        return host is not None and parts.scheme in ("http", "https") and parts.netloc == host.strip().lower()

    def hint(self) -> str:
        names = sorted(self.hosts - {ANY})
        return ", ".join(names[:4]) + (" or any IP address" if self.any_address else "")


class BrowserGuard(HttpMiddleware):
    """421 for a Host this server does not answer to; 403 for a state-changing request from another site."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        super().__init__(app)
        self.access = access

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = header(scope, b"host")
        if not self.access.allows_host(host):
            await send_json(send, 421, {"error": (
                f"this server does not answer to the host name {host_name(host or '')!r} (a page of another "
                f"site may be trying to reach it): open it as {self.access.hint()}, or start it with "
                "--allow-host NAME")})
            return
        if scope["method"] not in SAFE_METHODS:
            origin = header(scope, b"origin")
            fetch_site = (header(scope, b"sec-fetch-site") or "").lower()
            if origin is not None:
                refused = not self.access.allows_origin(origin, host)
            else:
                refused = fetch_site in ("cross-site", "same-site")
            if refused:
                who = origin or f"a {fetch_site} page"
                await send_json(send, 403, {"error": (
                    f"refused: {who} may not send requests that change things to this server; start it with "
                    "--allow-origin ORIGIN to allow another site")})
                return
        await self.app(scope, receive, send)
