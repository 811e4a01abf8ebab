"""A live `ootd serve` app on 127.0.0.1 for tests: a real socket on a free port, in a thread of the test process
(so tests can hand in preloaded or instrumented pipelines), stopped and cleaned up afterwards."""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ootd.settings import ModelType


@dataclass
class Live:
    url: str
    workdir: Path
    app: Any


@contextmanager
def live_server(config: Any, limits: Any = None, auth: Any = None, models: Any = None,
                access: Any = None, ray: Any = None) -> Iterator[Live]:
    """`ray`: a running Ray Serve deployment (ray_deployment) to send the try-ons to, instead of this process's
    pipelines."""
    from ootd.serve.app import create_app
    from ootd.serve.server import bind, make_server, url_of, workspace

    sock = bind("127.0.0.1", 0)
    with workspace() as workdir:
        engine = ray.engine((limits or _default_limits()).keep_jobs) if ray is not None else None
        app = create_app(config, workdir, limits, auth, models, engine=engine,
                         **({"access": access} if access else {}))
        server = make_server(app)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        try:
            yield Live(url_of(sock), workdir, app)
        finally:
            server.should_exit = True
            thread.join(20)
            sock.close()
    assert not thread.is_alive(), "the server did not stop"
    assert not workdir.exists(), "the temporary folder was not removed"


MEMORY_MONITOR = "RAY_memory_monitor_refresh_ms"


def _default_limits() -> Any:
    from ootd.serve.limits import Limits

    return Limits()


@contextmanager
def ray_deployment(config: Any, **options: Any) -> Iterator[Any]:
    """One test module's Ray Serve deployment of the try-on replicas: CPU replicas (2 unless told) on a private
    Ray instance of this machine's CPUs, reached through handles only (no Serve HTTP proxy), removed afterwards."""
    import os

    from ootd.serve.ray_engine import RayOptions, deployed

    settings = {"replicas": 2, "gpus_per_replica": 0, "health_check_period_s": 1.0, **options}
    # Ray's own memory monitor kills workers when the whole machine runs short, whoever uses the memory; on a
    # shared test machine that is other people's work: leave it to the kernel, as for the local engine's tests
    saved = os.environ.get(MEMORY_MONITOR)
    os.environ[MEMORY_MONITOR] = "0"
    try:
        with deployed(config, RayOptions(**settings)) as deployment:
            yield deployment
    finally:
        if saved is None:
            os.environ.pop(MEMORY_MONITOR, None)
        else:
            os.environ[MEMORY_MONITOR] = saved


def tiny_config(tiny_tree: Path, **options: Any) -> Any:
    from ootd.app.tryon.config import build_config

    return build_config(checkpoints=tiny_tree, device="cpu", **options)


def pipes_factory(pipes: dict[str, Any], preprocessor: Any = None) -> Any:
    """Models for the server: the session's preloaded tiny pipelines (and pose + parsing, when given)."""
    from ootd.models import ModelSource

    return ModelSource(lambda model_type: pipes[ModelType(model_type).value],
                       (lambda: preprocessor) if preprocessor is not None else None)


def decode_data_url(url: str) -> Image.Image:
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix), url[:40]
    image = Image.open(io.BytesIO(base64.b64decode(url[len(prefix):])))
    image.load()
    return image


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def files_for(paths: dict[str, Path]) -> dict[str, tuple[str, bytes, str]]:
    return {role: (path.name, path.read_bytes(), "image/png") for role, path in paths.items()}



def tryon_files(example_images: dict[str, Path], person_name: str | None = None) -> dict[str, tuple[str, bytes, str]]:
    """The example person, t-shirt and mask as a request's files (the person under another name if given)."""
    files = files_for({"person": example_images["person"], "garment": example_images["tshirt"],
                       "mask": example_images["mask"]})
    if person_name is not None:
        files["person"] = (person_name, *files["person"][1:])
    return files


def wait_until(condition: Any, seconds: float, what: str, every: float = 0.05) -> None:
    """Poll `condition` until it holds; fail naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {seconds} s waiting for {what}"
        time.sleep(every)


def served_url(line: str) -> str:
    """The URL in `ootd serve`'s first line ("ootd serve: open http://127.0.0.1:PORT/; ...")."""
    return line.split("open ", 1)[1].split(" ", 1)[0].rstrip(";")


def stop_process(proc: Any, sig: int, timeout: float) -> tuple[str, float]:
    """Send `sig` and wait for the exit: (the rest of stdout, seconds it took); killed and failed after `timeout`."""
    import signal
    import subprocess

    start = time.monotonic()
    proc.send_signal(sig)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_process(proc)
        raise AssertionError(f"still running {timeout} s after {signal.Signals(sig).name}") from None
    return out, time.monotonic() - start


def kill_process(proc: Any) -> None:
    """What a test leaves of a server process it started: nothing."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)

def raw_request(url: str, method: str, path: str, files: Any = None, data: Any = None,
                headers: dict[str, str] | None = None) -> tuple[bytes, dict[str, str]]:
    """The bytes of a whole HTTP/1.1 request (head and body) as httpx would send it, to send by hand."""
    import httpx

    request = httpx.Request(method, url.rstrip("/") + path, files=files, data=data, headers=headers)
    body = request.read()
    lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in request.headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body, dict(request.headers)


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    return host, int(port)


class StepCounter:
    """A pipeline that counts the denoising steps it runs (through the per-step hook) and says when the first
    is done; everything else is the wrapped pipeline's."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe
        self.steps = 0
        self.started = threading.Event()
        self.ended = threading.Event()
        self.error: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)

    def generate(self, *args: Any, callback: Any = None, **kwargs: Any) -> Any:
        def counted(step: int, t: Any, latents: Any) -> Any:
            self.steps = step + 1
            self.started.set()
            return callback(step, t, latents) if callback is not None else None

        self.steps, self.error = 0, None
        self.started.clear()
        self.ended.clear()
        try:
            return self._pipe.generate(*args, callback=counted, **kwargs)
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self.ended.set()


def assert_one_line_error(response: Any, status: int, *words: str) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    message = body["error"]
    assert message and "\n" not in message and "Traceback" not in message, message
    for word in words:
        assert word in message, message
    return message
