"""Schedulers built from the released config the way the original builds them (docs/upstream.md §4)."""

from __future__ import annotations

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
