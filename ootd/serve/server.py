"""Running the app: who may listen where, the per-process temporary folder, the socket and uvicorn.

Safe by default: 127.0.0.1 only. Any other address needs --auth (or an explicit --insecure-no-auth, for a
trusted network or a proxy that authenticates). The temporary folder holds every upload and result of this
process and is removed when the server stops (also on Ctrl-C).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.loader import check_checkpoints_present
from ootd.errors import OotdError, UsageError
from ootd.serve.limits import Auth, Limits
from ootd.serve.workspace import Workspace, remove_dead

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, auth: Auth | None, insecure_no_auth: bool) -> None:
    """Refuse to answer strangers without a password unless told twice."""
    if auth is None and not insecure_no_auth and not is_loopback(host):
        raise UsageError(
            f"--host {host} lets other machines in: add --auth USER:PASSWORD (or --auth TOKEN), "
            "or --insecure-no-auth if something in front of this server authenticates"
        )


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, opened here so a busy port is one clear line (and port 0 picks a free one)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"cannot listen on {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OotdError(f"cannot listen on {host}:{port}: {exc.strerror}; pass another --port") from None
    sock.listen(64)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


@contextmanager
def workspace() -> Iterator[Path]:
    """This process's temporary folder for uploads and results, removed afterwards whatever happens; the
    folders of servers that were killed (kill -9, a crash) are removed first."""
    remove_dead()
    folder = Workspace()
    try:
        yield folder.path
    finally:
        folder.close()


def make_server(app: Any) -> Any:
    """A uvicorn server for `app` (its access log off: the page polls several times a second)."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                            lifespan="on")
    return uvicorn.Server(config)


def serve(config: RunConfig, host: str, port: int, limits: Limits, auth: Auth | None = None,
          insecure_no_auth: bool = False, announce: Callable[[str], None] = print) -> None:
    """Serve the page and the API until interrupted."""
    from ootd.serve.app import create_app

    check_exposure(host, auth, insecure_no_auth)
    limits.validate()
    check_checkpoints_present(config.checkpoints, [], need_preprocess=False)  # the folder; files on first use
    sock = bind(host, port)
    with workspace() as workdir:
        app = create_app(config, workdir, limits, auth)
        server = make_server(app)
        login = "" if auth is None else " (log in with the --auth credentials)"
        announce(f"ootd serve: open {url_of(sock)}{login}; models load on the first request; Ctrl-C stops")
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:  # uvicorn shuts down gracefully, then passes Ctrl-C on: the normal way to stop
            pass
        finally:
            sock.close()
    announce("ootd serve: stopped")
