"""What `--keep-unmasked` (and `--output-size photo`) costs on top of a try-on: time and peak memory of bringing
the results back to photos of several sizes, on the CPU, each size in a fresh process.

    PYTHONPATH=. python scripts/bench_photo_output.py [--sizes 768x1024,3000x4000,6000x8000] [--samples 1]

Per size: the photo written as a JPEG first (a camera's file), then, timed: reading it back upright
(`load_photo`), the blend weight at its size (`photo_mask`), the photo with the generated region blended in
(`kept_photo`) per sample, and writing each picture as the PNG ootd writes (`save_png_atomic`). The generated
picture and the mask are a 768x1024 result's (random pixels and a body-sized rectangle: the work does not depend on
what they show). Peak memory is the process's VmHWM above what it held before the work, next to the planner's
count (PHOTO_BYTES_PER_PIXEL per photo pixel); no model runs here.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0


def one(width: int, height: int, samples: int) -> dict:
    import numpy as np
    from PIL import Image, ImageFilter

    from ootd.imaging.atomic import save_png_atomic
    from ootd.imaging.files import load_photo
    from ootd.imaging.framing import fit_to_aspect, frame_of, restore_framing
    from ootd.imaging.photo import kept_photo, photo_mask
    from ootd.memory.estimate import PHOTO_BYTES_PER_PIXEL

    folder = Path(tempfile.mkdtemp(prefix="ootd-photo-bench-"))
    rng = np.random.default_rng(0)
    small = Image.fromarray(rng.integers(0, 256, (120, 90, 3), dtype=np.uint8)).filter(ImageFilter.GaussianBlur(2))
    small.resize((width, height), Image.BICUBIC).save(folder / "photo.jpg", quality=92)
    info = frame_of((width, height), (768, 1024), "pad")
    _, framed = fit_to_aspect(Image.new("RGB", (width, height)), (768, 1024), "pad")
    generated = restore_framing(Image.fromarray(rng.integers(0, 256, (1024, 768, 3), dtype=np.uint8)), framed,
                                keep_scale=True)
    mask = np.zeros((1024, 768), np.uint8)
    mask[250:700, 150:620] = 255
    mask = restore_framing(Image.fromarray(mask, "L"), framed, keep_scale=True)
    Path("/proc/self/clear_refs").write_text("5")  # the peak from here on
    before = _rss("VmRSS")
    timings: dict[str, float] = {}
    t = time.perf_counter()
    photo = load_photo(folder / "photo.jpg", "photo.jpg")
    timings["read"] = time.perf_counter() - t
    t = time.perf_counter()
    weight = photo_mask(mask, info, 4)
    timings["mask"] = time.perf_counter() - t
    t = time.perf_counter()
    pictures = [kept_photo(photo, generated, weight, info) for _ in range(samples)]
    timings["blend"] = time.perf_counter() - t
    t = time.perf_counter()
    for i, picture in enumerate(pictures):
        save_png_atomic(picture, folder / f"out_{i}.png", {"software": "ootd bench"})
    timings["write"] = time.perf_counter() - t
    peak = _rss("VmHWM") - before
    return {"size": f"{width}x{height}", "megapixels": round(width * height / 1e6, 1), "samples": samples,
            "seconds": {k: round(v, 3) for k, v in timings.items()}, "total_s": round(sum(timings.values()), 3),
            "peak_extra_mib": round(peak / 2**20, 1),
            "planner_mib": round(PHOTO_BYTES_PER_PIXEL * width * height / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="768x1024,3000x4000,6000x8000")
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        width, height = (int(v) for v in args.one.split("x"))
        print(json.dumps(one(width, height, args.samples)))
        return
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}; "
          "no model runs (a 768x1024 result of random pixels stands in)")
    for size in args.sizes.split(","):
        out = subprocess.run([sys.executable, __file__, "--one", size, "--samples", str(args.samples)],
                             capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        s = row["seconds"]
        print(f"{row['size']} ({row['megapixels']} MP), {row['samples']} sample(s): {row['total_s']:.2f} s (read "
              f"{s['read']:.2f}, mask {s['mask']:.2f}, blend {s['blend']:.2f}, write {s['write']:.2f}); peak "
              f"+{row['peak_extra_mib']:.0f} MiB (the planner counts {row['planner_mib']:.0f} MiB)")


if __name__ == "__main__":
    main()
