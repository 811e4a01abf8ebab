"""What one `ootd run` with an automatic mask and its preservation figures costs, and how many times it runs pose
and parsing on the person photo: the CLI's own path (`ootd run -m PERSON -c GARMENT -k upper --threads N
--json`), each run in a fresh process, on the tiny random-weight tree.

    python scripts/measure_run_parsing.py [--repeats 3] [--threads 1] [--code DIR ...]

`--code DIR`: a checkout whose `ootd` is measured (several: each in turn, one run of each per repeat, so the load
of a shared machine falls on all of them alike); by default this checkout. Each line gives the wall and CPU
seconds of the whole command in its process (imports left out), the pose and parsing runs, and the preservation
figures, so two checkouts can be compared for the same inputs and seed.

STAND-IN, with real costs: the tiny tree's random pose network finds nobody, and the released weights cannot be
had here, so pose and parsing are priced, not trusted. Every pose run is the full-size OpenPose body network
(random weights, the released architecture) on the photo's 384x512 view, and every parsing run the tree's ATR + LIP
ONNX files (tiny stand-ins: a floor of the released SCHP networks' time, docs/benchmarks.md "Preprocessing"); what
they return is then the fixed person of tests/helpers/synthetic.py, so the mask and the figures are those of a
person found.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measuring import ROOT, cpu_name, cpu_seconds

EXAMPLES = ROOT / "examples"


def priced_preprocessor(tree: Path, threads: int) -> tuple[object, dict[str, int]]:
    """Pose and parsing that cost what the networks cost and find the synthetic person (module docstring)."""
    import torch

    from ootd.preprocessing import Preprocessor
    from ootd.weights.layout import Layout
    from preprocess.parsing import HumanParser
    from preprocess.pose import BodyPoseNet, PoseEstimator
    from tests.helpers.synthetic import synthetic_preprocessor

    fixed = synthetic_preprocessor()
    torch.manual_seed(0)
    network = PoseEstimator(BodyPoseNet().eval(), device="cpu")
    layout = Layout(tree)
    onnx = HumanParser(layout.parsing_atr, layout.parsing_lip, provider="cpu", threads=threads)
    runs = {"pose": 0, "parsing": 0}

    def pose(view):  # noqa: ANN001, ANN202
        import numpy as np

        runs["pose"] += 1
        network.network_maps(np.ascontiguousarray(np.asarray(view)[:, :, ::-1]))
        return fixed.pose(view)

    def parsing(view):  # noqa: ANN001, ANN202
        runs["parsing"] += 1
        onnx(view)
        return fixed.parser(view)

    return Preprocessor(pose, parsing), runs


def one(tree: str, out: str, threads: int) -> dict:
    """One `ootd run` in this (fresh) process."""
    from typer.testing import CliRunner

    from ootd import cli
    from ootd.models import use_models

    preprocessor, runs = priced_preprocessor(Path(tree), threads)
    args = ["run", "-m", str(EXAMPLES / "person.png"), "-c", str(EXAMPLES / "tshirt.png"), "-k", "upper",
            "--checkpoints", tree, "-o", out, "--resolution", "384x512", "--steps", "2", "--seed", "3",
            "--threads", str(threads), "--overwrite", "--json", "-q"]
    with use_models(preprocessor=lambda: preprocessor):
        wall, cpu = time.perf_counter(), cpu_seconds()
        result = CliRunner().invoke(cli.app, args)
        wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    if result.exit_code != 0:
        sys.exit(result.output[-2000:])
    data = json.loads(result.stdout)
    kept = data["preservation"]  # the figures, without the result's path (each checkout writes its own folder)
    kept["results"] = [{k: v for k, v in r.items() if k != "result"} for r in kept["results"]]
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), **runs, "timings": data["timings"],
            "preservation": kept}


def fresh(code: Path, tree: Path, out: Path, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{code}{os.pathsep}{ROOT / 'scripts'}", "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, __file__, "--one", str(tree), str(out), str(threads)], env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(proc.stderr[-2000:] or proc.stdout[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--code", type=Path, action="append", help="a checkout to measure (default: this one)")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # tree out threads: measure in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], int(args.one[2]))))
        return
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads are at least 1")
    codes = args.code or [ROOT]
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_tiny_checkpoints import make_tiny_checkpoints

    print(f"# {cpu_name()}; load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{args.threads} thread(s)", flush=True)
    with tempfile.TemporaryDirectory(prefix="ootd-run-parsing-") as tmp:
        tree = make_tiny_checkpoints(Path(tmp) / "tree", seed=0)
        figures: dict[str, list] = {}
        for repeat in range(args.repeats):
            for n, code in enumerate(codes):
                got = fresh(code.resolve(), tree, Path(tmp) / f"out{n}", args.threads)
                figures.setdefault(str(code), []).append(got["preservation"])
                stages = ", ".join(f"{k} {v:.2f}" for k, v in got["timings"].items() if isinstance(v, float))
                print(f"{code} #{repeat + 1}: wall {got['wall_s']:.2f} s, CPU {got['cpu_s']:.2f} s, pose runs "
                      f"{got['pose']}, parsing runs {got['parsing']} ({stages})", flush=True)
        same = len({json.dumps(f, sort_keys=True) for runs in figures.values() for f in runs}) == 1
        print(f"# preservation figures identical across every run and checkout: {same}")
        print(f"# load average at the end {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("STAND-IN: pose is the full-size OpenPose body network with random weights and parsing the tiny tree's "
          "ONNX files, priced for their cost; the person they return is a fixed synthetic one")


if __name__ == "__main__":
    main()
