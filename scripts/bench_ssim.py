"""Seconds per pair of the project's SSIM (ootd/imaging/similarity.py, what `ootd eval` scores each pair with) next
to torchmetrics' `structural_similarity_index_measure` on the same pair and CPU threads, and how far the two
numbers are apart (torchmetrics averages the border too, over mirrored edges; ours leaves the 5-pixel border out).

    python scripts/bench_ssim.py [--size 768x1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import numpy as np
    import torch

    from ootd.imaging.similarity import ssim

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="768x1024")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    b = np.clip(a.astype(np.int16) + rng.integers(-20, 21, a.shape), 0, 255).astype(np.uint8)
    t = time.perf_counter()
    ours = [ssim(a, b) for _ in range(args.repeats)][0]
    ours_s = (time.perf_counter() - t) / args.repeats
    line = f"{args.size} pair, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}: " \
           f"ours {ours_s:.3f} s ({ours:.6f})"
    try:
        from torchmetrics.functional.image import structural_similarity_index_measure as reference
    except ImportError:
        print(line + "; torchmetrics not installed")
        return
    ta, tb = (torch.from_numpy(x).permute(2, 0, 1)[None].float() / 255 for x in (a, b))
    t = time.perf_counter()
    theirs = [float(reference(ta, tb, data_range=1.0)) for _ in range(args.repeats)][0]
    theirs_s = (time.perf_counter() - t) / args.repeats
    print(line + f", torchmetrics {theirs_s:.3f} s ({theirs:.6f}); load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
