"""The denoising loop as a plain function (k-diffusion style), shared by the pipeline and any reference.

`sample` knows nothing about UNets, guidance or fusion: the caller passes a `model_fn` that turns the
scheduler-scaled latents and a timestep into a noise prediction (guidance already combined), and a
scheduler whose timesteps are already set. Inpainting keeps the unmasked region on the noised original
after every step (docs/upstream.md §4). A per-step `callback` sees the latents after the step and the
blend and may replace them (as diffusers' `callback_on_step_end`), so step-level features (timing,
progress, latent edits, cached-feature modes) plug in without editing the loop.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# (latents after scheduler.scale_model_input, t) -> noise prediction (guidance already combined)
ModelFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# (step index, t, latents after the step and the inpainting blend) -> replacement latents or None
StepCallback = Callable[[int, torch.Tensor, torch.Tensor], "torch.Tensor | None"]


@dataclass(frozen=True)
class Inpaint:
    """Keep the unmasked region: latents = (1 - mask) * noised(original) + mask * latents after every step.

    `original` is the clean latent image (already times the VAE scaling factor), `noise` the noise it is
    re-noised with (the same draw as the initial latents), `mask` 1 where the model repaints.
    """

    original: torch.Tensor
    noise: torch.Tensor
    mask: torch.Tensor

    def blend(self, latents: torch.Tensor, scheduler, step: int) -> torch.Tensor:  # noqa: ANN001
        """The known region at the noise level of the next step (the clean original after the last one)."""
        timesteps = scheduler.timesteps
        known = self.original
        if step < len(timesteps) - 1:
            known = scheduler.add_noise(known, self.noise, timesteps[step + 1 : step + 2])
        return (1 - self.mask) * known + self.mask * latents


def sample(model_fn: ModelFn, scheduler, latents: torch.Tensor, *,  # noqa: ANN001 - any diffusers scheduler
           inpaint: Inpaint | None = None, callback: StepCallback | None = None,
           seed: int | None = None) -> torch.Tensor:
    """Run every timestep of `scheduler` from `latents` (already times `init_noise_sigma`); return the result.
    `seed`: of the noise a stochastic scheduler draws between steps (the consistency samplers'), passed to a
    scheduler whose `step` takes a generator (as diffusers' pipelines do); a deterministic one draws nothing."""
    takes = seed is not None and "generator" in inspect.signature(scheduler.step).parameters
    extra = {"generator": step_noise(seed)} if takes else {}
    for i, t in enumerate(scheduler.timesteps):
        pred = model_fn(scheduler.scale_model_input(latents, t), t)
        latents = scheduler.step(pred, t, latents, return_dict=False, **extra)[0]
        if inpaint is not None:
            latents = inpaint.blend(latents, scheduler, i)
        if callback is not None:
            replaced = callback(i, t, latents)
            if replaced is not None:
                latents = replaced
    return latents


def step_noise(seed: int) -> torch.Generator:
    """The fresh noise of a stochastic scheduler's steps: a CPU stream of its own from the seed, apart from the
    initial noise's (ootd/method/guidance.py), so a seed gives the same pictures on every device."""
    return torch.Generator("cpu").manual_seed((seed * 6_364_136_223_846_793_005 + 1) % 2**63)


def chain(*callbacks: StepCallback | None) -> StepCallback | None:
    """One callback that runs several in order, each seeing the latents the previous one returned."""
    present = [cb for cb in callbacks if cb is not None]
    if not present:
        return None

    def run(step: int, t: torch.Tensor, latents: torch.Tensor) -> torch.Tensor | None:
        changed = None
        for cb in present:
            out = cb(step, t, latents)
            if out is not None:
                latents = changed = out
        return changed

    return run


class StepTimer:
    """A step callback that records seconds per step (waiting for the GPU) and reports progress."""

    def __init__(self, total: int, progress: Callable[[str, int, int], None] | None = None) -> None:
        self.total = total
        self.progress = progress
        self.times: list[float] = []
        self._start = time.perf_counter()

    def __call__(self, step: int, t: torch.Tensor, latents: torch.Tensor) -> None:
        if latents.device.type == "cuda":
            torch.cuda.synchronize(latents.device)
        now = time.perf_counter()
        self.times.append(now - self._start)
        self._start = now
        if self.progress is not None:
            self.progress("denoise", step + 1, self.total)
