"""`ootd serve --engine ray`: the same app (app.py: page, API, limits, auth, host rules) with the try-ons run by
Ray Serve replicas, each holding one pipeline on one device, instead of this process's one device thread.

    ingress (this process)      uvicorn + the FastAPI app of app.py, unchanged; checks and reads each request
                                (forms.py), keeps the jobs (unguessable ids, their files in its temporary folder)
    RayWorker                   the app's worker for this engine: each job goes to the deployment through a
                                DeploymentHandle, as a stream (the replica's id, progress, then the result)
    TryOnReplica (Ray Serve)    one replica per device: TryOnService (service.py) in a temporary folder of its own
                                node; `max_ongoing_requests=1`, so a replica runs one try-on at a time
    Roster (ray_roster.py)      what each replica says of itself at each health check: the replicas /api/health
                                lists (no private Ray module is read)

Ray Serve spreads the requests over the replicas, holds up to `max_queued_requests` (replicas x
--max-queued-per-replica) at the handle and refuses more (BackPressureError -> 503 + Retry-After); the ingress
counts the same jobs and refuses a request before reading its upload when they are already waiting. A replica
that dies (killed, out of memory) is replaced by Ray Serve; the request it was running fails with a 503 and
Retry-After ("the replica ... stopped"), it is not retried (a try-on may take a minute; the client decides), and
the others go on. The replica sends its PNGs back as bytes and the ingress writes them atomically into the job's
folder, so a job's files are served by whichever node holds the ingress, wherever the replica ran, and a replica
that dies mid-request leaves nothing there.

Why the app stays on uvicorn rather than behind `@serve.ingress` in Serve's HTTP proxy: its guards (the upload
limit enforced while the body streams, host and origin rules, auth before any byte is read), the socket policy
(loopback unless --auth), stopping on signals and the per-process temporary folder are the local server's, as
they are, and a job's files stay with the process that holds its id. What Ray Serve does best - placing
replicas on devices and nodes, routing to a free one, bounding the line, health checks, replacing the dead -
it does here through the deployment and its handle (no Serve proxy runs: `proxy_location="Disabled"`). Ray is
imported only when the engine starts (the `ray-serve` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ootd.app.signals import children_stopped_on_failure, descendants, ray_for_a_driver, sigterm_kept, wait_ended
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.tempfiles import clean_stale_temps
from ootd.errors import UsageError
from ootd.imaging.atomic import write_bytes_atomic
from ootd.serve.ray_replica import TEST_EXIT, TEST_HOLD, TryOnReplica
from ootd.serve.ray_roster import deployment_status, forget, list_replicas, start_roster
from ootd.serve.service import Finished
from ootd.serve.worker import RUNNING, Cancelled, Job, QueueFull, ReplicaLost, ShuttingDown, Worker
from ootd.serve.workspace import remove_dead

logger = logging.getLogger(__name__)

APP_NAME = "ootd"
DEPLOYMENT = "TryOnReplica"
HEARD = ("device", "precision", "attention", "models_loaded", "completed")  # what a replica reports of itself
REFRESH_S = 0.5  # how often the ingress reads which replicas run (the roster) and Ray Serve's status


@dataclass(frozen=True)
class RayOptions:
    """Where the replicas run and how many (`--address`, `--replicas`, `--gpus-per-replica`, ...)."""

    address: str | None = None  # None: a private Ray instance on this machine; "auto" or HOST:PORT: join one
    replicas: int = 1
    gpus_per_replica: float | None = None  # None: 1 when the cluster has GPUs, else 0 (CPU replicas)
    cpus_per_replica: float = 1.0
    max_queued_per_replica: int = 2  # requests waiting at the handle per replica; more get 503 + Retry-After
    health_check_period_s: float = 5.0

    def validate(self) -> None:
        if self.replicas < 1:
            raise UsageError(f"--replicas must be at least 1, got {self.replicas}")
        if self.gpus_per_replica is not None and self.gpus_per_replica < 0:
            raise UsageError(f"--gpus-per-replica must be 0 or more, got {self.gpus_per_replica}")
        if self.max_queued_per_replica < 0:
            raise UsageError(f"--max-queued-per-replica must be 0 or more, got {self.max_queued_per_replica}")

    @property
    def max_queued(self) -> int:
        return self.replicas * self.max_queued_per_replica


class RayWorker(Worker):
    """The app's worker for the Ray engine: jobs go to the deployment's handle, one stream each (a thread per
    job in flight, at most replicas x (1 + queued per replica)); the line, the finished jobs and their
    clean-up are the local worker's."""

    def __init__(self, handle: Any, options: RayOptions, keep: int = 32, roster: Any = None) -> None:
        super().__init__(lambda job: None, max(1, options.max_queued), keep)
        self.options = options
        self._handle = handle
        self._roster = roster  # what the replicas say of themselves (ray_roster.py)
        self.deployment: dict[str, Any] | None = None  # Ray Serve's public status of the deployment
        self._streams: dict[str, Any] = {}
        self._threads: set[threading.Thread] = set()
        self._replicas: list[dict[str, Any]] = []  # the roster's list: the replicas heard from lately
        self._heard: dict[str, dict[str, Any]] = {}  # replica id -> its latest `about`
        self._on: dict[str, str] = {}  # job id -> replica id, while it runs
        self._halt = threading.Event()  # set by stop(): the replica watch ends
        self._monitor = threading.Thread(target=self._watch, name="ootd-replicas", daemon=True)

    def start(self) -> None:
        self._refresh()
        self._monitor.start()

    def _full(self) -> bool:
        """Every replica runs a job and the handle's line is full (the local worker's `check_room` and `submit`
        refuse a job then, before its body is read and when it is put in line)."""
        return self._in_flight() >= self._capacity()

    def _capacity(self) -> int:
        return self.options.replicas + self.options.max_queued

    def _admitted(self, job: Job) -> None:
        """A stream of its own to the deployment, on a thread of its own."""
        thread = threading.Thread(target=self._drive, args=(job,), name=f"ootd-job-{job.id[:8]}", daemon=True)
        self._threads.add(thread)
        thread.start()

    def _in_flight(self) -> int:
        return sum(1 for job in self._jobs.values() if not job.is_finished)

    def running(self) -> Job | None:
        with self._cond:
            return next((job for job in self._jobs.values() if job.state == RUNNING), None)

    def cancel(self, job: Job, reason: Cancelled) -> None:
        if job.is_finished:
            return
        job.cancel(reason)
        with self._cond:
            stream = self._streams.get(job.id)
        if stream is not None:
            stream.cancel()

    def shutdown(self) -> None:
        with self._cond:
            if self._stop_asked is None:
                self._stop_asked = time.monotonic()
            self._stopping = True
            unfinished = [job for job in self._jobs.values() if not job.is_finished]
        for job in unfinished:
            self.cancel(job, ShuttingDown())

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the jobs and the replica watch: once this returns, nothing here calls Ray (a call after the
        caller's ray.shutdown would start a new Ray instance, in this server's temporary folder)."""
        self.shutdown()
        deadline = self._stop_asked + timeout
        self._halt.set()
        for thread in [*self._threads, *([self._monitor] if self._monitor.ident is not None else [])]:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def status(self) -> dict[str, Any]:
        with self._cond:
            running = len(self._on)
            return {"waiting": len(self._waiting), "running": running > 0, "running_jobs": running,
                    "limit": self.options.max_queued, "completed": self.completed}

    def replicas(self) -> list[dict[str, Any]]:
        """The roster's latest list of the replicas, each with the newest of what it reported there and what it
        told this ingress with a request's events."""
        with self._cond:
            busy = set(self._on.values())
            merged = []
            for replica in self._replicas:
                about, told = replica["about"], self._heard.get(replica["id"], {})
                if told.get("reported", 0) > about.get("reported", 0):
                    about = told
                merged.append({**{key: value for key, value in replica.items() if key != "about"},
                               **{key: about[key] for key in HEARD if key in about}, "busy": replica["id"] in busy})
            return merged

    def heard(self) -> list[dict[str, Any]]:
        with self._cond:
            return list(self._heard.values())

    def _retry_after(self) -> int:
        """One average job divided over the replicas (at least 1 s)."""
        average = sum(self._durations) / len(self._durations) if self._durations else 5.0
        return max(1, round(average / max(1, self.options.replicas)))

    def _drive(self, job: Job) -> None:
        """Send the job, follow its stream, and finish it with the result or the reason it has none."""
        result, error = None, None
        try:
            stream = self._handle.options(stream=True).run.remote(job.spec, job.id)
            with self._cond:
                self._streams[job.id] = stream
            if job.cancelled:
                stream.cancel()
            for event in stream:
                result, error = self._event(job, event)
            if result is None and error is None:
                error = ReplicaLost("the replica ended the request without an answer")
        except BaseException as exc:  # noqa: BLE001 - every failure belongs to the job
            error = self._failure(job, exc)
        finally:
            with self._cond:
                self._streams.pop(job.id, None)
                replica = self._on.pop(job.id, None)
                if job in self._waiting:
                    self._waiting.remove(job)
                if replica is not None and job.started is not None:
                    self._durations.append(time.perf_counter() - job.started)
                    self.completed += 1
                self._threads.discard(threading.current_thread())
            shutil.rmtree(job.folder / "inputs", ignore_errors=True)  # as the local service does, whatever happened
            clean_stale_temps(job.folder / "results")
            if isinstance(error, ReplicaLost):  # a replica that died cleans nothing: its folder, if on this node
                remove_dead()
            if error is not None and job._cancel is not None and not isinstance(error, ReplicaLost | QueueFull):
                error = job._cancel
            self._finish(job, result=result if error is None else None, error=error)

    def _event(self, job: Job, event: dict[str, Any]) -> tuple[Finished | None, BaseException | None]:
        kind = event["kind"]
        if kind == "start":
            with self._cond:
                if job in self._waiting:
                    self._waiting.remove(job)
                self._on[job.id] = event["replica"]
                self._heard[event["replica"]] = {**event, "kind": None}
            job.state, job.started = RUNNING, time.perf_counter()
        elif kind == "progress":
            job.stage, job.done, job.total = event["stage"], event["done"], event["total"]
        elif kind == "done":
            with self._cond:
                self._heard[event["about"]["replica"]] = event["about"]
            return self._store(job, event), None
        elif kind == "error":
            return None, event["error"]
        return None, None

    def _store(self, job: Job, event: dict[str, Any]) -> Finished:
        """The replica's PNGs, written atomically into the job's folder under their own names."""
        finished: Finished = event["finished"]
        results = job.folder / "results"
        results.mkdir(parents=True, exist_ok=True)
        files = {}
        for name, data in event["files"].items():
            target = write_bytes_atomic(results / Path(name).name, data, overwrite=True)
            files[target.name] = target
        shutil.rmtree(job.folder / "inputs", ignore_errors=True)
        return dataclasses.replace(finished, files=files, replica=self._on.get(job.id))

    def _failure(self, job: Job, exc: BaseException) -> BaseException:
        from ray import exceptions as ray_errors
        from ray.serve.exceptions import BackPressureError, RequestCancelledError

        if isinstance(exc, BackPressureError):
            return QueueFull(len(self._waiting), self._retry_after())
        if isinstance(exc, RequestCancelledError | asyncio.CancelledError) or job.cancelled:
            return job._cancel or Cancelled("cancelled")
        if isinstance(exc, ray_errors.RayActorError | ray_errors.ActorDiedError):
            with self._cond:
                replica = self._on.get(job.id, "?")
            forget(self._roster, replica)  # health lists it no more; its replacement reports itself
            logger.warning("the replica %s running request %s stopped: %s", replica, job.id, _one_line(exc))
            return ReplicaLost(f"the replica running this request ({replica}) stopped; Ray Serve is replacing "
                               "it: retry in a moment")
        if isinstance(exc, ray_errors.RayError):
            logger.error("request %s: Ray failed: %s", job.id, _one_line(exc))
            return ReplicaLost(f"the cluster could not run this request ({type(exc).__name__}); retry in a moment")
        return exc

    def _watch(self) -> None:
        while not self._halt.wait(REFRESH_S) and not self._stopping:
            with contextlib.suppress(Exception):  # a controller busy replacing a replica answers next time
                self._refresh()

    def _refresh(self) -> None:
        import ray

        listed = list_replicas(ray, self._roster) if self._roster is not None else []
        status = deployment_status(APP_NAME, DEPLOYMENT)
        with self._cond:
            self._replicas, self.deployment = listed, status


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


class RayService:
    """What health says about the engine: the configured device words until a replica reports its own, the
    models the replicas hold, and the replicas (Ray Serve's list, with what each last reported)."""

    def __init__(self, config: RunConfig, worker: RayWorker) -> None:
        from ootd.app.tryon.loader import models_for
        from ootd.models import Keep

        self.config, self.worker = config, worker
        # this process's models: the classifier only (requests are classified here, the replicas run the try-ons)
        self.models = models_for(config, Keep(classifier=True))

    def describe(self) -> dict[str, Any]:
        heard = self.worker.heard()
        latest = heard[-1] if heard else {}
        config = self.config
        return {"engine": "ray", "device": latest.get("device", config.device or "auto"),
                "precision": latest.get("precision", config.precision.value),
                "attention": latest.get("attention", config.attention.value), "replicas": self.worker.replicas(),
                "deployment": self.worker.deployment}

    def loaded(self) -> list[str]:
        replicas = self.worker.replicas()
        return sorted({model for replica in replicas for model in replica.get("models_loaded", ())},
                      key=["hd", "dc"].index)


@dataclass
class RayEngine:
    """One app's service and worker for this engine (create_app's `engine`)."""

    service: RayService
    worker: RayWorker


@dataclass
class Deployment:
    """The running deployment: its handle, and a fresh engine for each app in front of it."""

    config: RunConfig
    options: RayOptions
    handle: Any
    roster: Any = None

    def engine(self, keep: int = 32) -> RayEngine:
        worker = RayWorker(self.handle, self.options, keep, self.roster)
        return RayEngine(RayService(self.config, worker), worker)


def _connect(ray: Any, options: RayOptions) -> None:
    """Join the cluster at `address`, or start a private instance on this machine (nothing: already joined)."""
    level = logging.INFO if logging.getLogger("ootd").isEnabledFor(logging.DEBUG) else logging.ERROR
    # Serve's router logs to the terminal (slow replica answers on a busy machine, its start): errors only
    logging.getLogger("ray.serve").setLevel(level)
    if ray.is_initialized():
        return
    init: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": level}
    if options.address:
        init["address"] = options.address
    else:
        init["num_cpus"] = os.cpu_count() or 1
        init["_temp_dir"] = _ray_folder()
    try:
        ray.init(**init)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"the Ray cluster at {options.address}" if options.address else "a local Ray instance"
        raise UsageError(f"cannot reach {where}: {' '.join(str(exc).split())}") from None


def _ray_folder() -> str:
    """Where a private instance keeps its session (logs, sockets): under $RAY_TMPDIR, else /tmp, as documented;
    not in $TMPDIR (where Ray would put it on Linux), the server's temporary folder, left empty when it stops."""
    return os.path.join(os.environ.get("RAY_TMPDIR") or "/tmp", "ray")


def _gpus(ray: Any, options: RayOptions) -> float:
    """GPUs per replica, once the cluster is known to have room for every replica (Ray Serve would otherwise
    wait for them forever)."""
    resources = ray.cluster_resources()
    cluster_gpus, cluster_cpus = float(resources.get("GPU", 0)), float(resources.get("CPU", 0))
    gpus = options.gpus_per_replica if options.gpus_per_replica is not None else (1.0 if cluster_gpus else 0.0)
    if gpus * options.replicas > cluster_gpus:
        raise UsageError(f"{options.replicas} replica(s) x {gpus:g} GPU(s) asked, but the Ray cluster has "
                         f"{cluster_gpus:g}: pass fewer --replicas or --gpus-per-replica 0")
    if options.cpus_per_replica * options.replicas > cluster_cpus:
        raise UsageError(f"{options.replicas} replica(s) need {options.cpus_per_replica * options.replicas:g} "
                         f"CPU(s), but the Ray cluster has {cluster_cpus:g}: pass fewer --replicas")
    return gpus


def deploy(config: RunConfig, options: RayOptions, one_model: bool = False, roster: Any = None) -> Any:
    """Start (or replace) the deployment and wait until its replicas run; its handle. `roster`: where the
    replicas report themselves (ray_roster.py)."""
    import ray
    from ray import serve

    gpus = _gpus(ray, options)
    if not gpus and not config.device:
        config = dataclasses.replace(config, device="cpu")
    serve.start(proxy_location="Disabled", logging_config={"log_level": "WARNING"})
    deployment = serve.deployment(
        name=DEPLOYMENT, num_replicas=options.replicas, max_ongoing_requests=1,
        # Ray Serve takes no 0 ("-1 (no limit) or a positive integer"): with K = 0 the ingress's count is the limit
        max_queued_requests=options.max_queued or -1,
        health_check_period_s=options.health_check_period_s,
        ray_actor_options={"num_cpus": options.cpus_per_replica, "num_gpus": gpus},
    )(TryOnReplica)
    app = deployment.bind(config, one_model, os.environ.get(TEST_EXIT) or None, os.environ.get(TEST_HOLD) or None,
                          roster)
    return serve.run(app, name=APP_NAME, route_prefix=None)


@contextmanager
def deployed(config: RunConfig, options: RayOptions, one_model: bool = False) -> Iterator[Deployment]:
    """Connect (or start Ray), deploy, yield; then delete the deployment, and stop Serve and Ray when they were
    started here (a joined cluster keeps running, without this deployment)."""
    ray = ray_for_a_driver()
    from ray import serve

    options.validate()
    started, roster, instance = not ray.is_initialized(), None, set()
    try:
        with children_stopped_on_failure():  # after ray.shutdown: a node whose start was cut short is not Ray's
            try:
                with sigterm_kept():  # Ray's handler exits at once on SIGTERM: this process's stays
                    _connect(ray, options)
                roster = start_roster(ray, options.health_check_period_s)
                yield Deployment(config, options, deploy(config, options, one_model, roster), roster)
            finally:
                if ray.is_initialized():  # else Serve would start a Ray instance of its own to delete nothing from
                    with contextlib.suppress(Exception):  # the replicas stop gracefully: their folders go
                        serve.delete(APP_NAME)
                    with contextlib.suppress(Exception):
                        if roster is not None:
                            ray.kill(roster)
                if started:  # Serve's controller goes with the instance (also one half-started when interrupted)
                    instance = descendants()
                    ray.shutdown()
    finally:  # a replica stopped inside its constructor (a signal while it started) could not remove its folder
        if instance:
            wait_ended(instance)
            remove_dead()


@contextmanager
def ray_engine(config: RunConfig, options: RayOptions, one_model: bool = False, keep: int = 32,
               ) -> Iterator[RayEngine]:
    """The engine of `ootd serve --engine ray` (server.serve's `engine`): one deployment, one app in front."""
    with deployed(config, options, one_model) as deployment:
        yield deployment.engine(keep)
