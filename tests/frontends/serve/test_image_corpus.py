"""The generated image corpus (tests/helpers/corpus.py) uploaded to a live `ootd serve`: each file as the person
(an automatic mask), the garment or the mask of a try-on (in turn), through `POST /api/tryon` and `POST /api/jobs`.
Every answer is a picture or a 4xx whose JSON body is one line - never a 5xx - and the server answers
its health check after all of them. FakePipe stands in for the diffusion models, the synthetic pose and parsing for
theirs: the question is the way in."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
httpx = pytest.importorskip("httpx")

from tests.helpers.corpus import EVERYDAY, Sample, drawn, mutated, no_traceback  # noqa: E402
from tests.helpers.fakes import FakePipe  # noqa: E402
from tests.helpers.serving import live_server, pipes_factory, tiny_config, wait_until  # noqa: E402
from tests.helpers.synthetic import synthetic_preprocessor  # noqa: E402

FAST = {"category": "upper", "steps": "1", "resolution": "384x512", "seed": "3"}


def _upload(live, sample: Sample, role: str, good: dict[str, bytes], route: str) -> int:  # noqa: ANN001
    files = {"person": ("person.png", good["person"], "image/png"), "garment": ("garment.png", good["garment"],
                                                                               "image/png")}
    if role == "mask":
        files["mask"] = ("mask.png", good["mask"], "image/png")
    files[role] = (sample.name, sample.data, "application/octet-stream")
    response = httpx.post(live.url + route, files=files, data=FAST, timeout=120)
    assert response.status_code < 500, (sample.origin, role, response.status_code, response.text[:300])
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"}, (sample.origin, body)
        message = body["error"]
        assert "\n" not in message and no_traceback(message), (sample.origin, message)
    elif route == "api/jobs":
        job = response.json()["id"]
        wait_until(lambda: httpx.get(live.url + f"api/jobs/{job}", timeout=10).json()["state"] in ("done", "failed"),
                   60, f"job {job}")
        state = httpx.get(live.url + f"api/jobs/{job}", timeout=10).json()
        assert state["state"] == "done" or no_traceback(str(state.get("error"))), (sample.origin, state)
    return response.status_code


def _run(tiny_tree: Path, example_images: dict[str, Path], samples: list[Sample]) -> None:
    good = {role: example_images[key].read_bytes() for role, key in
            (("person", "person"), ("garment", "tshirt"), ("mask", "mask"))}
    pipes = {"hd": FakePipe("hd"), "dc": FakePipe("dc")}
    statuses = []
    with live_server(tiny_config(tiny_tree, model_type="hd"),
                     models=pipes_factory(pipes, synthetic_preprocessor())) as live:
        for number, sample in enumerate(samples):
            role = ("person", "garment", "mask")[number % 3]
            statuses.append(_upload(live, sample, role, good, "api/jobs" if number % 5 == 0 else "api/tryon"))
        assert httpx.get(live.url + "api/health", timeout=10).json()["status"] == "ok"
    assert 200 in statuses and {code for code in statuses if code >= 400} <= {400, 413, 415, 422}, set(statuses)


def test_the_corpus_uploaded(tiny_tree: Path, example_images: dict[str, Path]) -> None:
    _run(tiny_tree, example_images, [*mutated(6, **EVERYDAY)[::8], *drawn(6)])


@pytest.mark.slow
def test_the_whole_corpus_uploaded(tiny_tree: Path, example_images: dict[str, Path]) -> None:
    _run(tiny_tree, example_images, [*mutated(6), *drawn(150)])
