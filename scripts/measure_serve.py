"""What the serving layer costs: request latency of `POST /api/tryon` against the same try-on called directly
(what `ootd run` does once its model is loaded: the job's run and save), the part of a request spent outside
the worker (upload, form, checks, queue hand-off, base64, JSON), and the resident memory of an idle `ootd serve`
before and after its model is loaded.

    PYTHONPATH=. python scripts/measure_serve.py CHECKPOINTS [--steps 2] [--resolution 384x512] [--repeats 5]

Both sides use one pipeline loaded once, the example images with their mask (no pose/parsing), the same seed.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXAMPLES = ROOT / "examples"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def latency(checkpoints: Path, steps: int, resolution: str, repeats: int) -> dict[str, float]:
    from ootd.app.tryon.config import build_config
    from ootd.app.tryon.inputs import JobInputs
    from ootd.app.tryon.loader import models_for
    from ootd.app.tryon.preflight import plan_inputs
    from ootd.models import ModelSource
    from ootd.settings import Category
    from tests.helpers.serving import live_server

    config = build_config(checkpoints=checkpoints, steps=steps, resolution=resolution, seed=1, overwrite=True,
                          output=Path(tempfile.mkdtemp()))
    pipe = models_for(config).pipeline(config.model_type_for(Category.UPPER))
    files = {"person": EXAMPLES / "person.png", "garment": EXAMPLES / "tshirt.png",
             "mask": EXAMPLES / "person_mask_upper.png"}
    direct, served, inside = [], [], []
    with live_server(config, models=ModelSource(lambda model_type: pipe)) as live:
        form = {k: (p.name, p.read_bytes(), "image/png") for k, p in files.items()}
        data = {"category": "upper", "steps": str(steps), "resolution": resolution, "seed": "1"}
        for i in range(repeats + 1):  # the first of each is a warm-up
            start = time.perf_counter()
            inputs = JobInputs.single(files["person"], files["garment"], Category.UPPER, files["mask"])
            job = plan_inputs(config, inputs)
            job.save(job.run(lambda model_type: pipe))
            if i:
                direct.append(time.perf_counter() - start)
            start = time.perf_counter()
            answer = httpx.post(live.url + "api/tryon", files=form, data=data, timeout=600)
            answer.raise_for_status()
            if i:
                served.append(time.perf_counter() - start)
                inside.append(answer.json()["timings"]["run"])  # the worker's time: load check, try-on, PNGs
    d, s, r = statistics.median(direct), statistics.median(served), statistics.median(inside)
    return {"direct_s": d, "api_s": s, "api_minus_direct_s": s - d, "api_worker_run_s": r,
            "api_outside_worker_s": statistics.median(a - b for a, b in zip(served, inside, strict=True))}


def idle_memory(checkpoints: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "ootd", "serve", "--checkpoints", str(checkpoints), "--port", "0",
                             "--steps", "1", "--resolution", "384x512"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        url = proc.stdout.readline().split("open ", 1)[1].split(" ", 1)[0].rstrip(";")
        while True:
            try:
                httpx.get(url + "api/health", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        time.sleep(1)
        before = rss_mib(proc.pid)
        files = {k: (p.name, p.read_bytes(), "image/png") for k, p in
                 {"person": EXAMPLES / "person.png", "garment": EXAMPLES / "tshirt.png",
                  "mask": EXAMPLES / "person_mask_upper.png"}.items()}
        httpx.post(url + "api/tryon", files=files, data={"category": "upper"}, timeout=600).raise_for_status()
        time.sleep(1)
        after = rss_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    return {"idle_before_load_mib": before, "idle_after_load_mib": after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", type=Path)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--resolution", default="384x512")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for key, value in {**latency(args.checkpoints, args.steps, args.resolution, args.repeats),
                       **idle_memory(args.checkpoints)}.items():
        print(f"{key}: {value:.3f}")


if __name__ == "__main__":
    main()
