"""The batch's progress bars on a terminal: their cost per pair does not include a redraw of the bars."""

from __future__ import annotations

import io
import re


def test_a_batch_of_bars_and_messages_is_drawn_by_the_refresh_thread_not_once_per_pair() -> None:
    """Per pair, a batch starts new bars (denoise, decode) and prints a line above them; each used to redraw every
    bar at once (a few ms a pair, the most of a pair's bookkeeping). The lines all arrive, in order, at line starts."""
    from rich.console import Console

    from ootd.cli.display import Display

    pairs = 300
    buffer = io.StringIO()
    with Display(True, Console(file=buffer, force_terminal=True, width=100)) as display:
        for i in range(pairs):
            for stage in ("denoise", "decode"):
                display(stage, 0, 1)
                display(stage, 1, 1)
            display.print(f"ok pair {i}")
            display("pairs", i + 1, pairs)
    raw = buffer.getvalue()
    frames = raw.count("eta")  # every drawn bar has its "eta" column
    # at 5 redraws a second, reaching one frame per pair would take this loop a minute; the old way drew ~3 a pair
    assert frames < pairs, f"{frames} bars drawn for {pairs} pairs"
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw)
    shown = [line for line in re.split(r"[\r\n]", plain) if line.startswith("ok pair")]  # whole lines
    assert shown == [f"ok pair {i}" for i in range(pairs)]
