"""Try-on UNet calls, ours and the original's, alternating on the same inputs: per-step figures that a changing
background load (a shared machine) affects alike."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ootd.attention import AttentionFn
from ootd.hardware.device import DeviceInfo
from ootd.hardware.policy import Precision, SpeedOptions
from ootd.method.fusion import TryOnFusion, capture_block_inputs
from ootd.speedups.execution import as_memory_format, temporary_memory_format, uncompiled
from ootd.tools.bench.profiling import load_average
from ootd.tools.bench.reference import original_formulation, sync
from ootd.weights.loading import Components

logger = logging.getLogger(__name__)

Log = Callable[[str], None]


def compare_steps(components: Components, device: DeviceInfo, precision: Precision, *, attention: AttentionFn,
                  resolution: tuple[int, int] = (768, 1024), num_samples: int = 1, guidance: bool = True,
                  repeats: int = 2, speed: SpeedOptions | None = None, log: Log | None = None) -> dict[str, Any]:
    """Alternate `repeats` times: our try-on UNet call (with `attention` and `speed`: memory layout, compile),
    then the original's (default layout, eagerly), on the same random latents and garment features. Reports
    wall and process-CPU seconds of every call, their medians and the original / ours ratios."""
    say = log or (lambda line: logger.info("%s", line))
    dev = device.torch_device
    c = components
    copies = 2 if guidance else 1
    batch = num_samples * copies
    prompt, garment, sample = _random_inputs(c, dev, precision, resolution, batch)
    timestep = torch.tensor(500, device=dev)
    fusion = TryOnFusion(c.unet_vton, attention)
    result: dict[str, Any] = {"resolution": list(resolution), "num_samples": num_samples, "batch": batch,
                              "threads": torch.get_num_threads(), "ours": {"wall": [], "cpu": []},
                              "original": {"wall": [], "cpu": []}}
    outputs: dict[str, torch.Tensor] = {}

    def timed(label: str, run: Callable[[], torch.Tensor]) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        outputs[label] = run()
        sync(dev)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        result[label]["wall"].append(wall)
        result[label]["cpu"].append(cpu)
        say(f"  {label} UNet call: {wall:.2f} s wall, {cpu:.2f} s CPU (load {load_average()})")

    with torch.inference_mode():
        g = torch.cat([garment, torch.zeros_like(garment)]) if guidance else garment
        with capture_block_inputs(c.unet_garm) as captured:
            c.unet_garm(g, 0, encoder_hidden_states=prompt.expand(copies, -1, -1), return_dict=False)
        features = dict(captured)
        del captured
        batch_features = {k: v.repeat_interleave(num_samples, dim=0) for k, v in features.items()}
        sample_index = torch.arange(copies, device=dev).repeat_interleave(num_samples)
        prompts = prompt.expand(batch, -1, -1)
        speed = speed or SpeedOptions()
        ours_sample = as_memory_format(sample, speed.channels_last)
        for _ in range(repeats):
            with fusion.garment(features, sample_index), temporary_memory_format([c.unet_vton], speed.channels_last):
                timed("ours", lambda: c.unet_vton(ours_sample, timestep, encoder_hidden_states=prompts,
                                                  return_dict=False)[0])
            with original_formulation(c.unet_vton, batch_features), uncompiled(c.unet_vton), \
                    temporary_memory_format([c.unet_vton], False):
                timed("original", lambda: c.unet_vton(sample, timestep, encoder_hidden_states=prompts,
                                                      return_dict=False)[0])
        result["max_abs_diff"] = float((outputs["ours"].float() - outputs["original"].float()).abs().max())
    return _with_medians(result)


def _random_inputs(c: Components, dev: torch.device, precision: Precision, resolution: tuple[int, int],
                   batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A prompt (2 tokens), garment latents and a try-on UNet input, drawn from a fixed seed."""
    width, height = resolution
    h, w = height // 8, width // 8
    gen = torch.Generator("cpu").manual_seed(0)
    cross = int(c.unet_vton.config.cross_attention_dim)
    prompt = torch.randn(1, 2, cross, generator=gen).to(dev, precision.unet)
    garment = torch.randn(1, 4, h, w, generator=gen).to(dev, precision.unet)
    sample = torch.randn(batch, 8, h, w, generator=gen).to(dev, precision.unet)
    return prompt, garment, sample


def _with_medians(result: dict[str, Any]) -> dict[str, Any]:
    for label in ("ours", "original"):
        for kind in ("wall", "cpu"):
            result[label][f"median_{kind}"] = statistics.median(result[label][kind])
    result["ratio_wall"] = result["original"]["median_wall"] / result["ours"]["median_wall"]
    result["ratio_cpu"] = result["original"]["median_cpu"] / result["ours"]["median_cpu"]
    return result
