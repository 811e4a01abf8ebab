"""What removing the temporary files that dead writers left costs (`ootd.app.tryon.tempfiles`), and how it grows
with the number of files in the results folder.

    python scripts/measure_sweep.py [--counts 1000,10000] [--stale 5] [--repeats 5]

Each count is a results folder (in a temporary folder, removed at the end) of N finished results (empty files, one
per pair: a sweep reads names, never contents) plus `--stale` stale temporary files of our naming
(`.NAME.<12 hex>.tmp`, `ootd.imaging.atomic.TEMP_FILE_NAME`, no lock held: their writer is gone), all N present
(the folder at the end of a batch, the largest a sweep meets). Measured, CPU time of this process:

  sweep:        one `clean_stale_temps(folder, targets)`, the targets being the stale files' pairs (what a
                `Sweeper` passes); per file in the folder (best of --repeats);
  settled:      a batch's worth of `Sweeper.settled` calls, one per pair (every pair's writer dead: the worst
                case), then `finish()`, with the rate limit of a run (`SWEEP_EVERY_S`; this run is shorter, so
                one sweep at the first pair and one at the end); per pair (best of --repeats);
  settled, every=0: the same without the rate limit, a listing of the folder per pair; per pair (one run).

Each measured run recreates the stale files first and checks that it removed each of them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from measuring import ROOT, cpu_name, cpu_seconds, parse_counts

sys.path.insert(0, str(ROOT))

CASES = ("sweep", "settled", "settled_every_0")


def load_average() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


def make_folder(folder: Path, count: int) -> list[Path]:
    """`count` finished results (empty files) in `folder`; their paths, in pair order."""
    folder.mkdir()
    paths = [folder / f"pair-{index:06d}.png" for index in range(count)]
    for path in paths:
        path.touch()
    return paths


def make_stale(paths: list[Path]) -> list[Path]:
    """A stale temporary file of our naming for each of `paths` (no process holds its lock)."""
    stale = [path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp" for path in paths]
    for path in stale:
        path.touch()
    return stale


def timed(run, stale: list[Path]) -> float:  # noqa: ANN001 - a callable returning what it removed
    """CPU seconds of `run()`, which must remove exactly `stale`."""
    start = cpu_seconds()
    removed = run()
    spent = cpu_seconds() - start
    if sorted(removed) != sorted(stale) or any(path.exists() for path in stale):
        sys.exit(f"the sweep removed {len(removed)} file(s), not the {len(stale)} stale one(s) made for it")
    return spent


def measure(folder: Path, count: int, stale_count: int, repeats: int) -> dict:
    """The three cases on a folder of `count` results; CPU seconds per file (sweep) or per pair (settled)."""
    from ootd.app.tryon.tempfiles import SWEEP_EVERY_S, Sweeper, clean_stale_temps

    paths = make_folder(folder, count)
    dead = paths[:stale_count]

    def sweep() -> list[Path]:
        return clean_stale_temps(folder, {path.name for path in dead})

    def batch(every: float):  # noqa: ANN202
        def run() -> list[Path]:
            sweeper = Sweeper(every)
            for path in paths:
                sweeper.settled([path])
            return sweeper.finish()
        return run

    runs = {"sweep": (sweep, repeats), "settled": (batch(SWEEP_EVERY_S), repeats),
            "settled_every_0": (batch(0.0), 1)}
    row: dict = {"count": count, "files": count + stale_count, "stale": stale_count}
    for case, (run, times) in runs.items():
        wall = time.perf_counter()
        row[f"{case}_cpu_s"] = min(timed(run, make_stale(dead)) for _ in range(times)) / count
        row[f"{case}_total_s"] = time.perf_counter() - wall
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="1000,10000", help="results in the folder, one run each (e.g. 1000,10000)")
    parser.add_argument("--stale", type=int, default=5, help="stale temporary files in the folder (1 to the count)")
    parser.add_argument("--repeats", type=int, default=5, help="best of this many runs (sweep and settled)")
    args = parser.parse_args()
    counts = parse_counts(parser, args.counts)
    if not 1 <= args.stale <= counts[0]:
        parser.error(f"--stale: {args.stale} is not between 1 and the smallest count ({counts[0]})")
    if args.repeats < 1:
        parser.error(f"--repeats: {args.repeats} is not at least 1")
    print(f"# {cpu_name()}, {os.cpu_count()} CPUs; load average at start {load_average()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ootd-sweep-") as tmp:
        print(f"# folder {tmp}", flush=True)
        for count in counts:
            row = measure(Path(tmp) / f"results_{count}", count, args.stale, args.repeats)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"# load average at the end {load_average()}")
    print("\n| results | sweep: CPU per file | settled (rate limit): CPU per pair | settled, every=0: CPU per pair |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['count']} | {r['sweep_cpu_s'] * 1e6:.2f} us | {r['settled_cpu_s'] * 1e6:.2f} us | "
              f"{r['settled_every_0_cpu_s'] * 1e6:.1f} us |")
    if len(rows) > 1:
        lo, hi = rows[0], rows[-1]
        print(f"per file or pair at {hi['count']} / at {lo['count']}: CPU " + ", ".join(
            f"{case} {hi[f'{case}_cpu_s'] / lo[f'{case}_cpu_s']:.2f}" for case in CASES))


if __name__ == "__main__":
    main()
