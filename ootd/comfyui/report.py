"""The try-on node's performance text: what ran (device, precision, attention, speed), where the seconds went,
which models were loaded for this prompt and which stay for the next, and the memory peaks. The same lines go to
ComfyUI's log."""

from __future__ import annotations

from typing import Any

STAGES = ("classify", "load", "pose_parsing", "preprocess", "encode_person", "conditioning", "encode_garment",
          "garment_unet", "denoise", "decode")


def seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.0f} ms"


def size(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def timing_line(timings: dict[str, Any]) -> str:
    """`total 12.31 s: load 5.10 s, ..., denoise 6.00 s (20 steps, 300 ms/step), other 12 ms`: the stages that
    took time, in the order they ran, and what no stage covers, so the parts add up to the total."""
    parts, covered = [], 0.0
    for stage in STAGES:
        value = timings.get(stage)
        if not isinstance(value, float):
            continue
        covered += value
        text = f"{stage} {seconds(value)}"
        steps = timings.get("steps") if stage == "denoise" else None
        if steps:
            text += f" ({len(steps)} steps, {seconds(sum(steps) / len(steps))}/step)"
        parts.append(text)
    total = float(timings.get("total", covered))
    if total - covered >= 0.0005:
        parts.append(f"other {seconds(total - covered)}")
    return f"total {seconds(total)}: " + ", ".join(parts)


def describe_run(outcome: Any, timings: dict[str, Any], loaded: list[str], held: list[str], pipe: Any = None
                 ) -> str:
    """The node's STRING output (one fact a line)."""
    from ootd.app.tryon.outputs import attention_used, peak_memory

    job, record = outcome.job, outcome.record(0)  # what ran, as the pictures' record says it
    sampling, speed = job.config.sampling, record.speed_summary() or "speed exact"
    memory = peak_memory(pipe)
    lines = [
        f"ootd try-on: {job.describe_models()}, {sampling.num_samples} sample(s) at {sampling.resolution}, "
        f"{sampling.steps} steps, {sampling.scheduler.value}, scale {sampling.guidance_scale:g}, seed "
        f"{sampling.seed}",
        f"ran on {record.device}, {record.precision}, attention {attention_used(record.attention)}, {speed}, "
        f"{record.threads} CPU threads",
        timing_line(timings),
        "models: " + (f"{', '.join(loaded)} loaded for this prompt" if loaded else "none loaded (all kept from "
                      "an earlier prompt)") + f"; held for the next: {', '.join(held) or 'none'}",
        f"peak memory: device {size(memory['device_bytes'])}, ComfyUI's process {size(memory['host_rss_bytes'])}",
    ]
    return "\n".join(lines)
