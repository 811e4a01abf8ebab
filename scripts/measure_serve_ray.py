"""What `ootd serve --engine ray` gives and costs on this machine: requests per minute and p50/p95 latency of
`POST /api/tryon` at 1 and 2 CPU replicas under concurrent clients, the time Ray Serve adds to one request
against the local server on the same requests (both computing with one thread), start-up time (Ray, Serve, the
replicas) and the resident memory of each idle replica before and after its model is loaded.

    PYTHONPATH=. python scripts/measure_serve_ray.py CHECKPOINTS [--steps 2] [--resolution 384x512]
        [--requests 8] [--replicas 1 2]

Every request is the same try-on (the example images with their mask, so no pose/parsing; a fixed seed). The
replicas are CPU replicas of one CPU each on a private Ray instance of this machine; with the tiny checkpoints
the CPU bounds everything, so the figures say what the engine adds, not what a GPU replica would do.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXAMPLES = ROOT / "examples"
FILES = {"person": EXAMPLES / "person.png", "garment": EXAMPLES / "tshirt.png",
         "mask": EXAMPLES / "person_mask_upper.png"}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


NOT_STAGES = ("queue", "run", "total", "steps", "load")


def post(url: str, data: dict[str, str], outside: list[float] | None = None) -> float:
    """One try-on's latency; `outside` gets the part of it not spent in the try-on's own stages (pose to PNG
    encoding, as the answer's timings report them): HTTP, form, checks, hand-off, transfers, base64, JSON."""
    form = {k: (p.name, p.read_bytes(), "image/png") for k, p in FILES.items()}
    start = time.perf_counter()
    answer = httpx.post(url + "api/tryon", files=form, data=data, timeout=900)
    answer.raise_for_status()
    seconds = time.perf_counter() - start
    if outside is not None:
        timings = answer.json()["timings"]
        outside.append(seconds - sum(v for k, v in timings.items() if k not in NOT_STAGES))
    return seconds


def load(url: str, data: dict[str, str], requests: int, clients: int) -> dict[str, float]:
    """`requests` try-ons from `clients` at once; rate and latency percentiles."""
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        latencies = list(pool.map(lambda _: post(url, data), range(requests)))
    elapsed = time.perf_counter() - start
    return {"per_minute": requests / elapsed * 60, "p50_s": statistics.median(latencies),
            "p95_s": percentile(latencies, 0.95)}


def ray_figures(config: object, replicas: int, data: dict[str, str], requests: int) -> dict[str, float]:
    from ootd.serve.ray_engine import RayOptions, deployed
    from tests.helpers.serving import live_server

    start = time.perf_counter()
    with deployed(config, RayOptions(replicas=replicas, gpus_per_replica=0)) as deployment:
        started = time.perf_counter() - start
        with live_server(config, ray=deployment) as live:
            pids = [r["pid"] for r in httpx.get(live.url + "api/health", timeout=30).json()["replicas"]]
            before = [rss_mib(pid) for pid in pids]
            warm = time.perf_counter()
            with ThreadPoolExecutor(replicas) as pool:  # one request per replica: each loads its model
                list(pool.map(lambda _: post(live.url, data), range(replicas)))
            first = time.perf_counter() - warm
            figures = load(live.url, data, requests, 2 * replicas)
            outside: list[float] = []
            sequential = [post(live.url, data, outside) for _ in range(5)]
            time.sleep(1)
            after = [rss_mib(pid) for pid in pids]
    return {"startup_s": started, "first_requests_s": first, **figures,
            "sequential_p50_s": statistics.median(sequential), "outside_tryon_s": statistics.median(outside),
            "replica_idle_before_load_mib": statistics.mean(before),
            "replica_idle_after_load_mib": statistics.mean(after)}


def local_figures(config: object, data: dict[str, str], requests: int) -> dict[str, float]:
    import torch

    from ootd.app.tryon.loader import models_for
    from ootd.models import ModelSource
    from ootd.settings import Category
    from tests.helpers.serving import live_server

    torch.set_num_threads(1)  # as a one-CPU Ray replica computes
    pipe = models_for(config).pipeline(config.model_type_for(Category.UPPER))
    with live_server(config, models=ModelSource(lambda model_type: pipe)) as live:
        post(live.url, data)
        figures = load(live.url, data, requests, 2)  # two clients, as for one replica
        outside: list[float] = []
        sequential = [post(live.url, data, outside) for _ in range(5)]
    return {**figures, "sequential_p50_s": statistics.median(sequential), "outside_tryon_s": statistics.median(outside)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", type=Path)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--resolution", default="384x512")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    os.environ.setdefault("OOTD_CPU_BF16", "0")
    from ootd.app.tryon.config import build_config

    config = build_config(checkpoints=args.checkpoints, device="cpu", model_type="hd")
    data = {"category": "upper", "steps": str(args.steps), "resolution": args.resolution, "seed": "1"}
    print(f"uptime: {os.popen('uptime').read().strip()}")
    rows = {"local (1 thread)": local_figures(config, data, args.requests)}
    for replicas in args.replicas:
        rows[f"ray, {replicas} replica(s)"] = ray_figures(config, replicas, data, args.requests)
        print(f"uptime: {os.popen('uptime').read().strip()}")
    for name, figures in rows.items():
        print(name + ": " + ", ".join(f"{key} {value:.2f}" for key, value in figures.items()))
    local, single = rows["local (1 thread)"], rows.get("ray, 1 replica(s)")
    if single is not None:
        print(f"ray overhead per request (time outside the try-on's stages, 1 replica - local): "
              f"{single['outside_tryon_s'] - local['outside_tryon_s']:.3f} s")


if __name__ == "__main__":
    main()
