"""Temporary files a dead writer left (ootd/app/tryon/tempfiles.py): swept by the run that handed out the work once
the pair or job is settled - the local batch engine and the server here, the Ray engine with a worker killed inside
its write in tests/app/batch/test_ray_sweep.py - only ours, only unlocked ones, only the named files' when asked."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ootd.app.tryon.tempfiles import Sweeper, clean_stale_temps
from tests.helpers.cli import invoke
from tests.helpers.fakes import FakePipe, images_tree, read_report


def _dead_writers_file(folder: Path, target: str) -> Path:
    """What a writer killed inside its write leaves: half a picture under our temporary name, nobody's lock."""
    path = folder / f".{target}.0123456789ab.tmp"
    path.write_bytes(b"\x89PNG\r\n\x1a\n half")
    return path


class _Live:
    """A temporary file of ours that a live writer (another process) holds locked."""

    def __init__(self, folder: Path, target: str) -> None:
        self.path = folder / f".{target}.ba9876543210.tmp"
        self.fd = os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def close(self) -> None:
        os.close(self.fd)


def _not_ours(folder: Path) -> list[Path]:
    files = [folder / ".notes.tmp", folder / ".p0.png.tmp", folder / ".p0.png.0123456789AB.tmp"]
    for path in files:
        path.write_text("mine")
    return files


def test_only_the_named_files_stale_temporaries_go(tmp_path: Path) -> None:
    dead = _dead_writers_file(tmp_path, "a.png")
    other = _dead_writers_file(tmp_path, "b.png")
    live = _Live(tmp_path, "a.png")
    mine = _not_ours(tmp_path)
    try:
        assert clean_stale_temps(tmp_path, {"a.png"}) == [dead]
        assert other.exists() and live.path.exists() and all(p.exists() for p in mine)
        assert clean_stale_temps(tmp_path) == [other]  # without names: every stale one of ours
        assert live.path.exists() and all(p.exists() for p in mine)
    finally:
        live.close()


def test_the_sweeper_lists_a_folder_at_most_once_a_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sweeper = Sweeper(every=3600)
    first = _dead_writers_file(tmp_path, "a.png")
    sweeper.settled([tmp_path / "a.png"])  # the first sweep is at once
    assert not first.exists()
    second = _dead_writers_file(tmp_path, "b.png")
    sweeper.settled([tmp_path / "b.png"])  # within the period: kept for the next
    assert second.exists()
    assert sweeper.finish() == [first, second] and not second.exists()


class _DeadWriterPipe(FakePipe):
    """A FakePipe during whose try-ons a writer in another process dies inside its write of a picture."""

    def __init__(self, *args: object, folder: Callable[[], Path], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.folder, self.left = folder, []

    def generate(self, *args: object, **kwargs: object) -> object:
        self.left.append(_dead_writers_file(self.folder(), f"p{len(self.left)}__g0__0.png"))
        return super().generate(*args, **kwargs)


def test_a_batch_sweeps_what_dead_writers_left_and_nothing_else(models, tmp_path: Path,  # noqa: ANN001
                                                                 example_images: dict[str, Path],
                                                                 tiny_tree: Path) -> None:
    people, garments = images_tree(tmp_path, example_images, people=2, garments=1)
    out = tmp_path / "out"
    out.mkdir()
    pipe = _DeadWriterPipe("hd", folder=lambda: out)
    models.use(pipe)
    mine = _not_ours(out)
    live = _Live(out, "p9__g0__0.png")
    try:
        result = invoke("batch", "--models", people, "--cloths", garments, "--category", "upper", "-o", out,
                        "--checkpoints", tiny_tree, "--steps", "1", "--resolution", "384x512", "--seed", "1")
        assert result.exit_code == 0, result.output
        assert [r["status"] for r in read_report(out / "batch_report.jsonl")] == ["ok", "ok"]
        assert len(pipe.left) == 2 and not any(p.exists() for p in pipe.left)
        assert live.path.exists() and all(p.read_text() == "mine" for p in mine)
    finally:
        live.close()


def test_a_server_job_sweeps_its_folder_once_settled(tiny_tree: Path, example_images: dict[str, Path],
                                                     tmp_path: Path) -> None:
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
    httpx = pytest.importorskip("httpx")
    from tests.helpers.serving import live_server, pipes_factory, tiny_config, tryon_files

    workdir: list[Path] = []
    # the running job's results folder (the only job: its folder is made before its try-on starts)
    pipe = _DeadWriterPipe("hd", folder=lambda: next(workdir[0].glob("jobs/*/results")))
    with live_server(tiny_config(tiny_tree, model_type="hd"), models=pipes_factory({"hd": pipe})) as live:
        workdir.append(Path(live.workdir))
        answer = httpx.post(live.url + "api/tryon", files=tryon_files(example_images), timeout=60,
                            data={"category": "upper", "steps": "1", "resolution": "384x512", "seed": "2"})
        assert answer.status_code == 200, answer.text
        jobs = list((Path(live.workdir) / "jobs").iterdir())
        assert len(jobs) == 1 and pipe.left
        assert not list((jobs[0] / "results").glob(".*.tmp"))
