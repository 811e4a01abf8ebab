"""What the measure_*.py scripts share: the CPU's name for the figures' header, this process's CPU time, and one
measurement run in a fresh process (the script itself with `--one`), so that each starts cold and its peak memory
is its own."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_name(unknown: str = "unknown CPU") -> str:
    """The CPU's model name from /proc/cpuinfo, or `unknown`."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return unknown


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
