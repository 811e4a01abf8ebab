"""What measuring a job's pictures costs `ootd serve`: the `preservation` stage of each answer's timings against the
job's `run` (in the worker: checks, pose and parsing, the try-on, its files, the figures), for an automatic mask (the
figures reuse the mask's parse) and an uploaded one (the photo is parsed for the regions), with the form's
`preservation` on and off, through `POST /api/tryon` of a live server on 127.0.0.1, on the tiny random-weight tree.

    python scripts/measure_serve_preservation.py [--repeats 5] [--threads 1] [--resolution 384x512] [--steps 2]

STAND-IN pose and parsing, with real costs: those of scripts/measure_run_parsing.py (the full-size OpenPose body
network with random weights, the tree's tiny parsing ONNX files, then the fixed person of tests/helpers/synthetic.py,
since the tiny tree's random pose finds nobody). The try-on itself is the tiny tree's: far cheaper than the released
models, so the stage's share printed here is an upper bound of its share with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

try:
    import fastapi  # noqa: F401 - the server this script starts
    import httpx
except ModuleNotFoundError as missing:
    sys.exit(f"measure_serve_preservation.py: it needs the server and its test client ({missing.name} is missing): "
             "python -m pip install -e '.[serve,serve-test]'")
from measure_run_parsing import priced_preprocessor
from measuring import ROOT, cpu_name

EXAMPLES = ROOT / "examples"
CASES = (("automatic mask", False, True), ("uploaded mask", True, True), ("automatic mask, off", False, False),
         ("uploaded mask, off", True, False))


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(tree: Path, threads: int, resolution: str, steps: int, repeats: int) -> None:
    from ootd.app.tryon.config import build_config
    from ootd.app.tryon.loader import models_for
    from ootd.models import ModelSource
    from ootd.settings import Category
    from tests.helpers.serving import live_server

    config = build_config(checkpoints=tree, device="cpu", threads=threads)
    pipe = models_for(config).pipeline(config.model_type_for(Category.UPPER))
    pre, runs = priced_preprocessor(tree, threads)
    files = {"person": EXAMPLES / "person.png", "garment": EXAMPLES / "tshirt.png",
             "mask": EXAMPLES / "person_mask_upper.png"}
    figures: dict[str, list[tuple[float, float, float]]] = {}
    with live_server(config, models=ModelSource(lambda model_type: pipe, lambda: pre)) as live:
        for repeat in range(repeats + 1):  # the first round is a warm-up
            for name, masked, on in CASES:
                form = {k: (p.name, p.read_bytes(), "image/png") for k, p in files.items() if masked or k != "mask"}
                data = {"category": "upper", "steps": str(steps), "resolution": resolution, "seed": "3",
                        "preservation": "true" if on else "false"}
                before, start = dict(runs), time.perf_counter()
                answer = httpx.post(live.url + "api/tryon", files=form, data=data, timeout=600)
                wall = time.perf_counter() - start
                if answer.status_code != 200:
                    sys.exit(answer.text)
                body = answer.json()
                assert ("regions" in str(body["preservation"])) == on, body["preservation"]
                parses = runs["pose"] - before["pose"]
                if repeat:
                    figures.setdefault(name, []).append((body["timings"].get("preservation", 0.0),
                                                         body["timings"]["run"], wall))
                    print(f"{name} #{repeat}: preservation {body['timings'].get('preservation', 0.0):.3f} s, run "
                          f"{body['timings']['run']:.3f} s, request {wall:.3f} s, pose + parsing runs {parses}",
                          flush=True)
    print("| case | `preservation` stage | job (`run`) | share | request |\n|---|---:|---:|---:|---:|")
    for name, rows in figures.items():
        stage, run, wall = (statistics.median(column) for column in zip(*rows, strict=True))
        print(f"| {name} | {stage:.3f} s | {run:.3f} s | {100 * stage / run:.1f}% | {wall:.3f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--resolution", default="384x512")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    if args.repeats < 1 or args.threads < 1 or args.steps < 1:
        parser.error("--repeats, --threads and --steps are at least 1")
    sys.path.insert(0, str(ROOT))
    from make_tiny_checkpoints import make_tiny_checkpoints

    print(f"# {cpu_name()}; load average {load_average()}; {args.threads} thread(s); {args.resolution}, "
          f"{args.steps} steps; medians of {args.repeats}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ootd-serve-preservation-") as tmp:
        tree = make_tiny_checkpoints(Path(tmp) / "tree", seed=0)
        measure(tree, args.threads, args.resolution, args.steps, args.repeats)
    print(f"# load average at the end {load_average()}")
    print("STAND-IN: pose and parsing as in scripts/measure_run_parsing.py (priced for their cost, a fixed "
          "synthetic person returned), and the tiny tree's try-on: the stage's share is an upper bound")


if __name__ == "__main__":
    main()
