"""The try-on node's performance text: what ran (device, precision, attention, speed), where the seconds went,
which models were loaded for this prompt and which stay for the next, and the memory peaks. The same lines go to
ComfyUI's log."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ootd.app.tryon.job import JobOutcome
    from ootd.pipeline_types import Timings

STAGES = ("classify", "load", "pose_parsing", "preprocess", "encode_person", "conditioning", "encode_garment",
          "garment_unet", "denoise", "decode")


def seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.0f} ms"


def size(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def timing_line(timings: Timings, total: float) -> str:
    """`total 12.31 s: load 5.10 s, ..., denoise 6.00 s (20 steps, 300 ms/step), other 12 ms`: the stages that
    took time, in the order they ran, and what no stage covers, so the parts add up to the total."""
    parts, covered = [], 0.0
    for stage in STAGES:
        value = timings.stages.get(stage)
        if value is None:
            continue
        covered += value
        text = f"{stage} {seconds(value)}"
        if stage == "denoise" and timings.steps:
            text += f" ({len(timings.steps)} steps, {seconds(sum(timings.steps) / len(timings.steps))}/step)"
        parts.append(text)
    if total - covered >= 0.0005:
        parts.append(f"other {seconds(total - covered)}")
    return f"total {seconds(total)}: " + ", ".join(parts)


def describe_run(outcome: JobOutcome, timings: Timings, total: float, loaded: list[str], held: list[str],
                 device: Any = None) -> str:
    """The node's STRING output (one fact a line)."""
    from ootd.app.tryon.outputs import attention_used, peak_memory

    job, record = outcome.job, outcome.record(0)  # what ran, as the pictures' record says it
    sampling, speed = job.config.sampling, record.speed_summary() or "speed exact"
    memory = peak_memory(device)
    lines = [
        f"ootd try-on: {job.describe_models()}, {sampling.num_samples} sample(s) at {sampling.resolution}, "
        f"{sampling.steps} steps, {sampling.scheduler.value}, scale {sampling.guidance_scale:g}, seed "
        f"{sampling.seed}",
        f"ran on {record.device}, {record.precision}, attention {attention_used(record.attention)}, {speed}, "
        f"{record.threads} CPU threads",
        timing_line(timings, total),
        "models: " + (f"{', '.join(loaded)} loaded for this prompt" if loaded else "none loaded (all kept from "
                      "an earlier prompt)") + f"; held for the next: {', '.join(held) or 'none'}",
        f"peak memory: device {size(memory['device_bytes'])}, ComfyUI's process {size(memory['host_rss_bytes'])}",
    ]
    return "\n".join(lines)
