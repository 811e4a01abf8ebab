"""`ootd batch --engine ray`: the local batch engine's pairs, spread over the actors of a Ray cluster.

The driver (this process) does everything the local engine does before a model is loaded - precheck, resume (a
pair whose outputs exist is `skipped` and never dispatched), the checkpoint check - then joins or starts the
cluster and checks its size (`_start`: a bad --address, --workers or --gpus-per-worker fails in one line, in
bounded time, before anything is written), and writes the report, one line per pair as results arrive, through
the local engine itself (`BatchRunner.run`). Only the pairs left to do go to Ray, in the local engine's run order
(model type, garment, person), one at a time to each actor of a pool (`PairWorker`, `ray_pool.ActorPool`): the
pair alone travels (~300 bytes; the config goes to each actor once). Each actor holds one pipeline on one device,
loaded once per model type, and runs each pair with the local engine's per-pair runner and caches, so a garment is
prepared once per actor that sees its pairs, and a pair's outputs, metadata and report line are the ones the local
engine would give.

An actor that dies (killed, out of memory) costs exactly the pair it was running: the pool replaces it and gives
the pair to the replacement, at most `--retries` more times, then reports the pair as an error. A dead actor cleans
nothing: once such a pair is settled the driver removes the temporary files its dead writers left (`Sweeper`,
ootd/app/tryon/tempfiles.py; only ours, only unlocked ones). Pairs are taken
from the run order only as actors free up and results are written as they arrive, so the driver's memory does
not grow with the batch (ray_pool.py says why Ray Data's pool is not used).

Outputs are written by the workers straight into the output folder, atomically (ootd/app/tryon/outputs.py), so a pair
cut short leaves nothing and a retried pair replaces nothing twice; the folder must be the same path on every
node (a shared filesystem), and so must the inputs and checkpoints (docs/commands.md).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ootd.app.batch.cluster import ClusterOptions
from ootd.app.batch.pairs import Pair
from ootd.app.batch.precheck import Precheck
from ootd.app.batch.ray_pool import ActorPool, Lost
from ootd.app.batch.report import BatchSummary, PairReport
from ootd.app.batch.runner import BatchRunner
from ootd.app.signals import (
    Terminated,
    children_stopped_on_failure,
    ray_for_a_driver,
    sigterm_kept,
    sigterm_received,
)
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.job import TryOnJob, plan_job
from ootd.app.tryon.outputs import peak_memory
from ootd.app.tryon.preservation import PreservationChoice
from ootd.app.tryon.tempfiles import Sweeper
from ootd.errors import Namer, OotdError, UsageError, library_name
from ootd.models import Models
from ootd.pipeline_types import Progress

logger = logging.getLogger(__name__)

# Test hook: the index of a pair whose first attempt kills its worker process mid-pair (during denoising).
EXIT_ON_FIRST_ATTEMPT = "OOTD_RAY_TEST_EXIT_PAIR"
STATUS_EVERY = 10.0  # seconds between progress lines on the driver
PROBE_TIMEOUT_S = 5.0  # a HOST:PORT that does not accept a TCP connection by then is unreachable
CONNECT_TIMEOUT_S = 60.0  # joining a cluster that accepts connections but does not answer as Ray's head does


class PairWorker:
    """One Ray actor: one device, one pipeline at a time (its own model owner), the local engine's per-pair runner
    and caches."""

    def __init__(self, config: RunConfig, exit_on_first: int | None = None,
                 preservation: PreservationChoice | None = None, name: Namer = library_name) -> None:
        self.runner = BatchRunner(config, preservation=preservation, name=name)  # makes the actor's model owner
        self.exit_on_first = exit_on_first

    def run(self, pair: Pair, attempt: int) -> tuple[PairReport, dict[str, Any]]:
        import ray

        runner = self.runner
        job = plan_job(runner.config, pair.job_inputs())  # what the driver's precheck planned, made here
        runner.progress = self._exit_mid_pair if attempt == 1 and pair.index == self.exit_on_first else None
        before = self._counters()
        report = runner.run_one(pair, job)
        after = self._counters()
        stats = {key: after[key] - before[key] for key in after}
        stats.update(ran=runner.ran, peak_memory=peak_memory(runner.models.device), loads=runner.models.loads,
                     worker=ray.get_runtime_context().get_worker_id())
        return report, stats

    def _counters(self) -> dict[str, float]:
        runner = self.runner
        return {"load_seconds": runner.models.seconds, "person": runner.persons.computed,
                "garment": runner.garments.computed}

    @staticmethod
    def _exit_mid_pair(stage: str, done: int, total: int) -> None:
        if stage == "denoise":
            os._exit(17)


class RayBatchRunner(BatchRunner):
    """The local engine's run (precheck, resume, report, summary) with the pairs to do executed by Ray."""

    def __init__(self, config: RunConfig, cluster: ClusterOptions, *, report_path: Path | None = None,
                 progress: Progress | None = None, on_report: Callable[[PairReport], None] | None = None,
                 index_path: Path | None = None, status: Callable[[str], None] | None = None,
                 preservation: PreservationChoice | None = None, name: Namer = library_name,
                 models: Models | None = None) -> None:
        super().__init__(config, models, report_path=report_path, progress=progress, on_report=on_report,
                         index_path=index_path, preservation=preservation, name=name)
        self.cluster = cluster
        self.status = status
        self.dispatched = 0  # pairs sent to workers (tests: a resumed batch sends none)
        self.attempts: dict[int, int] = {}  # pair index -> attempts, for the pairs whose worker died
        self.workers = 0
        self._todo = 0  # pairs to do (the precheck's count)
        self._gpus = 0.0
        self._own_ray = False  # this run started or joined Ray (and shuts it down at the end)
        self._loads: dict[str, dict[str, int]] = {}
        self._totals = {"load_seconds": 0.0, "person": 0, "garment": 0}
        self._peak: dict[str, int | None] = {}

    def run(self, pairs: Sequence[Pair]) -> BatchSummary:
        with children_stopped_on_failure():  # a signal inside ray.init: what it had started goes too
            summary = super().run(pairs)
        summary.load_seconds = self._totals["load_seconds"]
        loads: dict[str, int] = {}
        for per_worker in self._loads.values():
            for model, count in per_worker.items():
                loads[model] = loads.get(model, 0) + count
        summary.loads = loads
        summary.prepared = {"person": int(self._totals["person"]), "garment": int(self._totals["garment"])}
        summary.ran, summary.engine = self.ran, {"engine": "ray", "workers": self.workers}
        summary.peak_memory = self._peak or summary.peak_memory
        return summary

    def _start(self, checked: Precheck) -> None:
        """Join (or start) the cluster and size the pool before anything is written; nothing to do: no Ray."""
        self._todo = checked.todo_count
        if not self._todo:
            return
        ray = ray_for_a_driver()
        try:
            if not ray.is_initialized():
                self._own_ray = True  # also when interrupted half-way: what ray.init started is stopped
                with sigterm_kept():
                    _connect(ray, self.cluster)
            self.workers, self._gpus = _width(ray, self.cluster)
        except BaseException:
            self._stop()
            raise

    def _stop(self) -> None:
        if self._own_ray:
            import ray

            self._own_ray = False
            ray.shutdown()

    def _execute(self, order: Iterator[tuple[Pair, TryOnJob]]) -> Iterator[PairReport]:
        """The reports of the pairs to do (given in run order, `self._todo` of them), in the order they finish on
        the cluster."""
        if not self._todo:
            return
        import ray

        gpus = self._gpus
        config = self.config if gpus or self.config.device else dataclasses.replace(self.config, device="cpu")
        hook = os.environ.get(EXIT_ON_FIRST_ATTEMPT)
        actor = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0, max_task_retries=0)(PairWorker)
        # the config travels inside each actor's creation (a few KB), never through the object store: an object
        # this driver owns there is one Ray's threads try to recover when a signal to the process group stops the
        # node, and a failed recovery ends this process at once (exit 1: no page, no report, no resume hint)
        pool = ActorPool(ray, lambda: actor.remote(config, int(hook) if hook else None, self.preservation,
                                                   self.name),
                         lambda worker, item, attempt: worker.run.remote(item[0], attempt),
                         self.workers, self.cluster.retries + 1, key=lambda item: item[0].index)
        self.dispatched = self._todo
        meter = _Meter(self._todo, self.status)
        results = pool.results(order)
        sweeper = Sweeper()
        try:
            for (pair, job), result in results:
                if isinstance(result, Lost) or pair.index in pool.attempts:  # a worker died on it: its files
                    sweeper.settled(job.targets.all())  # half-written by that worker go, now it is settled
                if isinstance(result, Lost):
                    report = PairReport.of(
                        pair, "error", job.planned_record(),
                        error=f"the worker running this pair died on each of its {result.attempts} attempt(s) "
                              "(killed, or out of memory?); see the Ray logs on its node")
                else:
                    report, stats = result
                    self._absorb(stats)
                meter.tick()
                yield report
        except ray.exceptions.RayTaskError as exc:  # the per-pair runner lets only a full disk out, as locally
            cause = getattr(exc, "cause", None)
            if isinstance(cause, OotdError):
                raise cause from None
            _stopped_by_sigterm()
            raise OotdError(f"a Ray worker failed: {' '.join(str(exc).split())[:500]}") from None
        except ray.exceptions.RayError as exc:  # the cluster itself failed (not a pair, not a worker's death)
            _stopped_by_sigterm()
            raise OotdError(f"the Ray cluster failed: {' '.join(str(exc).split())[:500]}") from None
        finally:
            results.close()
            self.attempts = pool.attempts
            sweeper.finish()
        meter.finish()

    def _absorb(self, stats: dict[str, Any]) -> None:
        if not stats:
            return
        for key in self._totals:
            self._totals[key] += stats.get(key, 0)
        self.ran = stats.get("ran") or self.ran
        self._loads[stats["worker"]] = stats["loads"]  # per process: a replaced actor starts from zero
        for key, value in (stats.get("peak_memory") or {}).items():
            if value is not None:
                self._peak[key] = max(value, self._peak.get(key) or 0)


def _stopped_by_sigterm() -> None:
    """A Ray failure after SIGTERM reached this driver is that signal's doing (sent to the group, it stopped Ray's
    processes too): the batch was stopped, not failed (exit 143, the page and report say "interrupted")."""
    if sigterm_received():
        raise Terminated() from None


def _local_cpus() -> int:
    """The CPUs this process may run on (a container's or taskset's limit, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _connect(ray: Any, cluster: ClusterOptions) -> None:
    """Join the cluster at `address` (bounded: a TCP probe, then a trial join of at most CONNECT_TIMEOUT_S), or
    start a private instance sized by --workers (one CPU each, never more workers than this machine's CPUs)."""
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": _ray_log_level()}
    if cluster.address is None:
        cpus = _local_cpus()
        if cluster.workers is not None and cluster.workers > cpus:
            raise UsageError.about("workers", "{@workers} {value}: this machine has {cpus} CPU(s) and each worker "
                                   "needs one; pass {@workers} {cpus} or fewer, or {@address} a Ray cluster with "
                                   "more", value=cluster.workers, cpus=cpus)
        if cluster.workers:
            options["num_cpus"] = cluster.workers
        _init(ray, options, "a local Ray instance")
        return
    where = f"the Ray cluster at {cluster.address}"
    endpoint = cluster.endpoint()
    if endpoint is not None:
        try:
            socket.create_connection(endpoint, timeout=PROBE_TIMEOUT_S).close()
        except OSError as exc:
            reason = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc)).lower()
            raise UsageError(f"cannot reach {where}: {reason} (is `ray start --head` running there, and is the "
                             "port its GCS port, 6379 by default?)") from None
    problem = _probe_join(cluster.address)
    if problem is not None:
        raise UsageError(f"cannot reach {where}: {problem}")
    options["address"] = cluster.address
    _init(ray, options, where)


def _probe_join(address: str) -> str | None:
    """Join the cluster from a throwaway process first, killed after CONNECT_TIMEOUT_S: a port that accepts
    connections but never answers as Ray's head makes ray.init wait for good, and a Ray client left half-made in
    this process can be neither stopped nor left behind (the process aborts at exit). None: it answered."""
    code = ("import logging, sys, ray; ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False, "
            "logging_level=logging.ERROR); ray.shutdown()")
    try:
        probe = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True,
                               timeout=CONNECT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return (f"no answer from Ray within {CONNECT_TIMEOUT_S:.0f} s (is it a Ray head's GCS port, and does this "
                "machine have the cluster's token, if it uses one?)")
    if probe.returncode == 0:
        return None
    lines = [line for line in probe.stderr.splitlines() if "Error: " in line and not line.startswith(" ")]
    return " ".join((lines[-1].split("Error: ", 1)[1] if lines else f"exit {probe.returncode}").split())[:300]


def _attempt(ray: Any, options: dict[str, Any]) -> str | None:
    """ray.init, its failure as one line (None when it worked)."""
    try:
        ray.init(**options)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        return " ".join(str(exc).split())
    return None


def _init(ray: Any, options: dict[str, Any], where: str) -> None:
    error = _attempt(ray, options)
    if error is not None:
        raise UsageError(f"cannot reach {where}: {error}")


def _ray_log_level() -> int:
    """Ray's own messages on the terminal: errors only, unless ootd logs at debug level (`-v`)."""
    return logging.INFO if logging.getLogger("ootd").isEnabledFor(logging.DEBUG) else logging.ERROR


def _width(ray: Any, cluster: ClusterOptions) -> tuple[int, float]:
    """(workers, GPUs per worker): as asked, else one worker per GPU the cluster has (one CPU worker without)."""
    resources = ray.cluster_resources()
    cluster_gpus = float(resources.get("GPU", 0))
    gpus = cluster.gpus_per_worker if cluster.gpus_per_worker is not None else (1.0 if cluster_gpus else 0.0)
    if gpus > cluster_gpus:
        raise UsageError.about("gpus_per_worker", "{value:g} GPU(s) per worker asked, but the Ray cluster has "
                               "{gpus:g}; pass {@gpus_per_worker} 0 to run on CPUs", value=gpus, gpus=cluster_gpus)
    workers = cluster.workers or (max(1, int(cluster_gpus // gpus)) if gpus else 1)
    cpus = float(resources.get("CPU", 0))
    if workers * gpus > cluster_gpus or workers > cpus:  # the actors would wait for them forever
        raise UsageError.about("workers", "{value} worker(s) need {need:g} GPU(s) and {value} CPU(s); the Ray "
                               "cluster has {gpus:g} and {cpus:g}: pass fewer {@workers}", value=workers,
                               need=workers * gpus, gpus=cluster_gpus, cpus=cpus)
    return workers, gpus


class _Meter:
    """Pairs done / total, rate and ETA, as a line now and then (the first, then every STATUS_EVERY seconds)."""

    def __init__(self, total: int, emit: Callable[[str], None] | None) -> None:
        self.total, self.emit = total, emit
        self.done = 0
        self.start = self.last = time.perf_counter()

    def line(self) -> str:
        elapsed = time.perf_counter() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_text = "-" if eta == float("inf") else f"{eta:.0f} s"
        return f"ray: {self.done}/{self.total} pairs, {rate:.2f} pairs/s, ETA {eta_text}"

    def tick(self) -> None:
        self.done += 1
        now = time.perf_counter()
        if self.emit is not None and (self.done == 1 or now - self.last >= STATUS_EVERY):
            self.last = now
            self.emit(self.line())

    def finish(self) -> None:
        if self.emit is not None and self.done:
            self.emit(self.line())
