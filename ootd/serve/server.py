"""Running the app: who may listen where, the per-process temporary folder, the socket, uvicorn, and stopping.

Safe by default: 127.0.0.1 only. Any other address needs --auth (or an explicit --insecure-no-auth, for a
trusted network or a proxy that authenticates). Host names and other sites' pages: origins.py. The temporary
folder holds every upload and result of this process and is removed when the server stops.

Stopping (SIGTERM, SIGINT, Ctrl-C): the signal stops the listening socket, fails the jobs waiting in line and
cancels the running one at its next step (the worker, from the signal, before uvicorn waits for connections),
so clients that wait get a JSON 503 at once; then the worker thread ends, the folder goes, the process exits 0.
A stage with no step to stop at (a model still loading) is given `STOP_S`; after that the process exits anyway,
folder removed, rather than leave a thread inside torch while the interpreter shuts down.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from ootd.app.signals import sigterm_as_interrupt
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.loader import check_checkpoints_present
from ootd.errors import OotdError, UsageError
from ootd.serve.limits import Auth, Limits
from ootd.serve.origins import Access
from ootd.serve.workspace import Workspace, remove_dead

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860
STOP_S = 10.0  # how long a stopping server waits for the running job to reach a step


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


@contextmanager
def _started(engine: Callable[[], AbstractContextManager[Any]] | None) -> Iterator[Any]:
    """The other engine, started with SIGTERM raising as Ctrl-C does (so a stop while it starts cleans up)."""
    if engine is None:
        yield None
        return
    with sigterm_as_interrupt():
        context = engine()
        backend = context.__enter__()
    try:
        yield backend
    except BaseException:
        if not context.__exit__(*sys.exc_info()):
            raise
    else:
        context.__exit__(None, None, None)


def make_server(app: Any, on_ready: Callable[[], None] | None = None) -> Any:
    """A uvicorn server for `app` whose stop signal also stops the app's worker (app.state.worker) at once;
    `on_ready` runs once it answers (and a signal stops it the normal way). uvicorn's access log is off:
    ootd/serve/access.py writes one with times."""
    import uvicorn

    worker = app.state.worker

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if on_ready is not None and not self.should_exit:
                on_ready()

        def handle_exit(self, sig: int, frame: Any) -> None:
            # from a signal handler: the worker's lock may be held by the interrupted code, so not here
            threading.Thread(target=worker.shutdown, name="ootd-stop", daemon=True).start()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                            lifespan="on")
    return Server(config)


def serve(config: RunConfig, host: str, port: int, limits: Limits, auth: Auth | None = None,
          insecure_no_auth: bool = False, access: Access | None = None, access_log: bool = True,
          announce: Callable[[str], None] = print,
          engine: Callable[[], AbstractContextManager[Any]] | None = None) -> None:
    """Serve the page and the API until stopped (SIGTERM, SIGINT); see the module's docstring. `engine`: a
    context that starts another engine and yields its `service` and `worker` for the app (ray_engine.py), and
    stops it on the way out (after the app's worker, before the temporary folder goes)."""
    from ootd.serve.access import console_access_log
    from ootd.serve.access import logger as access_logger
    from ootd.serve.app import create_app

    check_exposure(host, auth, insecure_no_auth)
    limits.validate()
    limits.check_defaults(config.sampling.steps, config.sampling.num_samples)
    access = access or Access.for_address(host)
    check_checkpoints_present(config.checkpoints, [], need_preprocess=False)  # the folder; files on first use
    sock = bind(host, port)
    handler = console_access_log() if access_log else None
    with workspace() as workdir, _started(engine) as backend:
        app = create_app(config, workdir, limits, auth, access=access, engine=backend)
        login = "" if auth is None else " (log in with the --auth credentials)"
        server = make_server(app, on_ready=lambda: announce(
            f"ootd serve: open {url_of(sock)}{login}; models load on the first request; Ctrl-C stops"))
        worker = app.state.worker
        try:
            with sigterm_as_interrupt():  # what uvicorn passes on after stopping, SIGTERM too, ends here
                server.run(sockets=[sock])
        except KeyboardInterrupt:  # the normal way to stop
            pass
        finally:
            sock.close()
            stuck = worker.running()
            stopped = worker.stop(STOP_S)
    if handler is not None:
        access_logger.removeHandler(handler)
    if not stopped:  # a thread still inside torch: exiting normally could abort in its destructors
        logger.warning("the running request (%s) did not stop within %.0f s of the signal; exiting without it",
                       stuck.stage if stuck is not None and stuck.stage else "starting", STOP_S)
        announce("ootd serve: stopped")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    announce("ootd serve: stopped")
