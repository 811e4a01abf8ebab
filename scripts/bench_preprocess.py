#!/usr/bin/env python
"""CPU time of pose, parsing and the mask on one person image (docs/upstream.md §6-§8).

Pose runs the full-size OpenPose body network with random weights (the released architecture);
parsing runs the ONNX files of the given checkpoints tree (the tiny tree's are small stand-ins, so
its parsing time is a floor, not the released SCHP networks' time).

    python scripts/bench_preprocess.py [--checkpoints DIR] [--image examples/person.png] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", type=Path, help="tree with humanparsing/*.onnx (default: a tiny tree)")
    parser.add_argument("--image", type=Path, default=REPO / "examples" / "person.png")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    from ootd.imaging.files import load_image
    from ootd.weights.layout import Layout
    from preprocess.masking import inpaint_mask
    from preprocess.parsing import HumanParser
    from preprocess.pose import BodyPoseNet, PoseEstimator
    from preprocess.pose_decode import decode_pose

    if args.checkpoints is None:
        sys.path.insert(0, str(REPO / "scripts"))
        from make_tiny_checkpoints import make_tiny_checkpoints

        args.checkpoints = make_tiny_checkpoints(Path(tempfile.mkdtemp()) / "ckpt")
    layout = Layout(args.checkpoints)
    person = load_image(args.image, "person").resize((768, 1024))
    small = person.resize((384, 512))

    torch.manual_seed(0)
    pose = PoseEstimator(BodyPoseNet().eval(), device="cpu")
    parser_ = HumanParser(layout.parsing_atr, layout.parsing_lip, provider="cpu")
    bgr = np.ascontiguousarray(np.asarray(small)[:, :, ::-1])
    results: dict[str, list[float]] = {"pose_network": [], "pose_decode": [], "parsing": [], "mask": []}
    synthetic = np.zeros((18, 2), np.float32)
    synthetic[[2, 3, 4, 5, 6, 7]] = [[140, 110], [110, 180], [100, 250], [245, 110], [275, 180], [285, 250]]
    for _ in range(args.repeat):
        t = time.perf_counter()
        heatmaps, pafs = pose.network_maps(bgr)
        results["pose_network"].append(time.perf_counter() - t)
        t = time.perf_counter()
        try:
            keypoints = decode_pose(heatmaps, pafs)
        except Exception:  # random weights usually find nobody; the mask below uses fixed keypoints
            keypoints = synthetic
        results["pose_decode"].append(time.perf_counter() - t)
        t = time.perf_counter()
        labels = parser_(small)
        results["parsing"].append(time.perf_counter() - t)
        t = time.perf_counter()
        inpaint_mask(labels, keypoints if keypoints.any() else synthetic, "upper_body", "hd")
        results["mask"].append(time.perf_counter() - t)
    summary = {k: round(min(v), 3) for k, v in results.items()}
    summary["threads"] = torch.get_num_threads()
    summary["parsing_models"] = str(layout.parsing_atr.parent)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
