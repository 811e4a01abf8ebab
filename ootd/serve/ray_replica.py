"""The Ray Serve replica of `ootd serve --engine ray` (ray_engine.py deploys it): the local engine's TryOnService
in a temporary folder of the replica's own node, one try-on at a time, streamed back to the ingress as events.

The request arrives checked and decoded (forms.py ran in the ingress); the replica runs it through the same
service and job as the local engine, in a thread of its own, so its event loop stays free to stream progress
and to hear a cancellation (the client went away or asked, or the server stops), which stops the try-on at its
next step. Results go back as PNG bytes; the replica's copies are removed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import time
from typing import Any

from ootd.app.tryon.config import RunConfig
from ootd.errors import OotdError
from ootd.serve.ray_roster import forget, report
from ootd.serve.service import Finished, JobSpec, TryOnService
from ootd.serve.worker import Cancelled, Job, _expected

logger = logging.getLogger(__name__)

# Test hooks, read when the deployment starts: a person file name whose request makes its replica exit at its
# first denoising step; a file whose existence holds every replica at its first denoising step.
TEST_EXIT = "OOTD_SERVE_TEST_EXIT"
TEST_HOLD = "OOTD_SERVE_TEST_HOLD"


class TryOnReplica:
    """One Ray Serve replica: the local engine's TryOnService in a temporary folder of this node, one job at a
    time. `run` streams {"kind": "start"}, {"kind": "progress"}..., then {"kind": "done"} or {"kind": "error"}."""

    def __init__(self, config: RunConfig, one_model: bool, exit_on: str | None = None,
                 hold: str | None = None, roster: Any = None) -> None:
        from ray import serve

        from ootd.serve.workspace import Workspace, remove_dead

        remove_dead()  # the folders of replicas and servers killed on this node
        self.workspace = Workspace()
        self.service = TryOnService(config, one_model=one_model)
        self.id = serve.get_replica_context().replica_id.unique_id
        self.exit_on, self.hold = exit_on, hold
        self.completed = 0
        self.started = time.time()
        self.roster = roster  # where this replica says what it is (ray_roster.py), for the ingress's health
        report(roster, self.about())

    def __del__(self) -> None:  # Ray Serve calls it when it stops the replica
        forget(self.roster, self.id)
        with contextlib.suppress(Exception):
            self.workspace.close()

    def check_health(self) -> None:
        """Ray Serve's health check (every health_check_period_s): this replica's folder is there; and a report
        to the roster, so health lists this replica as alive."""
        if not self.workspace.path.is_dir():
            raise RuntimeError(f"the replica's temporary folder {self.workspace.path} is gone")
        report(self.roster, self.about())

    def about(self) -> dict[str, Any]:
        import ray
        from ray.util import get_node_ip_address

        return {"replica": self.id, "node": ray.get_runtime_context().get_node_id(), "node_ip": get_node_ip_address(),
                "pid": os.getpid(), "started": self.started, "reported": time.time(), **self.service.describe(),
                "models_loaded": self.service.loaded(), "completed": self.completed}

    async def run(self, spec: JobSpec, job_id: str) -> Any:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        folder = self.workspace.path / "jobs" / job_id
        job = Job(dataclasses.replace(spec, job=spec.job.relocated(folder / "results")), folder, id=job_id)
        report = job.progress

        def progress(stage: str, done: int, total: int) -> None:
            self._test_hooks(job, stage)
            report(stage, done, total)
            loop.call_soon_threadsafe(events.put_nowait, {"kind": "progress", "stage": stage, "done": done,
                                                          "total": total})

        job.progress = progress  # type: ignore[method-assign]
        yield {"kind": "start", **self.about()}
        task = loop.run_in_executor(None, self.service.run, job)
        try:
            while not task.done():
                getter = asyncio.ensure_future(events.get())
                await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()
            try:
                finished: Finished = task.result()
            except BaseException as exc:  # noqa: BLE001 - the job's failure goes to its client
                if not _expected(exc):
                    logger.exception("request %s failed", job_id)
                yield {"kind": "error", "error": _portable(exc)}
                return
            self.completed += 1
            files = {name: path.read_bytes() for name, path in finished.files.items()}
            yield {"kind": "done", "finished": dataclasses.replace(finished, files={}), "files": files,
                   "about": self.about()}
        except (asyncio.CancelledError, GeneratorExit):  # the client went away or asked: stop at the next step
            job.cancel(Cancelled("cancelled by its client"))
            with contextlib.suppress(BaseException):
                await task
            raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _test_hooks(self, job: Job, stage: str) -> None:
        if stage != "denoise":
            return
        if self.exit_on is not None and job.spec.job.inputs.person_name == self.exit_on:
            os._exit(17)
        while self.hold is not None and os.path.exists(self.hold) and not job.cancelled:
            time.sleep(0.05)


def _portable(exc: BaseException) -> BaseException:
    """The exception itself when it survives pickling as it is, else the nearest of the library's error kinds
    (ootd/errors.py: what the API's statuses are chosen by) with its words: an error made from its parts that
    does not pickle by them still comes back as its kind (a NoPersonError: 400), not as an internal error."""
    import pickle

    try:
        copy = pickle.loads(pickle.dumps(exc))
        if type(copy) is type(exc) and str(copy) == str(exc):
            return exc
    except Exception:  # noqa: BLE001 - any failure to pickle means: send the words
        pass
    for kind in type(exc).__mro__:
        if kind.__module__ == OotdError.__module__ and issubclass(kind, OotdError):
            try:
                return kind(str(exc))
            except Exception:  # noqa: BLE001 - a kind made otherwise: the next one up
                continue
    return OotdError(f"{type(exc).__name__}: {exc}")
