"""The denoising loop as a plain function, k-diffusion style: the caller supplies the model (guidance, fusion
and conditioning live in `model_fn`), the scheduler and the starting latents; the loop only steps.

Inpainting (docs/upstream.md §4): after every step, the latents outside the mask are replaced by the original
latents noised to the next timestep (the last step uses the original latents themselves), so only the masked
region is generated. A per-step `callback` may return new latents (as diffusers' `callback_on_step_end`),
so step-level features plug in without editing the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# (latents after scheduler.scale_model_input, timestep) -> noise prediction, guidance already combined
ModelFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# (step index, timestep, latents after the step) -> replacement latents, or None to keep them
StepCallback = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor | None]


@dataclass(frozen=True)
class Inpaint:
    """Keep the region outside `mask` (1 = generate) equal to `original`, noised with `noise`."""

    original: torch.Tensor
    noise: torch.Tensor
    mask: torch.Tensor


def sample(model_fn: ModelFn, scheduler: Any, latents: torch.Tensor, *, inpaint: Inpaint | None = None,
           callback: StepCallback | None = None) -> torch.Tensor:
    """Run every timestep of `scheduler` (already `set_timesteps`) from `latents`; return the final latents."""
    timesteps = scheduler.timesteps
    for i, t in enumerate(timesteps):
        pred = model_fn(scheduler.scale_model_input(latents, t), t)
        latents = scheduler.step(pred, t, latents, return_dict=False)[0]
        if inpaint is not None:
            known = inpaint.original
            if i < len(timesteps) - 1:
                known = scheduler.add_noise(known, inpaint.noise, timesteps[i + 1 : i + 2])
            latents = (1 - inpaint.mask) * known + inpaint.mask * latents
        if callback is not None:
            replaced = callback(i, t, latents)
            if replaced is not None:
                latents = replaced
    return latents
