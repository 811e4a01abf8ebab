"""What `ootd eval --preservation` (and a batch, which measures each pair the same way) costs per result, and that
the cost and the memory per result do not grow with the number of results.

    python scripts/measure_preservation.py [--sizes 384x512,768x1024] [--counts 100,1000] [--people 10]

Each count is a folder of N results measured in a fresh process through `ootd.app.evaluate.preservation.
measure_folder` (the command's own path: matching by record, finding the person photo and the mask by name,
reading, framing, the masks through `mask_person`, the regions, SSIM and CIEDE2000, preservation.jsonl and the
page). The results: the example person photo copied as `--people` people, each with the example's mask, and per
person one result (the framed photo with noise added everywhere, so every pixel's colour difference is computed),
recorded as a try-on of that person at that size would record it; the N results are hard links to those, so the
folder costs no disk and is measured like N distinct files, grouped by person (each photo parsed once).

STAND-IN: the pose and parsing are fixed maps (a frontal person at 384x512), not the networks: the tiny
checkpoints' random networks find nobody, and the released ones cannot be had here. Their cost is once per
distinct photo, not per result (docs/benchmarks.md, Preprocessing). Everything else is the real path.

Per run: the wall and CPU time per result while results stream (from the first result's progress tick to the
last's; CPU also over the first and the last tenth), the total, and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from measuring import ROOT, cpu_name, cpu_seconds, measure_fresh, parse_counts, parse_sizes, tick_rates

sys.path.insert(0, str(ROOT))
STAND_IN = ("pose and parsing are fixed maps (a frontal person), not the networks: their cost, once per distinct "
            "photo, is not in these figures")


class FixedParse:
    """The stand-in for the pose and parsing models: the same frontal person whatever the photo."""

    def __init__(self) -> None:
        import numpy as np

        labels = np.zeros((512, 384), np.uint8)
        for (r0, r1, c0, c1), label in {(30, 75, 160, 224): 2, (55, 120, 167, 217): 11, (120, 142, 180, 204): 18,
                                         (140, 300, 130, 254): 4, (145, 325, 100, 130): 15, (145, 325, 254, 284): 14,
                                         (300, 450, 140, 244): 6, (450, 490, 140, 185): 9,
                                         (450, 490, 199, 244): 10}.items():
            labels[r0:r1, c0:c1] = label
        keypoints = np.zeros((18, 2))
        keypoints[[2, 3, 4, 5, 6, 7]] = [(152, 132), (140, 200), (135, 262), (232, 132), (244, 200), (249, 262)]
        self.labels, self.keypoints = labels, keypoints

    def parse(self, image):  # noqa: ANN001, ANN201 - the Preprocessor's parse
        return image.convert("RGB").resize((384, 512)), self.keypoints, self.labels


def make_results(folder: Path, size: tuple[int, int], people: int, count: int) -> tuple[Path, Path, Path]:
    import numpy as np
    from PIL import Image

    from ootd.app.tryon.config import RunConfig
    from ootd.app.tryon.record import PassRecord, Record
    from ootd.imaging.atomic import save_png_atomic
    from ootd.imaging.files import load_image
    from ootd.settings import Category, FitMode, ModelType, SamplingSettings, parse_resolution

    photos, masks, results = folder / "people", folder / "masks", folder / "results"
    for made in (photos, masks, results):
        made.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "person_mask_upper.png", masks / "mask.png")
    sampling = SamplingSettings(num_samples=1, steps=20, seed=1, resolution=parse_resolution(size))
    config = RunConfig(Path("checkpoints"), sampling=sampling, fit=FitMode.PAD, mask_grow=0)
    rng = np.random.default_rng(0)
    base = []
    framed = np.asarray(load_image(ROOT / "examples" / "person.png", "person").resize(size)).astype(int)
    photo = np.asarray(load_image(ROOT / "examples" / "person.png", "person"))
    for i in range(people):
        name = f"p{i:02d}.png"
        own = photo.copy()  # each person a photo of its own: identical copies would share one parse
        own[:8, :8] = (37 * i) % 256
        Image.fromarray(own).save(photos / name)
        picture = np.clip(framed + rng.integers(-12, 13, framed.shape), 0, 255).astype(np.uint8)
        record = Record(PassRecord(ModelType.HD, Category.UPPER, config, name, "shirt.png", "mask.png"), sample=0)
        base.append(save_png_atomic(Image.fromarray(picture), folder / f"base{i:02d}.png", record.text()))
    for n in range(count):
        os.link(base[n % people], results / f"p{n % people:02d}__g{n:05d}__0.png")
    return photos, masks, results


def subset(results: Path, count: int, into: Path) -> Path:
    into.mkdir()
    for path in sorted(results.iterdir(), key=lambda p: p.name.split("__")[1])[:count]:
        os.link(path, into / path.name)
    return into


def measure(results: str, people: str, masks: str) -> dict:
    """One measurement in this (fresh) process: wall and CPU time at every result's progress tick."""
    from ootd.app.evaluate.preservation import PreservationOptions, measure_folder

    stand_in = FixedParse()
    ticks: list[tuple[float, float]] = []
    start = (time.perf_counter(), cpu_seconds())
    report = measure_folder(Path(results), PreservationOptions.from_words(Path(people), Path(masks)),
                            lambda: stand_in,
                            progress=lambda stage, done, total: ticks.append((time.perf_counter(), cpu_seconds())))
    end = time.perf_counter()
    rates = tick_rates(ticks)
    return {"results": len(report.rows), "skipped": len(report.skipped), "parses": report.parses,
            "first_s": ticks[0][0] - start[0], "per_result_s": rates["per_s"], "per_result_cpu_s": rates["per_cpu_s"],
            "first_tenth_cpu_s": rates["first_tenth_cpu_s"], "last_tenth_cpu_s": rates["last_tenth_cpu_s"],
            "total_s": end - start[0], "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def check_size(parser: argparse.ArgumentParser, size: tuple[int, int]) -> None:
    """A size a try-on makes (the results are recorded as its), or the parser's one-line error."""
    from ootd.errors import UsageError
    from ootd.settings import parse_resolution

    try:
        parse_resolution(size)
    except UsageError as exc:
        parser.error(f"--sizes: {exc}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="384x512,768x1024")
    parser.add_argument("--counts", default="100,1000")
    parser.add_argument("--people", type=int, default=10)
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # results people masks: measure in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one)))
        return
    sizes, counts = parse_sizes(parser, args.sizes), parse_counts(parser, args.counts)
    for size in sizes:
        check_size(parser, size)
    if args.people < 1:
        parser.error(f"--people: {args.people} is not at least 1")
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"# {cpu_name()}, {os.cpu_count()} CPUs; load average at start {load}")
    print(f"# STAND-IN: {STAND_IN}")
    rows = []
    for w, h in sizes:
        word = f"{w}x{h}"
        with tempfile.TemporaryDirectory() as tmp:
            people, masks, results = make_results(Path(tmp), (w, h), args.people, counts[-1])
            for count in counts:
                folder = subset(results, count, Path(tmp) / f"results_{count}")
                row = {"size": word, "count": count, **measure_fresh(__file__, str(folder), str(people), str(masks))}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"# load average at the end {Path('/proc/loadavg').read_text().split()[:3]}")
    print("\n| size | results | per result: wall | CPU | CPU, first / last tenth | total | peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['size']} | {r['count']} | {r['per_result_s'] * 1000:.0f} ms | "
              f"{r['per_result_cpu_s'] * 1000:.0f} ms | {r['first_tenth_cpu_s'] * 1000:.0f} / "
              f"{r['last_tenth_cpu_s'] * 1000:.0f} ms | {r['total_s']:.0f} s | {r['peak_rss_mib']:.0f} MiB |")
    for w, h in sizes:
        word = f"{w}x{h}"
        of = {r["count"]: r for r in rows if r["size"] == word}
        if len(of) > 1:
            lo, hi = of[counts[0]], of[counts[-1]]
            print(f"{word}: per result at {counts[-1]} / at {counts[0]}: CPU "
                  f"{hi['per_result_cpu_s'] / lo['per_result_cpu_s']:.2f}, wall "
                  f"{hi['per_result_s'] / lo['per_result_s']:.2f}; peak RSS "
                  f"{hi['peak_rss_mib'] / lo['peak_rss_mib']:.3f}x "
                  f"({hi['peak_rss_mib'] - lo['peak_rss_mib']:+.0f} MiB)")
    print(f"STAND-IN: {STAND_IN}")


if __name__ == "__main__":
    main()
