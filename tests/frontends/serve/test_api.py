"""`ootd serve` API against a live server on 127.0.0.1: health, a try-on equal to `ootd run`'s, each bad input's
status and one-line error, serialized concurrent requests, a full queue, the streaming upload limit, auth.

The tests taking `engine` run twice: against the local engine and against the Ray engine (two CPU replicas of
one Ray Serve deployment for the whole module, on a private Ray instance of this machine's CPUs)."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
httpx = pytest.importorskip("httpx")

from PIL import Image  # noqa: E402

from ootd.models import ModelSource  # noqa: E402
from ootd.serve.limits import Auth, Limits  # noqa: E402
from ootd.settings import ModelType  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.helpers.serving import (  # noqa: E402
    assert_one_line_error,
    decode_data_url,
    files_for,
    live_server,
    pipes_factory,
    pixels,
    ray_deployment,
    tiny_config,
)

FAST = {"steps": "1", "resolution": "384x512", "seed": "3"}


@pytest.fixture(scope="module")
def pipes(pipe_hd, pipe_dc) -> dict:  # noqa: ANN001
    return {"hd": pipe_hd, "dc": pipe_dc}


@pytest.fixture(scope="module", params=["local", pytest.param("ray", marks=pytest.mark.slow)])  # Ray: slow
def engine(request: pytest.FixtureRequest, tiny_tree: Path, pipes: dict):  # noqa: ANN201
    """What live_server needs for each engine: the local one with the session's pipelines; the Ray one with
    the module's deployment (its replicas load the tiny tree themselves)."""
    if request.param == "local":
        yield {"models": pipes_factory(pipes)}
        return
    pytest.importorskip("ray.serve", reason="the ray-serve extra is not installed (pip install -e .[ray-serve])")
    with ray_deployment(tiny_config(tiny_tree, model_type="hd")) as deployment:
        yield {"ray": deployment}


@pytest.fixture(scope="module")
def server(tiny_tree: Path, engine: dict):  # noqa: ANN201
    with live_server(tiny_config(tiny_tree, model_type="hd"), **engine) as live:
        yield live


def with_mask(example_images: dict[str, Path]) -> dict:
    return files_for({"person": example_images["person"], "garment": example_images["tshirt"],
                      "mask": example_images["mask"]})


def test_health_page_and_options(server, engine: dict) -> None:  # noqa: ANN001
    health = httpx.get(server.url + "api/health", timeout=10)
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok" and {"device", "precision", "attention", "models_loaded", "queue"} <= set(body)
    assert isinstance(body["models_loaded"], list)
    if "ray" in engine:  # two replicas, each holding up to two waiting requests by default
        assert body["engine"] == "ray" and body["queue"]["limit"] == 4
        assert len(body["replicas"]) == 2 and all(replica["alive"] for replica in body["replicas"])
        assert len({replica["id"] for replica in body["replicas"]}) == 2
    else:
        assert "engine" not in body and body["queue"]["limit"] == Limits().max_queue
    page = httpx.get(server.url, timeout=10)
    assert page.status_code == 200 and "<canvas id=\"mask-canvas\"" in page.text
    assert httpx.get(server.url + "static/app.js", timeout=10).status_code == 200
    options = httpx.get(server.url + "api/options", timeout=10).json()
    assert options["categories"] == ["upper", "lower", "dress", "auto"]
    assert options["model_types"] == {"upper": "hd", "lower": None, "dress": None}  # this server forces hd
    assert options["defaults"]["steps"] == 20 and options["defaults"]["resolution"] == "768x1024"
    missing = httpx.get(server.url + "static/../../pyproject.toml", timeout=10)
    assert missing.status_code == 404


def test_tryon_equals_ootd_run(tmp_path: Path, tiny_tree: Path, example_images: dict[str, Path],
                               engine: dict) -> None:
    """Both sides load the tiny checkpoints themselves (the local engine in this process, the Ray engine in
    its replicas); the CLI runs in its own process. On a CPU the last bit of a float sum depends on how many
    threads share it: the replicas (one CPU each) apply the server's thread count, which is the CLI's."""
    out = tmp_path / "cli"
    args = ["run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper",
            "--mask", example_images["mask"], "--checkpoints", tiny_tree, "-o", out, "--device", "cpu",
            "--steps", "2", "--resolution", "384x512", "--seed", "11", "--samples", "2", "-q"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cli = subprocess.run([sys.executable, "-m", "ootd", *map(str, args)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert cli.returncode == 0, cli.stderr
    with live_server(tiny_config(tiny_tree), **{k: v for k, v in engine.items() if k != "models"}) as live:
        response = httpx.post(live.url + "api/tryon", files=with_mask(example_images), timeout=300,
                              data={"category": "upper", "steps": "2", "resolution": "384x512", "seed": "11",
                                    "samples": "2"})
        assert response.status_code == 200, response.text
        body = response.json()
        health = httpx.get(live.url + "api/health", timeout=10).json()
    assert body["seed"] == 11 and len(body["images"]) == 2 and body["model_type"] == "hd"
    assert body["settings"]["steps"] == 2 and body["settings"]["mask"] == "uploaded"  # typed, as ootd run --json
    assert {"queue", "run", "total", "denoise"} <= set(body["timings"])
    assert all(round(value, 4) == value for value in body["timings"].values() if isinstance(value, float))
    assert health["models_loaded"] == ["hd"] and health["device"] == "cpu" and health["precision"] == "fp32"
    if "ray" in engine:  # the replica that ran it, by the id Ray Serve lists
        assert body["replica"] in {replica["id"] for replica in health["replicas"]}
    for i, url in enumerate(body["images"]):
        served = decode_data_url(url)
        with Image.open(out / f"person__tshirt__{i}.png") as written:
            assert (pixels(served) == pixels(written)).all(), f"sample {i} differs from ootd run's"
            assert served.text == written.text, "the PNG metadata differs from ootd run's"
        # the same file, byte for byte: both are written by the one job (ootd/app/tryon/job.py)
        assert base64.b64decode(url.split(",", 1)[1]) == (out / f"person__tshirt__{i}.png").read_bytes()
    mask = decode_data_url(body["mask"])
    assert mask.size == (384, 512) and decode_data_url(body["person_mask"]).size == Image.open(
        example_images["person"]).size


def test_bad_inputs_get_their_status_and_one_line(server, tmp_path: Path,  # noqa: ANN001
                                                  example_images: dict[str, Path]) -> None:
    text = tmp_path / "notes.png"
    text.write_text("this is not an image\n")
    person, garment = example_images["person"], example_images["tshirt"]
    good = files_for({"person": person, "garment": garment})
    cases = [
        (files_for({"person": text, "garment": garment}), {"category": "upper"}, 400, "person image notes.png:"),
        (files_for({"person": person, "garment": text}), {"category": "upper"}, 400, "garment"),
        (good, {"category": "upper", **FAST}, 400, "no person detected"),  # the tiny pose model finds nobody
        (good, {"category": "lower"}, 400, "hd"),  # this server runs hd only
        (good, {}, 422, "category"),
        (good, {"category": "hat"}, 422, "category"),
        (good, {"category": "upper", "steps": "many"}, 422, "steps"),
        (good, {"category": "upper", "steps": "0"}, 422, "steps"),
        (good, {"category": "upper", "scale": "99"}, 422, "scale"),
        (good, {"category": "upper", "resolution": "100x100"}, 422, "resolution"),
        (good, {"category": "upper", "scheduler": "magic"}, 422, "scheduler"),
        (good, {"category": "upper", "fit": "zoom"}, 422, "fit"),
        (good, {"category": "upper", "colour": "red"}, 422, "colour"),
        (files_for({"person": person}), {"category": "upper"}, 422, "garment"),
    ]
    for files, data, status, word in cases:
        response = httpx.post(server.url + "api/tryon", files=files, data=data, timeout=120)
        assert_one_line_error(response, status, word)
        assert httpx.get(server.url + "api/health", timeout=10).status_code == 200
    not_multipart = httpx.post(server.url + "api/tryon", json={"category": "upper"}, timeout=10)
    assert_one_line_error(not_multipart, 415, "multipart/form-data")
    assert_one_line_error(httpx.get(server.url + "api/nothing", timeout=10), 404)
    ok = httpx.post(server.url + "api/tryon", files=with_mask(example_images), data={"category": "upper", **FAST},
                    timeout=120)
    assert ok.status_code == 200, ok.text


class Recording:
    """A pipeline that notes when each generate() runs, to see whether two ever overlap; optionally gated."""

    def __init__(self, pipe, gate: threading.Event | None = None) -> None:  # noqa: ANN001
        self._pipe, self.gate = pipe, gate
        self.spans: list[tuple[float, float]] = []
        self.active = self.most = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._pipe, name)

    def generate(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        with self._lock:
            self.active += 1
            self.most = max(self.most, self.active)
        start = time.perf_counter()
        try:
            if self.gate is not None:
                assert self.gate.wait(60)
            return self._pipe.generate(*args, **kwargs)
        finally:
            with self._lock:
                self.active -= 1
            self.spans.append((start, time.perf_counter()))


def test_concurrent_requests_are_queued_not_interleaved(tiny_tree: Path, pipe_hd,  # noqa: ANN001
                                                        example_images: dict[str, Path]) -> None:
    recording = Recording(pipe_hd)
    answers: list = [None, None]

    def post(i: int) -> None:
        answers[i] = httpx.post(live.url + "api/tryon", files=with_mask(example_images),
                                data={"category": "upper", **FAST, "seed": str(i)}, timeout=120)

    with live_server(tiny_config(tiny_tree), models=ModelSource(lambda model_type: recording)) as live:
        threads = [threading.Thread(target=post, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert sorted(a.json()["seed"] for a in answers) == [0, 1]
    assert recording.most == 1 and len(recording.spans) == 2
    (a_start, a_end), (b_start, _) = sorted(recording.spans)
    assert a_end <= b_start


def test_full_queue_gets_503_with_retry_after(tiny_tree: Path, pipe_hd,  # noqa: ANN001
                                              example_images: dict[str, Path]) -> None:
    gate = threading.Event()
    recording = Recording(pipe_hd, gate)
    limits = Limits(max_queue=1)
    data = {"category": "upper", **FAST}
    with live_server(tiny_config(tiny_tree), limits=limits, models=ModelSource(lambda model_type: recording)) as live:
        first = httpx.post(live.url + "api/jobs", files=with_mask(example_images), data=data, timeout=30)
        assert first.status_code == 202, first.text
        deadline = time.monotonic() + 60
        while httpx.get(live.url + f"api/jobs/{first.json()['id']}", timeout=10).json()["state"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        second = httpx.post(live.url + "api/jobs", files=with_mask(example_images), data=data, timeout=30)
        assert second.status_code == 202 and second.json()["position"] == 1
        third = httpx.post(live.url + "api/tryon", files=with_mask(example_images), data=data, timeout=30)
        assert_one_line_error(third, 503, "busy")
        assert int(third.headers["retry-after"]) >= 1
        assert len(list((live.workdir / "jobs").iterdir())) == 2  # the refused request left nothing behind
        gate.set()
        for job in (first, second):
            job_id = job.json()["id"]
            while (status := httpx.get(live.url + f"api/jobs/{job_id}", timeout=10).json())["state"] != "done":
                assert status["state"] != "failed" and time.monotonic() < deadline, status
                time.sleep(0.05)
            assert not (live.workdir / "jobs" / job_id / "inputs").exists()  # uploads go once the job is done
            assert status["images"][0].startswith(live.url + f"api/jobs/{job_id}/files/")  # absolute URLs
            image = httpx.get(status["images"][0], timeout=10)
            assert image.status_code == 200 and image.headers["content-type"] == "image/png"
            assert Image.open(__import__("io").BytesIO(image.content)).text["seed"] == "3"
            assert_one_line_error(httpx.get(live.url + f"api/jobs/{job_id}/files/..%2Fx.png", timeout=10), 404)


def _raw_request(url: str, head: str, chunks: list[bytes]) -> bytes:
    """Send a request by hand (the body possibly far shorter than announced) and read the whole answer."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(head.encode())
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may close as soon as it has answered
        answer = b""
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
    return answer


def test_oversized_request_gets_413_without_being_read(tiny_tree: Path, engine: dict) -> None:
    limits = Limits(max_upload_bytes=64 * 1024)
    boundary = "b0undary"
    with live_server(tiny_config(tiny_tree), limits=limits, **engine) as live:
        # announces 1 GiB, sends 16 KiB: the answer comes without the server waiting for the rest
        started = time.perf_counter()
        head = (f"POST /api/tryon HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; "
                f"boundary={boundary}\r\nContent-Length: {2**30}\r\n\r\n")
        answer = _raw_request(live.url, head, [b"x" * 16384])
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert time.perf_counter() - started < 10
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"].startswith("request too large")
        # no length announced (chunked): a well-formed upload is cut off once past the limit
        part = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"person\"; filename=\"p.png\"\r\n"
                "Content-Type: image/png\r\n\r\n").encode()
        pieces = [part] + [b"y" * 8192] * 12
        chunks = [f"{len(piece):x}\r\n".encode() + piece + b"\r\n" for piece in pieces]
        head = (f"POST /api/tryon HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; "
                f"boundary={boundary}\r\nTransfer-Encoding: chunked\r\n\r\n")
        answer = _raw_request(live.url, head, [*chunks, b"0\r\n\r\n"])
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert httpx.get(live.url + "api/health", timeout=10).status_code == 200


def test_auth_and_exposure(tiny_tree: Path, engine: dict) -> None:
    from ootd.errors import UsageError
    from ootd.serve.server import check_exposure

    with live_server(tiny_config(tiny_tree), auth=Auth.parse("ann:s3cret"), **engine) as live:
        refused = httpx.get(live.url + "api/health", timeout=10)
        assert_one_line_error(refused, 401, "authentication")
        assert refused.headers["www-authenticate"].startswith("Basic")
        assert httpx.get(live.url + "api/health", auth=("ann", "wrong"), timeout=10).status_code == 401
        assert httpx.get(live.url + "api/health", auth=("ann", "s3cret"), timeout=10).status_code == 200
        big = httpx.post(live.url + "api/tryon", content=b"z" * (30 * 2**20), timeout=30)
        assert big.status_code == 401  # credentials first, before anything is read
    token = Auth.parse("t0ken")
    assert token.allows("Bearer t0ken") and not token.allows("Bearer nope") and not token.allows(None)
    with pytest.raises(UsageError, match="--auth"):
        check_exposure("0.0.0.0", None, insecure_no_auth=False)
    check_exposure("0.0.0.0", None, insecure_no_auth=True)
    check_exposure("0.0.0.0", token, insecure_no_auth=False)
    check_exposure("127.0.0.1", None, insecure_no_auth=False)
    check_exposure("::1", None, insecure_no_auth=False)


def test_missing_checkpoints_get_503_and_the_server_stays_up(tmp_path: Path, example_images: dict[str, Path]) -> None:
    empty = tmp_path / "checkpoints"
    empty.mkdir()
    with live_server(tiny_config(empty)) as live:
        for _ in range(2):
            response = httpx.post(live.url + "api/tryon", files=with_mask(example_images),
                                  data={"category": "upper", **FAST}, timeout=60)
            assert_one_line_error(response, 503, "cannot run this model", "ootd download")
        assert httpx.get(live.url + "api/health", timeout=10).json()["models_loaded"] == []


def test_a_checkpoint_repaired_while_the_server_runs_loads_at_the_next_request(
        tiny_tree: Path, tmp_path: Path, example_images: dict[str, Path]) -> None:
    """A damaged UNet is a 503, the same one again while it stays damaged (the owner remembers the failure);
    once the file is repaired in place, the next request loads it and answers 200, without a restart."""
    import shutil

    from ootd.weights.layout import Layout

    tree = tmp_path / "checkpoints"
    shutil.copytree(tiny_tree, tree, ignore=shutil.ignore_patterns("ootd_dc"))
    weights = Layout(tree).unet_vton(ModelType.HD) / "diffusion_pytorch_model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    with live_server(tiny_config(tree, model_type="hd")) as live:
        for _ in range(2):
            response = httpx.post(live.url + "api/tryon", files=with_mask(example_images),
                                  data={"category": "upper", **FAST}, timeout=60)
            assert_one_line_error(response, 503, "cannot run this model", "cannot load the try-on UNet")
        weights.write_bytes(good)
        response = httpx.post(live.url + "api/tryon", files=with_mask(example_images),
                              data={"category": "upper", **FAST}, timeout=120)
        assert response.status_code == 200, response.text
        assert httpx.get(live.url + "api/health", timeout=10).json()["models_loaded"] == ["hd"]


def test_a_setting_the_server_cannot_run_is_a_400_that_says_so(tiny_tree: Path,
                                                               example_images: dict[str, Path]) -> None:
    """UnsupportedError (exit 3 in the CLI: a device, precision or extra this machine lacks) is no passing
    trouble: a 400 saying what this server cannot run, not a 503 asking the client to retry."""
    from ootd.errors import UnsupportedError

    def factory(model_type):  # noqa: ANN001, ANN202
        raise UnsupportedError("attention flash cannot run here: flash-attn is not installed")

    with live_server(tiny_config(tiny_tree), models=ModelSource(factory)) as live:
        for _ in range(2):  # remembered, the same answer at once
            response = httpx.post(live.url + "api/tryon", files=with_mask(example_images),
                                  data={"category": "upper", **FAST}, timeout=60)
            assert_one_line_error(response, 400, "this server cannot run that: attention flash cannot run here")
            assert "retry-after" not in response.headers
        contract = httpx.get(live.url + "openapi.json", timeout=10).json()
        described = contract["paths"]["/api/tryon"]["post"]["responses"]["400"]["description"]
        assert "a setting this server cannot run" in described


@pytest.mark.parametrize(("one_model", "expected"), [(False, [["hd"], ["hd", "dc"], ["hd", "dc"]]),
                                                     (True, [["hd"], ["dc"], ["hd"]])])
def test_models_load_on_first_use_and_stay(tiny_tree: Path, pipes: dict, example_images: dict[str, Path],
                                           one_model: bool, expected: list) -> None:
    loads: list[str] = []

    def factory(model_type):  # noqa: ANN001, ANN202
        loads.append(model_type.value)
        return pipes[model_type.value]

    seen = []
    with live_server(tiny_config(tiny_tree), limits=Limits(one_model=one_model), models=ModelSource(factory)) as live:
        for category in ("upper", "lower", "upper"):
            response = httpx.post(live.url + "api/tryon", files=with_mask(example_images),
                                  data={"category": category, **FAST}, timeout=120)
            assert response.status_code == 200, response.text
            assert response.json()["model_type"] == ("hd" if category == "upper" else "dc")
            seen.append(sorted(httpx.get(live.url + "api/health", timeout=10).json()["models_loaded"],
                               key=["hd", "dc"].index))
    assert seen == expected
    assert loads == (["hd", "dc", "hd"] if one_model else ["hd", "dc"])
