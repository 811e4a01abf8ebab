"""A disk that fills up under `ootd serve`'s jobs (its uploads, pictures and masks, all in its temporary folder):
injected at each write of a job in turn, and on a small real filesystem (a tmpfs holding the server's temporary
folder, where the test may mount one). Each time the request is answered 507 with one line naming the file (never a
server path), the earlier job's files are still served whole, nothing temporary is left, and once space is back
the next job is done. FakePipe stands in for the models: the question is the writes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
httpx = pytest.importorskip("httpx")

from tests.helpers.disk import disk_fills_at, fill_leaving, free_up, leftovers, small_filesystem  # noqa: E402
from tests.helpers.fakes import FakePipe  # noqa: E402
from tests.helpers.serving import (  # noqa: E402
    assert_one_line_error,
    live_server,
    pipes_factory,
    tiny_config,
    tryon_files,
    wait_until,
)

FAST = {"category": "upper", "steps": "1", "resolution": "384x512", "seed": "3"}


def _server(tiny_tree: Path):  # noqa: ANN202
    return live_server(tiny_config(tiny_tree, model_type="hd"), models=pipes_factory({"hd": FakePipe("hd")}))


def _first_job(live, example_images: dict[str, Path]) -> dict[str, bytes]:  # noqa: ANN001
    """A job done before the disk fills up: its files' URLs and bytes."""
    job = httpx.post(live.url + "api/jobs", files=tryon_files(example_images), data=FAST, timeout=60).json()["id"]
    wait_until(lambda: httpx.get(live.url + f"api/jobs/{job}", timeout=10).json()["state"] == "done", 60, "a job")
    done = httpx.get(live.url + f"api/jobs/{job}", timeout=10).json()
    return {url: httpx.get(url, timeout=10).content for url in [*done["images"], done["mask"]]}


def _still_served(files: dict[str, bytes]) -> None:
    for url, data in files.items():
        again = httpx.get(url, timeout=10)
        assert again.status_code == 200 and again.content == data, url


def test_a_job_stops_at_each_write_that_does_not_fit(tiny_tree: Path, example_images: dict[str, Path],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with _server(tiny_tree) as live:
        with disk_fills_at(None, monkeypatch) as clean:
            first = _first_job(live, example_images)
        writes = [p.name for p in clean.paths]
        assert len(writes) >= 6  # the three uploads, the picture, the mask, the masked person, the editable mask
        for n, name in enumerate(writes):
            with disk_fills_at(n, monkeypatch) as log:
                answer = httpx.post(live.url + "api/tryon", files=tryon_files(example_images), data=FAST, timeout=60)
            assert log.failed is not None and log.failed.name == name
            message = assert_one_line_error(answer, 507, "no space left on device (", f"/{name})")
            assert str(live.workdir) not in message
            _still_served(first)
            assert not leftovers(live.workdir)
            again = httpx.post(live.url + "api/tryon", files=tryon_files(example_images), data=FAST, timeout=60)
            assert again.status_code == 200, again.text  # space is back: the next job is done
        assert httpx.get(live.url + "api/health", timeout=10).json()["status"] == "ok"


def test_a_job_on_a_small_filesystem(tiny_tree: Path, example_images: dict[str, Path], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with small_filesystem(tmp_path / "small", "16m") as small:
        monkeypatch.setattr(tempfile, "tempdir", str(small))  # the server's temporary folder goes there
        with _server(tiny_tree) as live:
            assert Path(live.workdir).parent == small
            first = _first_job(live, example_images)
            fill_leaving(small, 0)
            answer = httpx.post(live.url + "api/tryon", files=tryon_files(example_images), data=FAST, timeout=60)
            assert_one_line_error(answer, 507, "no space left on device (")
            _still_served(first)
            assert not leftovers(live.workdir)
            free_up(small)
            again = httpx.post(live.url + "api/tryon", files=tryon_files(example_images), data=FAST, timeout=60)
            assert again.status_code == 200, again.text
