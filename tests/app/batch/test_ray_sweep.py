"""`ootd batch --engine ray` with a worker killed (SIGKILL) inside its write of a picture: the pair is retried on a
new worker and finished, and the driver sweeps the dead worker's half-written temporary file as soon as the pair is
settled (before the next pair's report), leaving the files that are not ours and a live writer's. A Ray instance of
its own, whose workers carry the kill (tests/helpers/kill_in_write.py)."""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

import pytest

from ootd.app.batch.cluster import ClusterOptions
from ootd.app.batch.engines import make_engine
from ootd.app.batch.pairs import read_pairs_csv
from tests.helpers import REPO
from tests.helpers.kill_in_write import KILL_IN_WRITE, KILL_PERSON

pytestmark = pytest.mark.slow  # a Ray instance and its actors


@pytest.fixture(scope="module")
def ray_killing(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    ray = pytest.importorskip("ray")
    marker = tmp_path_factory.mktemp("kill") / "killed"
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {KILL_IN_WRITE: str(marker), KILL_PERSON: "a__", "PYTHONPATH": os.pathsep.join(paths)}
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="WARNING",
             runtime_env={"env_vars": env, "worker_process_setup_hook": "tests.helpers.kill_in_write.arm"})
    yield marker
    ray.shutdown()


def test_a_worker_killed_inside_its_write_leaves_nothing_once_the_pair_is_settled(
        ray_killing: Path, tiny_tree: Path, example_images: dict[str, Path], tmp_path: Path) -> None:
    from ootd.app.tryon.config import build_config

    for name, source in (("a.png", "person"), ("p1.png", "person"), ("g0.png", "tshirt"), ("m.png", "mask")):
        shutil.copy(example_images[source], tmp_path / name)
    (tmp_path / "pairs.csv").write_text("person,garment,category,mask\na.png,g0.png,upper,m.png\n"
                                        "p1.png,g0.png,upper,m.png\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".notes.tmp").write_text("mine")  # not ours: stays
    live = out / ".p9__g0__0.png.ba9876543210.tmp"  # ours, but its writer (another process) is alive: stays
    fd = os.open(live, os.O_CREAT | os.O_WRONLY, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    seen: list[list[str]] = []

    def on_report(report: object) -> None:  # what the folder holds of the dead worker's when each pair is settled
        seen.append(sorted(p.name for p in out.glob(".a__*.tmp")))

    config = build_config(checkpoints=tiny_tree, output=out, steps=1, resolution="384x512", seed=3)
    engine = make_engine("ray", config, cluster=ClusterOptions(workers=1, gpus_per_worker=0),
                         report_path=out / "batch_report.jsonl", on_report=on_report)
    try:
        summary = engine.run(read_pairs_csv(tmp_path / "pairs.csv"))
    finally:
        os.close(fd)
    assert ray_killing.exists(), "the worker was not killed inside its write"
    assert engine.attempts == {0: 2}  # pair 0's first worker died, the second finished it
    assert summary.tally.counts == {"ok": 2, "skipped": 0, "error": 0}, summary.tally.errors()
    assert seen == [[], []]  # swept when pair 0 (first in the run order) was settled: before pair 1 ran
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [".notes.tmp", live.name, "batch_report.jsonl", "a__g0__0.png", "p1__g0__0.png"])
