"""The Ray engine's worker without a cluster: a stand-in handle plays Ray Serve's answers (a stream of events,
back-pressure, a replica's death) so each maps to the job state and the HTTP answer it must give."""

from __future__ import annotations

import pickle
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
pytest.importorskip("ray.serve", reason="the ray-serve extra is not installed (pip install -e .[ray-serve])")

from ray.exceptions import ActorDiedError  # noqa: E402
from ray.serve.exceptions import BackPressureError  # noqa: E402

from ootd.app.tryon.masking import no_person_error  # noqa: E402
from ootd.errors import NoPersonError  # noqa: E402
from ootd.serve.messages import classify  # noqa: E402
from ootd.serve.ray_engine import REFRESH_S, RayOptions, RayWorker  # noqa: E402
from ootd.serve.ray_replica import _portable  # noqa: E402
from ootd.serve.service import Finished  # noqa: E402
from ootd.serve.worker import DONE, FAILED, Job, QueueFull, ReplicaLost  # noqa: E402


class Handle:
    """Answers every call with `events` (dicts, or an exception raised in their place)."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events
        self.run = self

    def options(self, **_: Any) -> Handle:
        return self

    def remote(self, spec: Any, job_id: str) -> Any:
        def stream() -> Any:
            for event in self.events:
                if isinstance(event, BaseException):
                    raise event
                yield event
        return Stream(stream())


class Stream:
    def __init__(self, events: Any) -> None:
        self.events = events

    def __iter__(self) -> Any:
        return self.events

    def cancel(self) -> None:
        pass


def run(tmp_path: Path, events: list[Any]) -> Job:
    worker = RayWorker(Handle(events), RayOptions(replicas=2, max_queued_per_replica=1))
    job = Job(None, tmp_path / "job")
    (job.folder / "inputs").mkdir(parents=True)
    worker.submit(job)
    assert job.wait(10)
    assert not (job.folder / "inputs").exists()  # the uploads go, whatever happened
    return job


START = {"kind": "start", "replica": "r1"}


def test_a_streamed_result_is_written_into_the_job_folder(tmp_path: Path) -> None:
    finished = Finished(["a.png"], "m.png", "mp.png", "pm.png", 1, "hd", {}, {})
    job = run(tmp_path, [START, {"kind": "progress", "stage": "denoise", "done": 1, "total": 2},
                         {"kind": "done", "finished": finished, "files": {"a.png": b"png", "../m.png": b"mask"},
                          "about": {"replica": "r1"}}])
    assert job.state == DONE and job.result.replica == "r1" and (job.stage, job.done) == ("denoise", 1)
    assert {name: path.read_bytes() for name, path in job.result.files.items()} == {"a.png": b"png",
                                                                                     "m.png": b"mask"}
    assert all(path.parent == job.folder / "results" for path in job.result.files.values())
    assert not list((job.folder / "results").glob(".*"))  # no temporary file left


@pytest.mark.parametrize(("event", "kind", "status", "word"), [
    (BackPressureError(num_queued_requests=2, max_queued_requests=2), QueueFull, 503, "busy"),
    (ActorDiedError(), ReplicaLost, 503, "stopped"),
])
def test_ray_serve_failures_become_their_answers(tmp_path: Path, event: BaseException, kind: type, status: int,
                                                 word: str) -> None:
    job = run(tmp_path, [START, event] if kind is ReplicaLost else [event])
    assert job.state == FAILED and isinstance(job.error, kind), job.error
    code, message, headers = classify(job.error)
    assert code == status and word in message and int(headers["Retry-After"]) >= 1, (code, message)
    assert not (job.folder / "results").exists()


def test_a_job_beyond_the_replicas_and_their_lines_is_refused_until_one_ends(tmp_path: Path) -> None:
    """One replica, no line at the handle: while a job is in flight a second is refused (503 busy) before its body
    is read and when put in line; once the first ends, a job gets in again."""
    release = threading.Event()

    def events() -> Any:
        yield START
        release.wait(10)

    handle = Handle([])
    handle.remote = lambda spec, job_id: Stream(events())
    worker = RayWorker(handle, RayOptions(replicas=1, max_queued_per_replica=0))
    jobs = [Job(None, tmp_path / name) for name in ("first", "second", "third")]
    assert worker.submit(jobs[0]) == 1
    with pytest.raises(QueueFull):
        worker.check_room()
    with pytest.raises(QueueFull):
        worker.submit(jobs[1])
    release.set()
    assert jobs[0].wait(10) and not jobs[1].is_finished and worker.get(jobs[1].id) is None
    worker.check_room()
    worker.submit(jobs[2])
    assert jobs[2].wait(10)


def test_a_replica_error_comes_back_as_its_kind(tmp_path: Path) -> None:
    job = run(tmp_path, [START, {"kind": "error", "error": _portable(NoPersonError("no person detected in p.png"))}])
    assert isinstance(job.error, NoPersonError) and classify(job.error)[0] == 400
    found = no_person_error("p.png", "or send a mask")  # what the pose step raises: made from its parts
    job = run(tmp_path, [START, {"kind": "error", "error": _portable(found)}])
    assert type(job.error) is type(found) and str(job.error) == str(found) and classify(job.error)[0] == 400

    class Parts(NoPersonError):  # a library error made from its parts that does not pickle (as PersonNotFound did)
        def __init__(self, photo: str, remedy: str) -> None:
            super().__init__(f"no person detected in {photo} ({remedy})")

    back = pickle.loads(pickle.dumps(_portable(Parts("p.png", "send a mask"))))  # the nearest kind, its words
    assert type(back) is NoPersonError and str(back) == "no person detected in p.png (send a mask)"
    assert classify(back)[0] == 400
    unpicklable = _portable(QueueFull(3, 7))  # its constructor takes other arguments than its message
    assert "QueueFull" in str(unpicklable) and classify(unpicklable)[0] == 500


def test_no_read_of_ray_is_running_or_begins_once_stop_returns() -> None:
    """The server shuts Ray down right after stop(): a roster read still running, or one begun later, would start
    a new Ray instance (Ray starts one on any call), with its session in the server's temporary folder."""
    worker = RayWorker(Handle([]), RayOptions())
    reads: list[tuple[float, float]] = []
    inside = threading.Event()

    def read() -> None:  # a slow read of the roster and Ray Serve's status
        began = time.monotonic()
        inside.set()
        time.sleep(0.3)
        reads.append((began, time.monotonic()))

    worker._refresh = read  # type: ignore[method-assign]
    worker.start()
    inside.clear()
    assert inside.wait(10)  # the watch is inside a read
    assert worker.stop(5)
    stopped = time.monotonic()
    time.sleep(3 * REFRESH_S)
    assert reads and all(ended <= stopped for _, ended in reads), (reads, stopped)
