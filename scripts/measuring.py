"""What the measure_*.py scripts share: the CPU's name for the figures' header, this process's CPU time, one
measurement run in a fresh process (the script itself with `--one`), so that each starts cold and its peak memory
is its own, their --sizes and --counts read at the edge, and the rates between the progress ticks of one run."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# the instruction sets that decide a CPU's speed here (fp32 vector width, bf16 matrix units), as /proc/cpuinfo names
# them, and the words the figures' header gives them
VECTOR_FLAGS = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_bf16": "avx512_bf16", "amx_tile": "AMX"}


def cpu_name(unknown: str = "unknown CPU", cpuinfo: str | None = None) -> str:
    """The CPU's model name from /proc/cpuinfo (or `unknown`), with its family and model numbers and the vector
    instruction sets it has: a virtual machine's name ("AMD EPYC") alone does not tell one machine kind from
    another, and the figures depend on which."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return unknown
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name")
    if not name:
        return unknown
    numbers = [f"{key} {fields[key]}" for key in ("cpu family", "model") if fields.get(key)]
    flags = set(fields.get("flags", "").split())
    sets = [word for flag, word in VECTOR_FLAGS.items() if flag in flags]
    details = "; ".join(part for part in (", ".join(numbers), ", ".join(sets)) if part)
    return f"{name} ({details})" if details else name


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure_fresh(script: str, *args: str) -> dict:
    """`script --one ARGS` in a fresh Python with the checkout importable: the JSON object its last line prints;
    exits with the end of its stderr if it failed."""
    proc = subprocess.run([sys.executable, script, "--one", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        sys.exit(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parse_sizes(parser: argparse.ArgumentParser, text: str) -> list[tuple[int, int]]:
    """`--sizes` as WIDTHxHEIGHT pairs ("384x512,768x1024"), or the parser's one-line error."""
    sizes = []
    for word in text.split(","):
        w, _, h = word.strip().lower().partition("x")
        if not (w.isdigit() and h.isdigit() and int(w) > 0 and int(h) > 0):
            parser.error(f"--sizes: {word!r} is not WIDTHxHEIGHT (e.g. 384x512)")
        sizes.append((int(w), int(h)))
    return sizes


def parse_counts(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """`--counts`, ascending, each at least 2 (a rate needs two progress ticks), or the parser's one-line error."""
    words = text.split(",")
    if not all(w.strip().isdigit() and int(w) >= 2 for w in words):
        parser.error(f"--counts: {text!r} is not whole numbers of at least 2, separated by commas (e.g. 100,1000)")
    return sorted({int(w) for w in words})


def tick_rates(ticks: list[tuple[float, float]], step: int = 1) -> dict[str, float]:
    """Per item between the first and the last of `ticks` ((wall, CPU) seconds at each item's progress tick): the
    wall and CPU time, and the CPU time over the first and the last tenth of the items (whole `step`s of them, as
    they are processed, at least one step; never more than the run: a run shorter than a step compares its first
    and its last tick)."""
    n = len(ticks)
    if n < 2:
        raise ValueError(f"{n} progress tick(s): a rate needs at least 2")
    window = min(n - 1, max(step, n // 10 // step * step))

    def per(first: int, last: int, which: int) -> float:
        return (ticks[last][which] - ticks[first][which]) / (last - first)

    return {"per_s": per(0, n - 1, 0), "per_cpu_s": per(0, n - 1, 1), "first_tenth_cpu_s": per(0, window, 1),
            "last_tenth_cpu_s": per(n - 1 - window, n - 1, 1)}


if __name__ == "__main__":  # a module of the measure_*.py scripts, not a command of its own: --help says so
    argparse.ArgumentParser(description=__doc__ + " Run one of the measure_*.py scripts instead.").parse_args()
    sys.exit("measuring.py is imported by the measure_*.py scripts: run one of them (--help)")
