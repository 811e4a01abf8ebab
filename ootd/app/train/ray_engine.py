"""`ootd train run --engine ray`: the same fine-tune, data-parallel over Ray Train (TorchTrainer: DDP over
gloo on CPUs, NCCL on GPUs; Ray sets the process group up, nothing here does).

Each worker runs ootd/app/train/loop.py's loop on its share of every global batch (the pairs and draws are the ones
a single worker would use: ootd/training/data.py), with the objective wrapped by `ray.train.torch.prepare_model`,
which averages the gradients. Rank 0 writes the run folder as the local engine does, so RUN, its checkpoints and
`--resume` are the same; the cache and the run folder must be on storage every worker's node sees (on one machine
they are). Without a Ray address in RAY_ADDRESS a private Ray instance starts on this machine.

Ctrl-C or SIGTERM to the driver stops the run as locally: the driver asks the workers to stop
(ootd/app/train/stopping.py), they all stop before their next step, rank 0 writes a checkpoint of the last finished
step, and the driver exits 130 or 143. It waits `STOP_WAIT_S` seconds at most (a step still running, a model still
loading); a second signal stops it at once. Either way Ray and the workers it started are shut down.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ootd.app.train.checkpoints import checkpoints
from ootd.app.train.logs import LossLog
from ootd.app.train.loop import TrainOptions, TrainReport, open_run
from ootd.app.train.stopping import StopCheck, StopRequested, clear_stop, request_stop
from ootd.errors import OotdError, UnsupportedError, UsageError
from ootd.training.cache import read_index

logger = logging.getLogger(__name__)

STOP_WAIT_S = 600.0  # after a signal, how long the driver waits for the workers' last checkpoint


def _worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: load, wrap in DDP, run the loop, report."""
    from dataclasses import replace

    import ray.train
    import ray.train.torch

    from ootd.app.train.loop import load_trainable, run_loop

    options: TrainOptions = config["options"]  # a fine-tune's, or a distillation's (DistillOptions)
    context = ray.train.get_context()
    rank, workers = context.get_world_rank(), context.get_world_size()
    index = read_index(options.cache)
    device = options.device if config["gpus"] else "cpu"
    models = load_trainable(replace(options, device=device), index)  # the worker's own model owner
    with models.in_run(str(options.output)):  # from here to its end the run alone trains them
        model = ray.train.torch.prepare_model(models.objective, move_to_device=False)
        trainer = options.make_trainer(models, index, rank=rank, workers=workers, model=model)
        if options.resume:
            trainer.restore()
        try:
            steps = run_loop(trainer, stop=StopCheck(options.output, rank, models.device)).steps
        except StopRequested:  # the driver's stop: rank 0 has checkpointed the last finished step
            steps = trainer.step
    ray.train.report({"steps": steps})  # the losses and sheets are in the run folder, as locally


def _require_ray_train() -> Any:
    """Ray Train is an extra: its absence is one line that says how to install it."""
    from ootd.app.signals import ray_for_a_driver

    try:
        ray = ray_for_a_driver()  # the first import of Ray here keeps a SIGTERM ours (ootd/app/signals.py)
        importlib.import_module("ray.train.torch")  # the extra's own import check
    except ImportError:
        raise UnsupportedError.about("engine", "{@engine} ray needs Ray Train: pip install 'ootd[ray-train]'") from None
    return ray


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    for line in text.splitlines():  # the worker's own error, as Ray quotes it
        if "Error: " in line and not line.startswith(" "):
            return line.split("Error: ", 1)[1].strip()[:400]
    return " ".join(text.split())[:400] or type(exc).__name__


def train_ray(options: TrainOptions, workers: int, gpus: bool, *, explain: bool = False,
              echo: Callable[[str], None] = print) -> TrainReport:
    """The fine-tune over `workers` Ray Train workers (a GPU each with `gpus`); `explain` prints the workers, the
    global batch and one worker's memory estimate first, from the configs (no weights loaded here)."""
    if workers < 1:
        raise UsageError.about("workers", "{@workers} must be at least 1, got {value}", value=workers)
    _require_ray_train()
    index = read_index(options.cache)
    open_run(options, index)
    found = checkpoints(options.output)
    first = found[-1].step if options.resume and found else 0
    if explain:
        from ootd.app.train.plan import ray_explain_lines
        from ootd.settings import ModelType, parse_resolution

        for line in ray_explain_lines(options.checkpoints, ModelType.parse(index.model_type),
                                      parse_resolution(index.resolution), options.settings, workers, gpus):
            echo(line)
    seconds = _fit(options, workers, gpus)
    rows = [row for row in LossLog(options.output / "loss.jsonl").read() if row["step"] > first]
    return TrainReport(rows[-1]["step"] if rows else first, first, [row["loss"] for row in rows],
                       Path(options.output) / "lora.safetensors", _validations(options.output, first), seconds)


def _fit(options: TrainOptions, workers: int, gpus: bool) -> float:
    """Start Ray (unless it runs already), run the workers to the end (returns the seconds they took), and turn a
    worker's failure into one line."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ootd.app.signals import sigterm_kept

    own = not ray.is_initialized()
    try:
        if own:
            with sigterm_kept():
                ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False,
                         logging_level=logging.ERROR)
        started = time.perf_counter()
        storage = (options.output / "ray").resolve()
        trainer = TorchTrainer(
            _worker, train_loop_config={"options": options, "gpus": gpus},
            scaling_config=ScalingConfig(num_workers=workers, use_gpu=gpus, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(name="train", storage_path=str(storage)))
        clear_stop(options.output)  # a stale one, from a driver killed outright
        try:
            result = _fit_stoppable(trainer, options.output)
        except OotdError:
            raise
        except Exception as exc:  # a worker's failure, as Ray wraps it: its one line
            raise OotdError(f"Ray Train failed: {_one_line(exc)}") from exc
    finally:  # also after a signal: the flag goes, and what ray.init started is stopped
        clear_stop(options.output)
        if own:
            ray.shutdown()
    if result.error is not None:
        raise OotdError(f"Ray Train failed: {_one_line(result.error)}")
    return time.perf_counter() - started


def _fit_stoppable(trainer: Any, run: Path) -> Any:
    """`trainer.fit()` in a thread, so this (main) thread keeps the signals: Ray Train's own Ctrl-C handler (it
    aborts the workers, no checkpoint) is installed only from the main thread. On Ctrl-C or SIGTERM the workers
    are asked to stop, and the signal is raised again once they have, or after STOP_WAIT_S."""
    from ootd.app.signals import as_terminated

    done: dict[str, Any] = {}
    finished = threading.Event()  # not Thread.is_alive: a join interrupted by a signal can leave it wrongly False

    def fit() -> None:
        try:
            done["result"] = trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            done["error"] = exc
        finally:
            finished.set()

    thread = threading.Thread(target=fit, name="ray-train-fit", daemon=True)
    thread.start()
    try:
        while not finished.wait(0.5):
            pass
    except KeyboardInterrupt as caught:
        stopping = as_terminated(caught)
        request_stop(run)
        logger.warning("%s: the workers stop after their current step and save a checkpoint (waiting %d s at "
                       "most; a second signal stops at once)", getattr(stopping, "message", "interrupted"),
                       STOP_WAIT_S)
        if not finished.wait(STOP_WAIT_S):  # a second signal raises here: no more waiting
            logger.warning("the workers did not stop within %d s: stopping them without a checkpoint",
                           STOP_WAIT_S)
        raise stopping from None
    if "error" in done:
        raise done["error"]
    return done["result"]


def _validations(run: Path, after: int) -> list[dict]:
    import json

    path = run / "validation.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [row for row in map(json.loads, lines) if row["step"] > after]
