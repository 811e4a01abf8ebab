"""`ootd batch --engine ray`: same images and report as the local engine, resume, a worker killed mid-pair.

One Ray instance for the whole module (2 CPUs, no dashboard), shut down at the end; every engine run in it starts
its own actors, which load the tiny pipelines. The local engine runs in this process with one torch thread, as
each single-CPU Ray worker does: float sums split over a different number of threads can move a pixel by one level.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from typer.testing import CliRunner

from ootd.app.batch.cluster import ClusterOptions
from ootd.app.batch.engines import make_engine
from ootd.app.batch.pairs import read_pairs_csv
from ootd.app.batch.ray_engine import EXIT_ON_FIRST_ATTEMPT
from ootd.app.tryon.config import build_config
from ootd.cli import app as cli_app
from tests.helpers import REPO

pytestmark = pytest.mark.slow  # a Ray instance and its actors: about a minute

RUN = ["--steps", "1", "--resolution", "384x512", "--seed", "7", "-q"]


@pytest.fixture(scope="module")
def ray_instance():  # noqa: ANN201
    ray = pytest.importorskip("ray")

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, example_images: dict[str, Path]) -> Path:
    """Two people (one mirrored, with its mirrored mask), three garments, in one folder."""
    root = tmp_path_factory.mktemp("inputs")
    shutil.copy(example_images["person"], root / "p0.png")
    ImageOps.mirror(Image.open(example_images["person"])).save(root / "p1.png")
    shutil.copy(example_images["mask"], root / "m0.png")
    ImageOps.mirror(Image.open(example_images["mask"])).save(root / "m1.png")
    shutil.copy(example_images["tshirt"], root / "g0.png")
    shutil.copy(example_images["trousers"], root / "g1.png")
    shutil.copy(example_images["tshirt"], root / "g2.png")
    return root


def write_csv(folder: Path, name: str, rows: list[str]) -> Path:
    path = folder / name
    path.write_text("person,garment,category,mask\n" + "\n".join(rows) + "\n")
    return path


def batch(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(cli_app, ["batch", *args])
    return result.exit_code, result.output


def report_lines(out: Path) -> dict[int, dict]:
    lines = [json.loads(line) for line in (out / "batch_report.jsonl").read_text().splitlines()]
    return {line["index"]: line for line in lines}


def comparable(line: dict, out: Path) -> dict:
    """A report line without what legitimately differs between runs: timings, reuse, the output folder."""
    kept = {k: v for k, v in line.items() if k not in ("timings", "reused")}
    kept["outputs"] = [str(Path(p).relative_to(out)) for p in line["outputs"]]
    kept["intermediates"] = {k: str(Path(p).relative_to(out)) for k, p in line["intermediates"].items()}
    if "preservation" in kept:  # measured in the worker that made the pair, as locally
        kept["preservation"] = {**kept["preservation"], "results": [
            {**r, "result": str(Path(r["result"]).relative_to(out))} for r in kept["preservation"]["results"]]}
    return kept


def test_ray_engine_gives_the_local_engines_images_and_report(ray_instance, tiny_tree: Path,  # noqa: ANN001
                                                                inputs: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes too: the workers (one CPU each, so one thread by Ray's default) apply the driver's thread count,
    which this process's local run uses. The driver puts nothing into the object store: an object it owns there
    is one Ray's threads try to recover when a signal to the process group stops the node, and a failed recovery
    ends the driver at once (exit 1, no report), a race no fast test can time; what it needs is kept absent."""
    put, real_put = [], ray_instance.put
    monkeypatch.setattr(ray_instance, "put", lambda value, **kw: put.append(type(value)) or real_put(value, **kw))
    pairs = write_csv(inputs, "mixed.csv", [
        "p0.png,g0.png,upper,m0.png",
        "p1.png,g0.png,upper,m1.png",
        "p0.png,g1.png,lower,m0.png",
        "p1.png,g1.png,lower,",  # random pose weights find nobody: an error from the worker
        "missing.png,g1.png,lower,",  # an error from the precheck
        "p0.png,g2.png,dress,m0.png",
        "p1.png,g0.png;g1.png,upper;lower,m1.png;m1.png",  # an outfit: both passes on one worker
    ])
    common = [str(pairs), "--checkpoints", str(tiny_tree), *RUN]
    code_local, _ = batch([*common, "-o", str(tmp_path / "local")])
    code_ray, output = batch([*common, "-o", str(tmp_path / "ray"), "--engine", "ray", "--workers", "2",
                              "--gpus-per-worker", "0"])
    assert code_local == code_ray == 1, output  # two bad pairs in each
    assert put == [], "the driver put these into Ray's object store"
    # nor through the actors' arguments: Ray stores an argument over 100 KiB as an object the caller owns
    assert len(ray_instance.cloudpickle.dumps(build_config(checkpoints=tiny_tree, steps=1))) < 100 * 1024
    local, ray = report_lines(tmp_path / "local"), report_lines(tmp_path / "ray")
    assert sorted(local) == sorted(ray) == list(range(7))
    assert local[6]["status"] == "ok" and local[6]["model_type"] == "dc+hd"
    for index in local:
        assert comparable(ray[index], tmp_path / "ray") == comparable(local[index], tmp_path / "local"), index
    assert [local[i]["status"] for i in range(6)] == ["ok", "ok", "ok", "error", "error", "ok"]
    assert "no person detected" in ray[3]["error"] and "file not found" in ray[4]["error"]
    # each pair made was measured where it was made (the tiny pose finds nobody: not measured, and why)
    assert "nobody found in the photo" in ray[0]["preservation"]["summary"]
    for name in sorted(p.name for p in (tmp_path / "local").glob("*.png")):
        a = np.asarray(Image.open(tmp_path / "local" / name))
        b = np.asarray(Image.open(tmp_path / "ray" / name))
        assert np.array_equal(a, b), name
        records = [{k: v for k, v in Image.open(tmp_path / side / name).info.items()
                    if isinstance(v, str) and k != "attention"} for side in ("local", "ray")]  # its calls counted
        assert records[0] == records[1], name
        assert records[1]["threads"] == str(torch.get_num_threads()), name  # the driver's, in the worker
    assert "lower_seed" in Image.open(tmp_path / "ray" / "p1__g0-with-g1__0.png").info
    assert sorted(p.name for p in (tmp_path / "ray").iterdir()) == sorted(
        p.name for p in (tmp_path / "local").iterdir())


def test_worker_killed_mid_pair_is_replaced_and_the_pair_retried_then_resume_dispatches_nothing(
        ray_instance, tiny_tree: Path, inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from ootd.app.tryon.config import build_config

    pairs = read_pairs_csv(write_csv(inputs, "good.csv", ["p0.png,g0.png,upper,m0.png", "p1.png,g0.png,upper,m1.png"]))
    config = build_config(checkpoints=tiny_tree, output=tmp_path / "out", steps=1, resolution="384x512", seed=3)
    report = tmp_path / "out" / "batch_report.jsonl"
    monkeypatch.setenv(EXIT_ON_FIRST_ATTEMPT, "1")  # pair 1's first attempt exits its worker process while denoising
    engine = make_engine("ray", config, cluster=ClusterOptions(workers=1, gpus_per_worker=0), report_path=report)
    summary = engine.run(pairs)
    assert engine.attempts == {1: 2}  # pair 0 ran once
    assert summary.tally.counts == {"ok": 2, "skipped": 0, "error": 0}, summary.tally.errors()
    assert summary.loads == {"hd": 2}  # the replacement worker loaded its own pipeline
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["batch_report.jsonl", "p0__g0__0.png", "p1__g0__0.png"]  # nothing partial, nothing twice
    assert sorted(report_lines(tmp_path / "out")) == [0, 1]

    monkeypatch.delenv(EXIT_ON_FIRST_ATTEMPT)
    again = make_engine("ray", config, cluster=ClusterOptions(workers=1, gpus_per_worker=0), report_path=report)
    summary = again.run(pairs)
    assert again.dispatched == 0
    assert summary.tally.counts == {"ok": 0, "skipped": 2, "error": 0}
    assert [line["status"] for line in report_lines(tmp_path / "out").values()] == ["skipped"] * 2


def test_a_pair_whose_worker_dies_on_every_attempt_is_reported_and_the_rest_run(
        ray_instance, tiny_tree: Path, inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """--retries 0: the pair whose worker dies gets one attempt, then an error line; the batch goes on without it."""
    from ootd.app.tryon.config import build_config

    pairs = read_pairs_csv(write_csv(inputs, "dies.csv", ["p0.png,g0.png,upper,m0.png", "p1.png,g0.png,upper,m1.png"]))
    config = build_config(checkpoints=tiny_tree, output=tmp_path / "out", steps=1, resolution="384x512", seed=3)
    monkeypatch.setenv(EXIT_ON_FIRST_ATTEMPT, "0")
    engine = make_engine("ray", config, cluster=ClusterOptions(workers=1, gpus_per_worker=0, retries=0),
                         report_path=tmp_path / "out" / "batch_report.jsonl")
    summary = engine.run(pairs)
    first, second = report_lines(tmp_path / "out").values()
    assert (first["status"], first["model_type"], first["seed"]) == ("error", "hd", 3)
    assert first["error"].startswith("the worker running this pair died on each of its 1 attempt(s)")
    assert second["status"] == "ok", second["error"]
    assert summary.tally.errors() == [{"index": 0, "person": str(pairs[0].person), "garment": str(pairs[0].garment),
                                       "error": first["error"]}]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["batch_report.jsonl", "p1__g0__0.png"]
    assert [line["status"] for line in report_lines(tmp_path / "out").values()] == ["error", "ok"]


def test_ray_engine_without_ray_says_how_to_install_it(tiny_tree: Path, inputs: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as without the extra
    pairs = write_csv(inputs, "one.csv", ["p0.png,g0.png,upper,m0.png"])
    code, output = batch([str(pairs), "--checkpoints", str(tiny_tree), "-o", str(tmp_path), "--engine", "ray"])
    assert code == 2
    lines = output.strip().splitlines()
    assert len(lines) == 1 and "pip install 'ootd[ray]'" in lines[0], output


@pytest.mark.parametrize("extra", [["--workers", "2"], ["--address", "auto"], ["--gpus-per-worker", "1"]])
def test_cluster_options_need_the_ray_engine(extra: list[str], tiny_tree: Path, inputs: Path, tmp_path: Path) -> None:
    pairs = write_csv(inputs, "one.csv", ["p0.png,g0.png,upper,m0.png"])
    code, output = batch([str(pairs), "--checkpoints", str(tiny_tree), "-o", str(tmp_path), *extra])
    assert code == 2 and "need --engine ray" in output, output
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------- cluster options


def ootd_batch(args: list[str], *, patch: str = "", limit: float = 120) -> subprocess.CompletedProcess:
    """The real command in its own process (its own Ray, or none), with `patch` run first; a hang fails after
    `limit` seconds."""
    code = "; ".join(part for part in ("import sys", patch, "from ootd.cli import main", "main(sys.argv[1:])") if part)
    return subprocess.run([sys.executable, "-c", code, "batch", *args], capture_output=True, text=True,
                          timeout=limit, cwd=REPO)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize(("extra", "message"), [
    (["--gpus-per-worker", "nan"], "--gpus-per-worker must be a number"),
    (["--gpus-per-worker", "inf"], "--gpus-per-worker must be a number"),
    (["--gpus-per-worker", "-1"], "--gpus-per-worker must be a number"),
    (["--address", "bogus::"], "bad --address 'bogus::'"),
    (["--address", "10.0.0.1"], "use auto or HOST:PORT"),
    (["--workers", "0"], "--workers must be at least 1"),
])
def test_bad_cluster_options_are_one_line_before_anything_is_written(extra: list[str], message: str, tiny_tree: Path,
                                                                     inputs: Path, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    pairs = write_csv(inputs, "one.csv", ["p0.png,g0.png,upper,m0.png"])
    result = CliRunner().invoke(cli_app, ["batch", str(pairs), "--checkpoints", str(tiny_tree), "-o",
                                          str(tmp_path / "out"), "--engine", "ray", *extra])
    assert result.exit_code == 2, result.output
    assert message in one_line(result.stderr)
    assert not (tmp_path / "out").exists()  # no folder, no index.html, no report


def test_an_unreachable_address_fails_at_once_in_one_line(tiny_tree: Path, inputs: Path, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pairs = write_csv(inputs, "one.csv", ["p0.png,g0.png,upper,m0.png"])
    result = ootd_batch([str(pairs), "--checkpoints", str(tiny_tree), "-o", str(tmp_path / "out"), "--engine", "ray",
                         "--address", f"127.0.0.1:{port}"], limit=60)
    assert result.returncode == 2
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}: connection refused" in one_line(result.stderr)
    assert not (tmp_path / "out").exists()


def test_an_address_that_never_answers_gives_up_in_bounded_time(tiny_tree: Path, inputs: Path,
                                                                tmp_path: Path) -> None:
    pytest.importorskip("ray")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # accepts connections (the kernel does), never says a word
    port = silent.getsockname()[1]
    pairs = write_csv(inputs, "one.csv", ["p0.png,g0.png,upper,m0.png"])
    try:
        result = ootd_batch([str(pairs), "--checkpoints", str(tiny_tree), "-o", str(tmp_path / "out"), "--engine",
                             "ray", "--address", f"127.0.0.1:{port}"],
                            patch="import ootd.app.batch.ray_engine as r; r.CONNECT_TIMEOUT_S = 3", limit=90)
    finally:
        silent.close()
    assert result.returncode == 2, result.stderr
    assert "no answer from Ray within 3 s" in one_line(result.stderr)
    assert not (tmp_path / "out").exists()


# The worker marks the start of its pair (a subclass defined in the driver's __main__ travels by value); the
# driver sends itself SIGTERM a second later.
SIGTERM_MID_PAIR = """
import os, pathlib, signal, threading, time
import ootd.app.batch.ray_engine as r
flag = pathlib.Path(FLAG)
class Marking(r.PairWorker):
    def run(self, pair, attempt):
        flag.touch()
        return super().run(pair, attempt)
r.PairWorker = Marking
def terminate_once_started():
    while not flag.exists():
        time.sleep(0.1)
    time.sleep(1)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=terminate_once_started, daemon=True).start()
"""


def test_sigterm_while_a_worker_runs_a_pair_is_an_interrupt(tiny_tree: Path, inputs: Path, tmp_path: Path) -> None:
    """ray.init installs its own SIGTERM handler (exit 15, no cleanup); the command keeps its own: SIGTERM in the
    middle of a pair exits 143 and the contact sheet says the batch was interrupted."""
    pytest.importorskip("ray")
    pairs = write_csv(inputs, "one.csv", ["p0.png,g0.png,upper,m0.png"])
    flag = tmp_path / "pair-started"
    patch = f"exec({SIGTERM_MID_PAIR.replace('FLAG', repr(str(flag)))!r})"
    result = ootd_batch([str(pairs), "--checkpoints", str(tiny_tree), "-o", str(tmp_path / "out"), "--engine", "ray",
                         "--workers", "1", "--gpus-per-worker", "0", "--steps", "200", "--resolution", "384x512",
                         "-q"], patch=patch, limit=120)
    assert flag.exists(), result.stderr[-2000:]  # the worker was running the pair
    assert result.returncode == 143, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    page = (tmp_path / "out" / "index.html").read_text()
    assert 'class="state interrupted"' in page and 'class="state running"' not in page
    assert not list((tmp_path / "out").glob("*.png"))  # the pair was cut short: nothing half-written


def test_more_workers_than_cpus_are_refused_before_ray_starts(tiny_tree: Path, inputs: Path, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    pairs = write_csv(inputs, "one.csv", ["p0.png,g0.png,upper,m0.png"])
    result = ootd_batch([str(pairs), "--checkpoints", str(tiny_tree), "-o", str(tmp_path / "out"), "--engine", "ray",
                         "--workers", "1000", "--gpus-per-worker", "0"],
                        patch="import ray; ray.init = lambda *a, **k: sys.exit('ray.init was called')", limit=60)
    assert result.returncode == 2, result.stderr
    cpus = len(os.sched_getaffinity(0))
    assert f"--workers 1000: this machine has {cpus} CPU(s) and each worker needs one" in one_line(result.stderr)
    assert not (tmp_path / "out").exists()


def test_gpus_the_cluster_lacks_are_refused_before_anything_is_written(ray_instance, tiny_tree: Path,  # noqa: ANN001
                                                                      inputs: Path, tmp_path: Path) -> None:
    pairs = write_csv(inputs, "one.csv", ["p0.png,g0.png,upper,m0.png"])
    code, output = batch([str(pairs), "--checkpoints", str(tiny_tree), "-o", str(tmp_path / "out"), "--engine", "ray",
                          "--gpus-per-worker", "1"])
    assert code == 2 and "1 GPU(s) per worker asked, but the Ray cluster has 0" in output, output
    assert not (tmp_path / "out").exists()
