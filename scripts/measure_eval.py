"""What `ootd eval` costs per image, and that the cost per image does not grow with the number of images.

    .venv-eval/bin/python scripts/measure_eval.py [--sizes 384x512,768x1024] [--counts 100,1000] [--batch 8]

Needs the eval extra (scripts/test_eval_stack.sh makes such an environment); without it the script says so in
one line, with the command that installs it, and exits 3. The published weights cannot be had
on every machine: with `--weights random` (the default here) the networks are the same architectures randomly
initialised - torch-fidelity's InceptionV3 and lpips's AlexNet - so the work, the time and the memory are those
of the real metrics and the numbers are meaningless (the output says so). Synthetic pairs: smooth random
pictures (photos as JPEG, results as PNG, the result a blurred copy of its photo) made once per size in a
temporary folder; each count is a folder of the first N results, measured in a fresh process through
`ootd.app.evaluate.run.evaluate` (the command's own path: matching by name, reading, framing, scoring).

Per run: the time to the first image (listing, matching, loading the networks), the wall and CPU time per image
while images stream (from the first image's progress tick to the last's, divided by the images between; CPU
time also over the first and the last tenth of the images, to see growth within one run), the final FID/KID
computation, the total, and the process's peak resident memory. One torch thread by default: on a machine shared
with other work, two threads spinning against it measure the neighbours more than the metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from measuring import ROOT, cpu_name, cpu_seconds, measure_fresh, parse_counts, parse_sizes, tick_rates

sys.path.insert(0, str(ROOT))


def make_pairs(folder: Path, size: tuple[int, int], count: int) -> tuple[Path, Path]:
    import numpy as np
    from PIL import Image, ImageFilter

    photos, results = folder / "photos", folder / "results"
    photos.mkdir(parents=True)
    results.mkdir()
    rng = np.random.default_rng(0)
    for i in range(count):
        small = Image.fromarray(rng.integers(0, 256, (12, 9, 3), dtype=np.uint8))
        photo = small.resize(size, Image.Resampling.BICUBIC)
        photo.save(photos / f"{i:05d}.jpg", quality=92)
        photo.filter(ImageFilter.GaussianBlur(1 + i % 3)).save(results / f"{i:05d}.png", compress_level=1)
    return photos, results


def subset(results: Path, count: int, into: Path) -> Path:
    into.mkdir()
    for path in sorted(results.iterdir())[:count]:
        (into / path.name).symlink_to(path)
    return into


def measure(results: str, photos: str, weights: str, batch: int, threads: int) -> dict:
    """One evaluation in this (fresh) process: wall and CPU time at every image's progress tick."""
    import torch

    from ootd.app.evaluate.run import EvalOptions, evaluate

    torch.set_num_threads(threads)
    ticks: list[tuple[float, float]] = []
    start = (time.perf_counter(), cpu_seconds())
    report = evaluate(Path(results), Path(photos), EvalOptions.from_words(weights, "cpu", batch),
                      progress=lambda stage, done, total: ticks.append((time.perf_counter(), cpu_seconds())))
    end = (time.perf_counter(), cpu_seconds())
    rates = tick_rates(ticks, batch)  # whole batches: the first and the last tenth of the images
    return {"images": len(ticks), "pairs": len(report.pairs), "threads": threads,
            "first_image_s": ticks[0][0] - start[0], "per_image_s": rates["per_s"],
            "per_image_cpu_s": rates["per_cpu_s"], "first_tenth_cpu_s": rates["first_tenth_cpu_s"],
            "last_tenth_cpu_s": rates["last_tenth_cpu_s"],
            "sets_s": end[0] - ticks[-1][0], "total_s": end[0] - start[0],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "stand_in": report.stand_in, "fid": report.sets.fid, "kid_subset": report.sets.kid_subset_size}


def require_networks() -> None:
    """The metric networks can run here, or one line saying what is missing and how to install it (exit 3): without
    them an evaluation scores SSIM only, which is not what these figures are of."""
    from ootd.evaluation.networks import stack_problem

    problem = stack_problem()
    if problem is not None:
        print(f"measure_eval.py: the metric networks (LPIPS, FID, KID) cannot run here: {problem}", file=sys.stderr)
        sys.exit(3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="384x512,768x1024")
    parser.add_argument("--counts", default="100,1000")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--weights", default="random", choices=("random", "standard"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # results photos: measure in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.weights, args.batch, args.threads)))
        return
    sizes, counts = parse_sizes(parser, args.sizes), parse_counts(parser, args.counts)
    require_networks()
    print(f"# {cpu_name()}, {os.cpu_count()} CPUs, {args.threads} torch thread(s) a run; load average at start "
          f"{Path('/proc/loadavg').read_text().split()[:3]}")
    rows = []
    for w, h in sizes:
        word = f"{w}x{h}"
        with tempfile.TemporaryDirectory() as tmp:
            made = time.perf_counter()
            photos, results = make_pairs(Path(tmp), (w, h), counts[-1])
            print(f"# {word}: {counts[-1]} synthetic pairs made in {time.perf_counter() - made:.0f} s", flush=True)
            for count in counts:
                folder = subset(results, count, Path(tmp) / f"results_{count}")
                row = {"size": word, "count": count, **measure_fresh(__file__, str(folder), str(photos), "--weights",
                                                                     args.weights, "--batch", str(args.batch),
                                                                     "--threads", str(args.threads))}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| size | pairs | first image | per image: wall | CPU | CPU, first / last tenth | FID+KID at the end "
          "| total | peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['size']} | {r['count']} | {r['first_image_s']:.1f} s | {r['per_image_s'] * 1000:.0f} ms | "
              f"{r['per_image_cpu_s'] * 1000:.0f} ms | {r['first_tenth_cpu_s'] * 1000:.0f} / "
              f"{r['last_tenth_cpu_s'] * 1000:.0f} ms | {r['sets_s']:.1f} s (KID subsets of {r['kid_subset']}) | "
              f"{r['total_s']:.0f} s | {r['peak_rss_mib']:.0f} MiB |")
    for w, h in sizes:
        word = f"{w}x{h}"
        of = {r["count"]: r for r in rows if r["size"] == word}
        if len(of) > 1:
            lo, hi = of[counts[0]], of[counts[-1]]
            cpu = hi["per_image_cpu_s"] / lo["per_image_cpu_s"]
            wall = hi["per_image_s"] / lo["per_image_s"]
            print(f"{word}: per image at {counts[-1]} / at {counts[0]}: CPU {cpu:.2f}, wall {wall:.2f}; peak RSS "
                  f"{hi['peak_rss_mib'] - lo['peak_rss_mib']:+.0f} MiB")
    if rows and rows[0]["stand_in"]:
        print(f"STAND-IN: {rows[0]['stand_in']}")


if __name__ == "__main__":
    main()
