"""`ootd train run --engine ray`: the same fine-tune, data-parallel over Ray Train (TorchTrainer: DDP over
gloo on CPUs, NCCL on GPUs; Ray sets the process group up, nothing here does).

Each worker runs ootd/app/train/loop.py's loop on its share of every global batch (the pairs and draws are the ones
a single worker would use: ootd/training/data.py), with the objective wrapped by `ray.train.torch.prepare_model`,
which averages the gradients. Rank 0 writes the run folder as the local engine does, so RUN, its checkpoints and
`--resume` are the same; the cache and the run folder must be on storage every worker's node sees (on one machine
they are). Without a Ray address in RAY_ADDRESS a private Ray instance starts on this machine.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ootd.app.train.checkpoints import checkpoints
from ootd.app.train.logs import LossLog
from ootd.app.train.loop import TrainOptions, TrainReport, open_run
from ootd.errors import OotdError, UnsupportedError, UsageError
from ootd.training.cache import read_index

logger = logging.getLogger(__name__)


def _worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: load, wrap in DDP, run the loop, report."""
    import ray.train
    import ray.train.torch

    from ootd.app.train.loop import Trainer, run_loop
    from ootd.app.train.models import load_training_models
    from ootd.settings import ModelType

    options: TrainOptions = config["options"]
    context = ray.train.get_context()
    rank, workers = context.get_world_rank(), context.get_world_size()
    index = read_index(options.cache)
    device = options.device if config["gpus"] else "cpu"
    models = load_training_models(options.checkpoints, ModelType.parse(index.model_type), options.settings, device,
                                  options.attention)
    model = ray.train.torch.prepare_model(models.objective, move_to_device=False)
    trainer = Trainer(options, models, index, rank=rank, workers=workers, model=model)
    if options.resume:
        trainer.restore()
    report = run_loop(trainer)
    ray.train.report({"steps": report.steps})  # the losses and sheets are in the run folder, as locally


def _require_ray_train() -> Any:
    """Ray Train is an extra: its absence is one line that says how to install it."""
    try:
        import ray
        import ray.train.torch  # noqa: F401 - the extra's own import check
    except ImportError:
        raise UnsupportedError("--engine ray needs Ray Train: pip install 'ootd[ray-train]'") from None
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
        raise UsageError(f"--workers must be at least 1, got {workers}")
    _require_ray_train()
    index = read_index(options.cache)
    open_run(options, index)
    first = checkpoints(options.output)[-1].step if options.resume else 0
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
    try:
        result = trainer.fit()
    except OotdError:
        raise
    except Exception as exc:  # a worker's failure, as Ray wraps it: its one line
        raise OotdError(f"Ray Train failed: {_one_line(exc)}") from exc
    finally:
        if own:
            ray.shutdown()
    if result.error is not None:
        raise OotdError(f"Ray Train failed: {_one_line(result.error)}")
    return time.perf_counter() - started


def _validations(run: Path, after: int) -> list[dict]:
    import json

    path = run / "validation.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [row for row in map(json.loads, lines) if row["step"] > after]
