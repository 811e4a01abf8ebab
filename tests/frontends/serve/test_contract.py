"""The HTTP API keeps the contract it publishes: Schemathesis, driven by the server's own /openapi.json, with every
check and every phase (examples, coverage, fuzzing, and the stateful phase that follows the document's links
between the job operations) against a live server on 127.0.0.1 and the tiny checkpoints: 0 failures. A bounded
run in the everyday group; a larger one against the `ootd serve` command with --auth, and one on the Ray engine
(slow). Then each thing the first runs found, as a plain test: the document lists every status a route gives and
every rule of the form, a 405 names all of a path's methods, a cancelled job is gone (the Ray engine's finding, a
person not found answered 500, is in test_ray_worker.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
pytest.importorskip("schemathesis", reason="the serve-test extra is not installed (pip install -e .[serve-test])")
httpx = pytest.importorskip("httpx")

from ootd.serve.limits import Limits  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.helpers.serving import (  # noqa: E402
    assert_one_line_error,
    files_for,
    kill_process,
    live_server,
    pipes_factory,
    ray_deployment,
    served_url,
    stop_process,
    tiny_config,
    wait_until,
)

CONFIG = Path(__file__).with_name("schemathesis.toml")
# a server that answers quickly: one step, one picture; room for every job the run makes
LIMITS = Limits(max_steps=1, max_samples=1, max_queue=64, keep_jobs=1000)


def schemathesis(url: str, tmp_path: Path, examples: int, stateful_steps: int, *extra: str) -> tuple[int, str]:
    """`schemathesis run` against `url`: every check, every phase; (exit code, its report)."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG.read_text() + f"\n[phases.stateful]\nmax-steps = {stateful_steps}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "SCHEMATHESIS_HOOKS": "tests.helpers.contract_hooks",
           "NO_COLOR": "1"}
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
               url + "openapi.json", "--checks", "all", "--phases", "examples,coverage,fuzzing,stateful",
               "--max-examples", str(examples), "--seed", "7", "--workers", "1", "--request-timeout", "300",
               "--max-response-time", "600", "--warnings", "off", *extra]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    return done.returncode, done.stdout + done.stderr


def failures(report: str) -> str:
    """The report's failures and errors (each request as curl would send it, cut short), for the assertion."""
    lines = [line[:300] for line in report.splitlines()]
    start = next((n for n, line in enumerate(lines) if "ERRORS" in line or "FAILURES" in line), 0)
    return "\n".join(lines[start:])[-15000:]


@pytest.fixture(scope="module")
def server(tiny_tree: Path, pipe_hd, pipe_dc):  # noqa: ANN001, ANN201
    config = tiny_config(tiny_tree, steps=1, samples=1)  # within the limits, as `ootd serve` insists
    with live_server(config, LIMITS, models=pipes_factory({"hd": pipe_hd, "dc": pipe_dc})) as live:
        yield live


def test_schemathesis_finds_nothing(server, tmp_path: Path) -> None:  # noqa: ANN001
    code, report = schemathesis(server.url, tmp_path, examples=8, stateful_steps=6)
    print(report[-6000:])
    assert code == 0, failures(report)
    assert httpx.get(server.url + "api/health", timeout=10).status_code == 200  # still up


@pytest.mark.slow
def test_schemathesis_against_the_serve_command_with_a_password(tiny_tree: Path, tmp_path: Path) -> None:
    """The `ootd serve` command itself (its own models from the tiny tree, --auth): a longer run, the credentials
    given to Schemathesis, which also checks that a request without them is refused as documented (401)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "ootd", "serve", "--checkpoints", str(tiny_tree), "--port", "0",
                             "--device", "cpu", "--steps", "1", "--max-steps", "1", "--max-samples", "1",
                             "--max-queue", "64", "--auth", "ann:s3cret"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = served_url(proc.stdout.readline())
        code, report = schemathesis(url, tmp_path, 20, 10, "--auth", "ann:s3cret")
        print(report[-6000:])
        assert code == 0, failures(report)
        assert httpx.get(url + "api/health", auth=("ann", "s3cret"), timeout=10).status_code == 200  # still up
        out, _ = stop_process(proc, 2, 60)  # SIGINT
    finally:
        kill_process(proc)
    assert proc.returncode == 0, proc.stderr.read()


@pytest.mark.slow
def test_schemathesis_against_the_ray_engine(tiny_tree: Path, tmp_path: Path) -> None:
    """The same contract with the try-ons on Ray Serve replicas (two CPU replicas, a private Ray instance)."""
    pytest.importorskip("ray.serve", reason="the ray-serve extra is not installed (pip install -e .[ray-serve])")
    config = tiny_config(tiny_tree, steps=1, samples=1)
    with ray_deployment(config, max_queued_per_replica=32) as deployment, \
            live_server(config, LIMITS, ray=deployment) as live:
        code, report = schemathesis(live.url, tmp_path, 8, 6)
        print(report[-6000:])
        assert code == 0, failures(report)
        assert httpx.get(live.url + "api/health", timeout=10).status_code == 200


def document(server) -> dict:  # noqa: ANN001
    return httpx.get(server.url + "openapi.json", timeout=10).json()


def test_the_document_lists_every_status_with_the_error_body_and_links_the_jobs(server) -> None:  # noqa: ANN001
    paths = document(server)["paths"]
    statuses = {(path, method): set(operation["responses"]) for path, item in paths.items()
                for method, operation in item.items()}
    assert statuses[("/api/jobs/{job_id}", "delete")] >= {"202", "403", "404", "410"}
    assert statuses[("/api/jobs/{job_id}/files/{name}", "get")] >= {"200", "206", "400", "404", "410", "416"}
    for route in ("/api/tryon", "/api/jobs"):
        assert statuses[(route, "post")] >= {"400", "403", "413", "415", "422", "503", "507"}
    for (path, method), codes in statuses.items():
        for code in codes - {"200", "202", "206"}:
            answer = paths[path][method]["responses"][code]["content"]["application/json"]["schema"]
            assert answer == {"$ref": "#/components/schemas/Error"}, (path, method, code)
    created = paths["/api/jobs"]["post"]["responses"]["202"]["links"]
    assert {link["operationId"] for link in created.values()} == {"getJob", "cancelJob"}
    form = paths["/api/jobs"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert form["schema"]["additionalProperties"] is False
    assert "" in form["schema"]["properties"]["category"]["enum"]
    assert form["schema"]["properties"]["steps"]["maximum"] == 1  # this server's limit
    assert form["encoding"]["person"]["contentType"].startswith("image/png")


def test_what_the_first_runs_found(server, example_images: dict[str, Path]) -> None:  # noqa: ANN001
    """An empty category is `auto` (the document allows it); more parts than the form has is a documented 422,
    not a 400 in plain words; a body that is not multipart is 415; OPTIONS on a job names GET and DELETE."""
    files = files_for({"person": example_images["person"], "garment": example_images["tshirt"],
                       "mask": example_images["mask"]})
    empty = httpx.post(server.url + "api/jobs", files=files, data={"category": ""}, timeout=60)
    assert empty.status_code in (202, 400), empty.text  # taken; `auto` may then be unsure of a noise garment
    if empty.status_code == 400:
        assert "categor" in empty.json()["error"], empty.text
    many = {"category": "upper", "seed": [str(n) for n in range(40)]}
    assert_one_line_error(httpx.post(server.url + "api/jobs", files=files, data=many, timeout=60), 422, "too many")
    assert_one_line_error(httpx.post(server.url + "api/jobs", json={"category": "upper"}, timeout=10), 415)
    options = httpx.request("OPTIONS", server.url + "api/jobs/abc", timeout=10)
    assert options.status_code == 405
    assert {m.strip() for m in options.headers["allow"].split(",")} >= {"GET", "DELETE"}, options.headers


def test_a_cancelled_job_is_gone(server, example_images: dict[str, Path]) -> None:  # noqa: ANN001
    files = files_for({"person": example_images["person"], "garment": example_images["tshirt"],
                       "mask": example_images["mask"]})
    job = httpx.post(server.url + "api/jobs", files=files, data={"category": "upper"}, timeout=60).json()
    cancelled = httpx.delete(server.url + f"api/jobs/{job['id']}", timeout=10)
    assert cancelled.status_code == 202 and cancelled.json()["id"] == job["id"]
    assert_one_line_error(httpx.get(server.url + f"api/jobs/{job['id']}", timeout=10), 410, "cancelled")
    assert_one_line_error(httpx.get(server.url + f"api/jobs/{job['id']}/files/x.png", timeout=10), 410)
    assert httpx.delete(server.url + f"api/jobs/{job['id']}", timeout=10).status_code == 202  # idempotent
    wait_until(lambda: server.app.state.worker.status()["running"] is False, 60, "the cancelled job to stop")
