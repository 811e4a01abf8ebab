"""What a person watches while a fine-tune runs: the loss per optimizer step as JSONL, and a plot of it."""

from __future__ import annotations

import json
from pathlib import Path

from ootd.imaging.atomic import append_line, write_atomic, write_text_atomic

SMOOTHING = 0.9  # the plotted trend: an exponential moving average of the loss


class LossLog:
    """RUN/loss.jsonl: one whole line per step (one write each); a resume keeps the lines up to its step."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        rows = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a kill: what follows it is not ours either
        return rows

    def keep_until(self, step: int) -> None:
        """Drop the lines after `step` (a resume from an earlier checkpoint redoes them)."""
        kept = [row for row in self.read() if int(row.get("step", 0)) <= step]
        write_text_atomic(self.path, "".join(json.dumps(row) + "\n" for row in kept))

    def append(self, row: dict) -> None:
        append_line(self.path, json.dumps(row) + "\n")


def plot_unavailable() -> str | None:
    """Why no loss plot can be drawn here (None: it can): matplotlib, the `train` extra, is not installed."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        return None
    return ("no loss.png: the loss plot needs matplotlib, the train extra (in a checkout: pip install -e "
            "'.[train]'); the losses are in loss.jsonl")


def plot_losses(rows: list[dict], path: Path, validation: list[dict] | None = None, *,
                loss_label: str = "noise-prediction loss (MSE)",
                score_label: str = "validation SSIM (higher is closer to the real photo)") -> Path | None:
    """The loss curve (raw and smoothed) and, on a second axis, the validation SSIM; None without matplotlib
    (the `train` extra) or without a step to plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not rows:
        return None
    steps = [int(r["step"]) for r in rows]
    losses = [float(r["loss"]) for r in rows]
    trend, value = [], losses[0]
    for loss in losses:
        value = SMOOTHING * value + (1 - SMOOTHING) * loss
        trend.append(value)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(steps, losses, color="#9bb7d4", linewidth=0.8, label="loss")
    ax.plot(steps, trend, color="#1f4e79", linewidth=2.0, label="loss, smoothed")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(loss_label)
    ax.grid(alpha=0.3)
    if validation:
        other = ax.twinx()
        other.plot([v["step"] for v in validation], [v["ssim_mean"] for v in validation], "o-", color="#c55a11",
                   label="validation SSIM")
        other.set_ylabel(score_label)
        other.legend(loc="upper right")
    ax.legend(loc="upper left")
    fig.tight_layout()
    try:
        return write_atomic(path, lambda handle: fig.savefig(handle, format="png"), overwrite=True)
    finally:
        plt.close(fig)
