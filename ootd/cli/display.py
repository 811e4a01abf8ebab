"""What the CLI shows: progress bars on stderr (only for a person at a terminal), JSON on stdout, tables."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer


class Display:
    """Progress bars on stderr (load, preparing inputs, denoising steps, decode, pairs) with rate and ETA;
    nothing when disabled. Called as the pipeline's progress callback: (stage, done, total).

    Messages printed while the bars are live go through `print`, so they appear above the bars instead of being
    glued to a stale one; each print redraws the bars, so messages that come faster than `PRINT_EVERY` go out
    together (10^5 rows failing the precheck: a few hundred redraws, not 10^5). A stage that starts stops the
    clock of the one before it (decode after denoise). Bars come and go per pair without a redraw of their own:
    the bars' refresh thread draws them.
    """

    PRINT_EVERY = 0.1  # seconds between prints above live bars

    LABELS = {
        "pose": "pose + parsing", "load": "loading models", "person": "preparing person",
        "garment": "preparing garment", "denoise": "denoising", "decode": "decoding", "pairs": "pairs",
        "evaluate": "evaluating", "check": "checking pairs", "prepare": "preparing pairs", "train": "training",
    }
    UNITS = {"denoise": "step", "pairs": "pair", "load": "part", "evaluate": "image", "check": "pair",
             "prepare": "pair", "train": "step"}
    SEQUENCE = ("pose", "load", "person", "garment", "denoise", "decode")  # one try-on's stages, in order

    def __init__(self, enabled: bool, console: Any = None) -> None:
        self.enabled = enabled
        self.console = console  # default: a rich console on stderr
        self._progress = None
        self._tasks: dict[str, Any] = {}
        self._pending: list[str] = []
        self._printed = float("-inf")

    def __enter__(self) -> Display:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = _progress_class()(
                SpinnerColumn(), TextColumn("{task.description:<18}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>10}"), TimeElapsedColumn(), TextColumn("eta"),
                TimeRemainingColumn(), console=self.console or Console(stderr=True), transient=True,
                refresh_per_second=5,  # each redraw of the bars costs milliseconds of the batch's CPU
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._flush()
            self._progress.stop()
            self._progress = None

    def print(self, message: str) -> None:
        """A line on stderr above the live bars (or plainly when there are none)."""
        if self._progress is None:
            print(message, file=sys.stderr, flush=True)
            return
        self._pending.append(message)
        if time.monotonic() - self._printed >= self.PRINT_EVERY:
            self._flush()

    def _flush(self) -> None:
        if self._pending and self._progress is not None:
            text, self._pending = "\n".join(self._pending), []
            self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
            self._printed = time.monotonic()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self._progress is None:
            return
        if self._pending and time.monotonic() - self._printed >= self.PRINT_EVERY:
            self._flush()
        task = self._tasks.get(stage)
        if task is None:
            self._finish_earlier(stage)
            self._progress.hold = True  # no redraw for a new bar: the refresh thread draws it
            try:
                self._tasks[stage] = task = self._progress.add_task(self.LABELS.get(stage, stage), total=total,
                                                                    completed=0, rate="")
            finally:
                self._progress.hold = False
        self._progress.update(task, completed=done, total=total, rate=self._rate(stage, task, done))
        if done >= total:
            self._progress.stop_task(task)

    def _rate(self, stage: str, task: Any, done: int) -> str:
        elapsed = self._progress.tasks[self._progress.task_ids.index(task)].elapsed if done else None
        if not elapsed or stage not in self.UNITS:
            return ""
        per = elapsed / done
        unit = self.UNITS[stage]
        return f"{per:.1f} s/{unit}" if per >= 1 else f"{1 / per:.1f} {unit}/s"

    def _finish_earlier(self, stage: str) -> None:
        """Stop the clocks of the try-on stages before `stage` (their bars stay, complete)."""
        if stage not in self.SEQUENCE:
            return
        for earlier in self.SEQUENCE[: self.SEQUENCE.index(stage)]:
            task = self._tasks.get(earlier)
            if task is not None:
                self._progress.stop_task(task)

    def reset(self, *stages: str) -> None:
        """Remove per-pair bars so the next pair starts fresh."""
        if self._progress is None:
            return
        for stage in stages:
            task = self._tasks.pop(stage, None)
            if task is not None:
                self._progress.remove_task(task)


def _progress_class() -> type:
    """rich's Progress, less the redraw it makes on every new bar (its refresh thread, 10 a second, draws the
    bars anyway; a redraw per pair would cost more than a pair's bookkeeping)."""
    from rich.progress import Progress

    class Bars(Progress):
        hold = False

        def refresh(self) -> None:
            if not self.hold:
                super().refresh()

    return Bars


def show_progress(quiet: bool, json_out: bool) -> bool:
    """Progress only for a person at a terminal: not with -q, not with --json, not when piped."""
    return not quiet and not json_out and sys.stdout.isatty() and sys.stderr.isatty()


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if callable(getattr(value, "to_dict", None)):
        return value.to_dict()
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(value)
    return str(value)


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, default=_json_default)


def print_json(data: dict[str, Any]) -> None:
    typer.echo(to_json(data))


def plan_lines(plan: Any) -> list[str]:
    if isinstance(plan, dict):
        return [f"  {key}: {value}" for key, value in plan.items()]
    if isinstance(plan, list | tuple):
        return [f"  {item}" for item in plan]
    return [f"  {line}" for line in str(plan).splitlines()]


PIPED_WIDTH = 200  # output to a file, with no terminal to fit: long paths stay on one line


def piped_width(environ: Mapping[str, str] | None = None) -> int:
    """The width of output that is not a terminal: $COLUMNS when set, else the terminal the command was typed
    in (`ootd doctor | less`: stderr is still that terminal), else PIPED_WIDTH."""
    environ = os.environ if environ is None else environ
    columns = environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    for stream in (sys.stderr, sys.stdin):
        try:
            if stream is not None and stream.isatty():
                return os.get_terminal_size(stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            continue
    return PIPED_WIDTH


def console(stderr: bool = False) -> Any:
    """A rich console: a terminal's own width; piped, the width `piped_width` finds (long paths unwrapped)."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(file=stream, width=None if tty else piped_width(), soft_wrap=not tty)


def size_cell(value: int | None) -> str:
    """A size in a table cell: ootd/hardware/units.py's words, `-` when unknown."""
    from ootd.hardware.units import size_text as words

    return "-" if value is None else words(value)
