"""Schedulers built from the released config the way the original builds them (docs/upstream.md §4), and their
timesteps set for a call."""

from __future__ import annotations

import warnings
from typing import Any

from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
    LCMScheduler,
    TCDScheduler,
    UniPCMultistepScheduler,
)
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from ootd.settings import SchedulerName
from ootd.weights.loading import quiet_loading


def build_scheduler(name: SchedulerName, base_config: dict) -> SchedulerMixin:
    """A fresh scheduler (they keep per-call state). `base_config` is the config as read by the
    class the pipeline folder names, so absent keys carry that class's defaults."""
    with quiet_loading():
        if name is SchedulerName.UNIPC:
            # diffusers 0.24 (the original's) ended UniPC on the smallest training sigma.
            return UniPCMultistepScheduler.from_config(base_config, final_sigmas_type="sigma_min")
        if name is SchedulerName.DPMPP:
            return DPMSolverMultistepScheduler.from_config(base_config, algorithm_type="dpmsolver++")
        if name is SchedulerName.DDIM:
            return DDIMScheduler.from_config(base_config)
        if name is SchedulerName.EULER:
            return EulerDiscreteScheduler.from_config(base_config)
        if name is SchedulerName.LCM:
            return LCMScheduler.from_config(base_config)
        if name is SchedulerName.TCD:
            return TCDScheduler.from_config(base_config)
    raise ValueError(f"unknown scheduler {name}")


# numpy 2 asks `__array__` for a `copy` keyword; torch's Tensor.__array__ has none (2.13 and 2.14 alike), so every
# np.array(tensor) in diffusers' set_timesteps warns. The values are the same; the warning is the two libraries',
# and no release of either changes it: it is silenced for that message, in that call, and nowhere else.
ARRAY_COPY_WARNING = r"__array__ implementation doesn't accept a copy keyword"


def set_timesteps(scheduler: SchedulerMixin, steps: int, device: Any = None) -> None:
    """`scheduler.set_timesteps(steps, device=device)`, without numpy 2's notice about torch's __array__."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=ARRAY_COPY_WARNING, category=DeprecationWarning)
        scheduler.set_timesteps(steps, device=device)
