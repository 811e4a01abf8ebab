"""`ootd train bench`: seconds per training step and peak memory of the released architectures at random weights
(no checkpoints, no data: random latents and prompt embeddings of the right shapes), next to the estimate of
ootd/training/memory.py. Run one configuration per process: the peak resident memory is the process's."""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from ootd.settings import ModelType, Resolution
from ootd.training.settings import DistillSettings, TrainSettings


@dataclass(frozen=True)
class TrainBench:
    resolution: str
    kind: str  # "fine-tune" or "distill"
    batch_size: int
    checkpointing: bool
    train_garment: bool
    step_seconds: list[float]
    # process-CPU seconds of each step: with one torch thread (OMP_NUM_THREADS=1) the work done, whatever else
    # runs on the machine
    step_cpu_seconds: list[float]
    threads: int  # torch's CPU threads
    peak_rss: int  # bytes, the whole process
    estimate: int  # bytes, ootd/training/memory.py
    baseline_rss: int  # bytes, after loading the models, before the first step

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "median_step_seconds": _median(self.step_seconds),
                "median_step_cpu_seconds": _median(self.step_cpu_seconds)}


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def bench_training(kind: str, resolution: Resolution, settings: TrainSettings, steps: int) -> TrainBench:
    """Build the `kind` architectures with random weights, add the adapters and time `steps` optimizer steps (of a
    distillation with DistillSettings: the teacher's guided step, the target network and the student)."""
    from ootd.app.train.distill import load_distill_models
    from ootd.app.train.plan import training_estimate
    from ootd.models import Models, ModelSource
    from ootd.runtime import RuntimeRequest
    from ootd.settings import PrecisionName
    from ootd.tools.bench.random_weights import build_random_components

    source = ModelSource(components=lambda model_type, precision, device: build_random_components(kind, precision,
                                                                                                  device))
    owner = Models(None, RuntimeRequest(device="cpu", precision=PrecisionName.FP32), source=source)
    distill = isinstance(settings, DistillSettings)
    # the random networks handed to the owner as a source
    models = (load_distill_models(owner, ModelType.HD, settings) if distill
              else owner.trainable(ModelType.HD, settings))
    components = models.pipe.components
    baseline = _peak_rss()
    h, w = resolution.height // 8, resolution.width // 8
    b = settings.batch_size
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(b, 4, h, w, generator=generator) for _ in range(3)]
    cross = int(components.unet_vton.config.cross_attention_dim)
    prompt = torch.randn(b, 2, cross, generator=generator)
    optimizer = torch.optim.AdamW(models.params, lr=settings.learning_rate)
    times, cpu_times = [], []
    for step in range(steps):
        t, cpu = time.perf_counter(), time.process_time()
        optimizer.zero_grad(set_to_none=True)
        d = models.objective.draw(range(b), (4, h, w), 0, step, settings.dropout)
        loss = models.objective(*tensors, prompt, d.noise, d.timesteps, d.drop)
        loss.backward()
        models.objective.release()
        optimizer.step()
        if distill:
            models.objective.update_target(settings.ema_decay)
        times.append(time.perf_counter() - t)
        cpu_times.append(time.process_time() - cpu)
    estimate = training_estimate(models, resolution, settings)
    return TrainBench(str(resolution), "distill" if distill else "fine-tune", b, settings.gradient_checkpointing,
                      settings.train_garment, times, cpu_times, torch.get_num_threads(),
                      _peak_rss(), estimate.total, baseline)
