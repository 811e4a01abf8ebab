"""One thread owns the device: a bounded line of jobs, run one at a time in arrival order.

Whoever waits can see where its job stands (its place in line, then the stage and step the pipeline reports), so
the page can show "2 ahead of you" and then "denoising 7/20". The line is short on purpose: a request that would
wait behind `max_queue` others is refused at once with an estimate of when to retry, instead of hanging.

A job can be cancelled (its client went away, it asked to, or the server is stopping): one that waits leaves the
line at once; the running one stops at its next progress report or denoising step, where the pipeline calls the
job's hooks (`Job.progress`, `Job.step`), which raise the cancellation.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"


class QueueFull(Exception):
    """The line is full; `retry_after` is a guess in whole seconds from recent job durations."""

    def __init__(self, waiting: int, retry_after: int) -> None:
        super().__init__(f"server busy: {waiting} requests are already waiting; retry in about {retry_after} s")
        self.retry_after = retry_after


class ReplicaLost(Exception):
    """The process running the job stopped (a Ray Serve replica killed or out of memory); it is being replaced."""

    retry_after = 5


class Cancelled(Exception):
    """The job was stopped before it finished: its client went away or asked for it."""


class ShuttingDown(Cancelled):
    """The server is stopping: the job was dropped from the line or stopped at its next step."""

    def __init__(self, message: str = "the server is shutting down; retry in a moment") -> None:
        super().__init__(message)


@dataclass(eq=False)
class Job:
    """One request's life: queued -> running (stage, done/total) -> done (result) or failed (error)."""

    spec: Any  # what the runner needs (the service's request)
    folder: Path  # this job's uploads and results; deleted when the job is forgotten
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    state: str = QUEUED
    stage: str = ""
    done: int = 0
    total: int = 0
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None
    finished: float | None = None
    result: Any = None
    error: BaseException | None = None
    _event: threading.Event = field(default_factory=threading.Event, repr=False)
    _cancel: Cancelled | None = field(default=None, repr=False)
    _listeners: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def progress(self, stage: str, done: int, total: int) -> None:
        """The pipeline's progress callback; plain attribute writes, read by the polling thread. Raises the
        cancellation, if any: every stage reports progress, so a cancelled job stops at its next report."""
        self.stage, self.done, self.total = stage, done, total
        self.check()

    def step(self, step: int, t: Any, latents: Any) -> None:
        """The pipeline's per-step hook (ootd/method/sampling.py): stops the denoising loop once cancelled."""
        self.check()

    def check(self) -> None:
        if self._cancel is not None:
            raise self._cancel

    def cancel(self, reason: Cancelled) -> None:
        """Ask the job to stop at its next report or step (the first reason given is the one it fails with)."""
        if self._cancel is None:
            self._cancel = reason

    @property
    def cancelled(self) -> bool:
        return self._cancel is not None

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def when_finished(self, listener: Callable[[], None]) -> None:
        """Call `listener` (from the worker's thread, or now) once the job has finished; at least once."""
        self._listeners.append(listener)
        if self.is_finished:
            listener()

    def _finished(self) -> None:
        self._event.set()
        for listener in list(self._listeners):
            listener()

    @property
    def is_finished(self) -> bool:
        return self._event.is_set()

    def seconds(self) -> dict[str, float]:
        """Time spent waiting in line and running, so far."""
        now = time.perf_counter()
        queued = (self.started or self.finished or now) - self.submitted
        running = (self.finished or now) - self.started if self.started is not None else 0.0
        return {"queue": queued, "run": running}


class Worker:
    """Runs `run(job)` for each submitted job on one thread; keeps the latest `keep` finished jobs."""

    def __init__(self, run: Callable[[Job], Any], max_queue: int, keep: int = 32) -> None:
        self._run = run
        self.max_queue = max_queue
        self.keep = keep
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._durations: deque[float] = deque(maxlen=8)
        self._stopping = False
        self._stop_asked: float | None = None  # when shutdown was first asked for
        self._thread = threading.Thread(target=self._loop, name="ootd-device", daemon=True)
        self.completed = 0

    def start(self) -> None:
        self._thread.start()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def shutdown(self) -> None:
        """Stop taking jobs, fail those waiting, cancel the running one at its next step; returns at once
        (safe to call from any thread, more than once)."""
        with self._cond:
            if self._stop_asked is None:
                self._stop_asked = time.monotonic()
            self._stopping = True
            dropped = list(self._waiting)
            self._waiting.clear()
            running = self._running
            self._cond.notify_all()
        if running is not None:
            running.cancel(ShuttingDown())
        for job in dropped:
            self._finish(job, error=ShuttingDown())

    def stop(self, timeout: float = 10.0) -> bool:
        """`shutdown`, then wait for the thread to end until `timeout` seconds after the first shutdown; False
        if it is still running then (a stage with no step to stop at, such as loading a model)."""
        self.shutdown()
        if self._thread.is_alive():
            self._thread.join(max(0.0, self._stop_asked + timeout - time.monotonic()))
        return not self._thread.is_alive()

    def running(self) -> Job | None:
        with self._cond:
            return self._running

    def cancel(self, job: Job, reason: Cancelled) -> None:
        """A waiting job leaves the line now; the running one stops at its next step."""
        with self._cond:
            waiting = job in self._waiting
            if waiting:
                self._waiting.remove(job)
        if waiting:
            self._finish(job, error=reason)
        elif not job.is_finished:
            job.cancel(reason)

    def check_room(self) -> None:
        """QueueFull now, before a request's body is even read, when the line is already full."""
        with self._cond:
            self._refuse_if_full()

    def submit(self, job: Job) -> int:
        """Put a job in line; its place (1 = next). QueueFull when the line is full (`_full`)."""
        with self._cond:
            if self._stopping:
                raise ShuttingDown()
            self._refuse_if_full()
            self._waiting.append(job)
            self._jobs[job.id] = job
            self._admitted(job)
            return len(self._waiting)

    def _full(self) -> bool:
        """Whether a new job is refused now (called holding the lock): `max_queue` jobs already wait."""
        return len(self._waiting) >= self.max_queue

    def _refuse_if_full(self) -> None:
        if self._full():
            raise QueueFull(len(self._waiting), self._retry_after())

    def _admitted(self, job: Job) -> None:
        """A job has joined the line (called holding the lock): the worker's thread takes it."""
        self._cond.notify_all()

    def get(self, job_id: str) -> Job | None:
        with self._cond:
            return self._jobs.get(job_id)

    def position(self, job: Job) -> int:
        """1 for the next job to run, 2 for the one after...; 0 once it runs or has finished."""
        with self._cond:
            try:
                return self._waiting.index(job) + 1
            except ValueError:
                return 0

    def status(self) -> dict[str, Any]:
        with self._cond:
            return {"waiting": len(self._waiting), "running": self._running is not None,
                    "limit": self.max_queue, "completed": self.completed}

    def _retry_after(self) -> int:
        """Seconds until a slot is likely free: one average job (at least 1 s)."""
        average = sum(self._durations) / len(self._durations) if self._durations else 5.0
        return max(1, round(average))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                job = self._waiting.popleft()
                self._running = job
            job.state, job.started = RUNNING, time.perf_counter()
            try:
                result = self._run(job)
            except BaseException as exc:  # noqa: BLE001 - every failure belongs to the job, the thread lives on
                if not _expected(exc):
                    logger.exception("request %s failed", job.id)
                self._finish(job, error=exc)
            else:
                self._finish(job, result=result)

    def _finish(self, job: Job, result: Any = None, error: BaseException | None = None) -> None:
        job.result, job.error = result, error
        if error is None:
            job.state = DONE
        else:
            job.state = CANCELLED if isinstance(error, Cancelled) and not isinstance(error, ShuttingDown) else FAILED
        job.finished = time.perf_counter()
        with self._cond:
            if self._running is job:
                self._running = None
                self._durations.append(job.finished - (job.started or job.finished))
                self.completed += 1
            forgotten = self._forget_old()
        job._finished()
        for old in forgotten:
            shutil.rmtree(old.folder, ignore_errors=True)

    def _forget_old(self) -> list[Job]:
        finished = [job for job in self._jobs.values() if job.is_finished]
        extra = len(finished) - self.keep + 1  # + 1: the job finishing now is about to count
        forgotten = finished[:max(0, extra)]
        for job in forgotten:
            del self._jobs[job.id]
        return forgotten


def _expected(exc: BaseException) -> bool:
    """Errors with a message for the user (bad input, no person, out of memory): no traceback in the log."""
    from ootd.errors import OotdError

    return isinstance(exc, OotdError | Cancelled) or "out of memory" in str(exc).lower()
