"""`ootd serve --engine ray` under load and faults: one Ray Serve deployment of two CPU replicas for the module
(a private Ray instance of this machine's CPUs), with the engine's test hooks: a file that holds every replica at
its first denoising step, and a person file name whose request makes its replica exit mid-request."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
pytest.importorskip("ray.serve", reason="the ray-serve extra is not installed (pip install -e .[ray-serve])")
httpx = pytest.importorskip("httpx")

from ootd.serve.ray_replica import TEST_EXIT, TEST_HOLD  # noqa: E402
from tests.helpers.serving import (  # noqa: E402
    assert_one_line_error,
    live_server,
    ray_deployment,
    tiny_config,
    tryon_files,
)

pytestmark = pytest.mark.slow
FAST = {"category": "upper", "steps": "1", "resolution": "384x512"}
EXIT_NAME = "exit-here.png"


@pytest.fixture(scope="module")
def hold(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hold") / "hold"


@pytest.fixture(scope="module")
def deployment(tiny_tree: Path, hold: Path):  # noqa: ANN201
    saved = {name: os.environ.get(name) for name in (TEST_EXIT, TEST_HOLD)}
    os.environ[TEST_EXIT], os.environ[TEST_HOLD] = EXIT_NAME, str(hold)
    try:
        with ray_deployment(tiny_config(tiny_tree, model_type="hd"), max_queued_per_replica=1) as deployed:
            yield deployed
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def until(what: Any, timeout: float = 180.0, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)
    return value


def job(live: Any, job_id: str) -> dict:
    return httpx.get(live.url + f"api/jobs/{job_id}", timeout=10).json()


def health(live: Any) -> dict:
    return httpx.get(live.url + "api/health", timeout=10).json()


def test_requests_spread_over_both_replicas_and_a_full_line_gets_503(deployment: Any, tiny_tree: Path,
                                                                      example_images: dict[str, Path],
                                                                      hold: Path) -> None:
    config = tiny_config(tiny_tree)
    hold.touch()
    try:
        with live_server(config, ray=deployment) as live, live_server(config, ray=deployment) as other:
            # the same seed twice: the same picture whichever replica makes it
            ids = [httpx.post(live.url + "api/jobs", files=tryon_files(example_images), data={**FAST, "seed": "0"},
                              timeout=30).json()["id"] for _ in range(2)]
            until(lambda: all(job(live, i)["state"] == "running" for i in ids))  # one on each replica, held
            replicas = health(live)["replicas"]
            assert [r["busy"] for r in replicas] == [True, True], replicas
            waiting = [httpx.post(live.url + "api/jobs", files=tryon_files(example_images),
                                  data={**FAST, "seed": str(i)}, timeout=30) for i in (2, 3)]
            assert [(w.status_code, w.json()["position"]) for w in waiting] == [(202, 1), (202, 2)]
            assert health(live)["queue"]["waiting"] == 2
            # this front end's line is full: refused before the upload is read, nothing left behind
            full = httpx.post(live.url + "api/tryon", files=tryon_files(example_images), data=FAST, timeout=30)
            assert_one_line_error(full, 503, "busy")
            assert int(full.headers["retry-after"]) >= 1
            assert len(list((live.workdir / "jobs").iterdir())) == 4
            # another front end on the same handle counts nothing itself: Ray Serve's max_queued_requests refuses,
            # once this front end's waiting jobs are in the handle's line (each is sent from a thread of its own)
            until(lambda: len(live.app.state.worker._streams) == 4, timeout=30)
            refused = httpx.post(other.url + "api/tryon", files=tryon_files(example_images), data=FAST, timeout=60)
            assert_one_line_error(refused, 503, "busy")
            assert int(refused.headers["retry-after"]) >= 1
            assert not list((other.workdir / "jobs").glob("*/inputs"))
            # a waiting job cancelled by its client leaves the line: it never runs
            dropped = waiting.pop()
            cancel = httpx.delete(live.url + f"api/jobs/{dropped.json()['id']}", timeout=10)
            assert cancel.status_code == 202, cancel.text
            until(lambda: live.app.state.worker.get(dropped.json()["id"]).state == "cancelled", timeout=30)
            assert httpx.get(live.url + f"api/jobs/{dropped.json()['id']}", timeout=10).status_code == 410  # gone
            hold.unlink()
            ids += [w.json()["id"] for w in waiting]
            done = [until(lambda i=i: (s := job(live, i))["state"] in ("done", "failed") and s) for i in ids]
            assert [d["state"] for d in done] == ["done"] * 3, done
            assert [d["seed"] for d in done] == [0, 0, 2]
            assert done[0]["replica"] != done[1]["replica"], done  # they ran at once: one on each replica
            assert {d["replica"] for d in done} == {r["id"] for r in replicas}, replicas
            first, second = (httpx.get(d["images"][0], timeout=10).content for d in done[:2])
            assert first == second
            image = httpx.get(done[0]["images"][0], timeout=10)
            assert image.status_code == 200 and image.headers["content-type"] == "image/png"
            assert_one_line_error(httpx.get(other.url + f"api/jobs/{ids[0]}", timeout=10), 404)  # not its job
    finally:
        hold.unlink(missing_ok=True)


def test_a_replica_killed_mid_request_fails_that_request_only_and_is_replaced(
        deployment: Any, tiny_tree: Path, example_images: dict[str, Path]) -> None:
    with live_server(tiny_config(tiny_tree), ray=deployment) as live:
        before = {r["id"] for r in health(live)["replicas"]}
        answers: dict[str, Any] = {}

        def other() -> None:
            answers["other"] = httpx.post(live.url + "api/tryon", files=tryon_files(example_images),
                                          data={**FAST, "seed": "5"}, timeout=300)

        thread = threading.Thread(target=other)
        thread.start()
        killed = httpx.post(live.url + "api/jobs", files=tryon_files(example_images, EXIT_NAME), data=FAST, timeout=30)
        assert killed.status_code == 202, killed.text
        killed_id = killed.json()["id"]
        failed = until(lambda: (s := job(live, killed_id))["state"] not in ("queued", "running") and s)
        assert failed["state"] == "failed" and failed["status"] == 503, failed
        assert "replica" in failed["error"] and "stopped" in failed["error"] and "\n" not in failed["error"]
        assert not (live.workdir / "jobs" / killed_id / "results").exists()  # nothing half-written to serve
        thread.join(300)
        assert answers["other"].status_code == 200, answers["other"].text  # the other replica went on
        # Ray Serve starts a replacement; health lists it
        replicas = until(lambda: (r := health(live)["replicas"]) and len(r) == 2 and all(x["alive"] for x in r)
                         and {x["id"] for x in r} != before and r, timeout=240, every=0.5)
        assert len({x["id"] for x in replicas} & before) == 1, (replicas, before)
        for seed in ("6", "7"):
            response = httpx.post(live.url + "api/tryon", files=tryon_files(example_images),
                                  data={**FAST, "seed": seed}, timeout=300)
            assert response.status_code == 200, response.text


def test_health_lists_the_replicas_without_rays_private_modules(deployment: Any, tiny_tree: Path,
                                                                example_images: dict[str, Path],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With Ray Serve's private client gone from this process (the ingress), health still lists both replicas,
    from their own reports; with it there, the deployment's public status is shown too."""
    import ray.serve._private.api as private
    import ray.serve.api as public

    with live_server(tiny_config(tiny_tree), ray=deployment) as live:
        status = until(lambda: (h := health(live))["deployment"] and h["deployment"], timeout=60)
        assert status["replicas"].get("RUNNING") == 2, status

    def gone(*_: Any, **__: Any) -> Any:
        raise ImportError("ray.serve._private.api is not there in this Ray")

    monkeypatch.setattr(private, "_get_global_client", gone)
    monkeypatch.setattr(public, "_get_global_client", gone)  # serve.status() reads it too
    with live_server(tiny_config(tiny_tree), ray=deployment) as live:
        replicas = until(lambda: (r := health(live)["replicas"]) and len(r) == 2 and all(x["alive"] for x in r)
                         and r, timeout=60)
        assert len({r["id"] for r in replicas}) == 2 and all(r["state"] == "RUNNING" for r in replicas), replicas
        assert all(isinstance(r["pid"], int) and r["node_ip"] and r["started"] for r in replicas), replicas
        assert health(live)["deployment"] is None  # Ray Serve's own status: not known here
        answer = httpx.post(live.url + "api/tryon", files=tryon_files(example_images), data={**FAST, "seed": "1"},
                            timeout=300)
        assert answer.status_code == 200, answer.text
        ran = answer.json()["replica"]
        assert ran in {r["id"] for r in replicas}
        after = {r["id"]: r for r in health(live)["replicas"]}
        assert after[ran]["completed"] >= 1 and after[ran]["models_loaded"] == ["hd"], after
