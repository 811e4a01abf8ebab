"""--max-memory checked before loading: a request that cannot fit the budget even with every memory saving on
stops at once, with what would fit (fewer samples, a lower resolution, a larger budget), instead of loading for
minutes and then running far past the budget.

The check plans with the memory planner (ootd/memory/planner.py, `make_plan`) on the sizes of the models in the
checkpoints tree, built on the meta device from their config files (no weight is read, no memory is used), and
with the most frugal choices the run could still make (a fused attention kernel when the backend is auto): it
refuses only what the planner itself would find unfittable after loading.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ootd.app.tryon.config import ByteSize, RunConfig
from ootd.errors import UsageError
from ootd.settings import RESOLUTIONS, AttentionName, ModelType, Resolution

logger = logging.getLogger(__name__)

FRUGAL_ATTENTION = AttentionName.SDPA  # no score matrix in memory: the least an "auto" backend can need


def model_sizes(checkpoints: Path, model_type: ModelType) -> Any:
    """`ModelSizes` of the models in a checkpoints tree, from their configs alone (built on the meta device)."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPVisionConfig, CLIPVisionModelWithProjection

    from ootd.memory.sizes import ModelSizes
    from ootd.weights.layout import Layout
    from ootd.weights.loading import quiet_loading

    layout = Layout(Path(checkpoints))
    with quiet_loading(), torch.device("meta"):
        components = SimpleNamespace(
            unet_garm=UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(layout.unet_garm(model_type))),
            unet_vton=UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(layout.unet_vton(model_type))),
            vae=AutoencoderKL.from_config(AutoencoderKL.load_config(layout.vae)),
            text_encoder=CLIPTextModel(CLIPTextConfig.from_pretrained(layout.text_encoder)),
            image_encoder=CLIPVisionModelWithProjection(CLIPVisionConfig.from_pretrained(layout.clip)),
        )
    return ModelSizes.from_components(components)


@contextmanager
def _quiet_planner():
    """The planner warns for every plan that does not fit; trying smaller requests is not worth a warning."""
    planner = logging.getLogger("ootd.memory.planner")
    level = planner.level
    planner.setLevel(logging.ERROR)
    try:
        yield
    finally:
        planner.setLevel(level)


def _planner(config: RunConfig, model_type: ModelType, photo_pixels: int = 0) -> Any:
    """fits(resolution, samples) -> (fits, estimated peak bytes) for this config's device, precision, budget."""
    from ootd.memory.estimate import PlanRequest
    from ootd.memory.planner import make_plan
    from ootd.runtime import choose_hardware

    # the GPU runtime is not initialised here: loading sets it up first
    hardware = choose_hardware(config.runtime_request)
    device, profile, precision = hardware.device, hardware.profile, hardware.precision
    attention = FRUGAL_ATTENTION if config.attention is AttentionName.AUTO else config.attention
    sizes = model_sizes(config.checkpoints, model_type)
    guidance = config.sampling.guidance

    def fits(resolution: Resolution, samples: int) -> tuple[bool, int]:
        plan = make_plan(PlanRequest(device, resolution.size, samples, guidance, precision.unet, attention, sizes,
                                     config.max_memory, vae_dtype=precision.vae, profile=profile,
                                     photo_pixels=photo_pixels))
        return plan.fits, int(plan.estimate["peak"])

    return fits


def _most_samples(fits: Any, resolution: Resolution, below: int) -> int:
    """The largest sample count under `below` that fits at `resolution` (0: not even one)."""
    low, high = 0, below - 1  # fits(low) holds (0 trivially); find the last that fits
    while low < high:
        mid = (low + high + 1) // 2
        if fits(resolution, mid)[0]:
            low = mid
        else:
            high = mid - 1
    return low


def check_memory_budget(config: RunConfig, model_types: list[ModelType] | set[ModelType],
                        photo_pixels: int = 0) -> None:
    """With --max-memory: raise a one-line UsageError, before anything is loaded, when the request cannot fit the
    budget with every saving on, naming what would fit. Without a budget nothing is checked here (the pipeline
    plans on the free memory it measures once loaded)."""
    if config.max_memory is None:
        return
    sampling = config.sampling
    for model_type in sorted(set(model_types), key=lambda m: m.value):
        with _quiet_planner():
            fits = _planner(config, model_type, photo_pixels)
            ok, peak = fits(sampling.resolution, sampling.num_samples)
            if ok:
                continue
            options = []  # each as the settings it changes (`{@samples} 2`: each front end names them)
            fewer = _most_samples(fits, sampling.resolution, sampling.num_samples)
            if fewer:
                options.append(f"{{@samples}} {fewer}")
            for resolution in sorted(RESOLUTIONS.values(), key=lambda r: r.width * r.height):
                if resolution.width * resolution.height >= sampling.resolution.width * sampling.resolution.height:
                    continue
                most = _most_samples(fits, resolution, sampling.num_samples + 1)
                if most:
                    fewer_there = f" {{@samples}} {most}" if most < sampling.num_samples else ""
                    options.append(f"{{@resolution}} {resolution}{fewer_there}")
                    break
        budget = config.max_memory if isinstance(config.max_memory, ByteSize) else ByteSize(config.max_memory)
        need = budget.format(peak)  # in the unit the budget was given in, rounded up
        options.append("{@max_memory} {need}")
        raise UsageError.about(
            "max_memory", "{samples} sample(s) at {resolution} need about {need} even with every memory saving on, "
            "more than {@max_memory} {budget}; what would fit: " + ", or ".join(options), value=budget.text,
            samples=sampling.num_samples, resolution=sampling.resolution, need=need, budget=budget.text)


def memory_wanted(config: RunConfig, model_type: ModelType) -> int:
    """Bytes of device memory a try-on of `model_type` with this config wants to run with no memory saving on
    (weights resident, guidance in one batch, no VAE slicing): what a host that holds other models (ComfyUI)
    is asked to free before ootd loads, from the models' configs alone (nothing is read or loaded)."""
    from ootd.memory.estimate import PlanRequest, estimate
    from ootd.runtime import choose_hardware

    hardware = choose_hardware(config.runtime_request)
    attention = FRUGAL_ATTENTION if config.attention is AttentionName.AUTO else config.attention
    sampling = config.sampling
    request = PlanRequest(hardware.device, sampling.resolution.size, sampling.num_samples, sampling.guidance,
                          hardware.precision.unet, attention, model_sizes(config.checkpoints, model_type),
                          vae_dtype=hardware.precision.vae, profile=hardware.profile)
    return int(estimate(request)["peak"])
