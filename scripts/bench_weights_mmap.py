#!/usr/bin/env python
"""Resident memory while a UNet's weights load, and when they are first read (Linux /proc).

Saves a random UNet (released size by default) as safetensors in a temporary folder, then in a fresh
process loads it the way ootd.weights.loading does and reports VmRSS after loading, after the pipeline's start-up
conversions, after reading every weight, and after a channels_last conversion.

    python scripts/bench_weights_mmap.py            # full size, 3.4 GB of disk for a moment
    python scripts/bench_weights_mmap.py --tiny --json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _rss_mib() -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) // 1024


def _measure(folder: str) -> dict[str, int]:
    import torch
    from diffusers import UNet2DConditionModel

    from ootd.speedups.execution import set_memory_format

    out = {"before": _rss_mib()}
    unet = UNet2DConditionModel.from_pretrained(folder, torch_dtype=torch.float32)
    out["loaded"] = _rss_mib()
    unet.eval().requires_grad_(False).to("cpu")
    set_memory_format([unet], False)
    out["start_up"] = _rss_mib()
    with torch.no_grad():
        for param in unet.parameters():
            param.sum()
    out["all_read"] = _rss_mib()
    set_memory_format([unet], True)
    out["channels_last"] = _rss_mib()
    out["weights_mib"] = sum(p.numel() * p.element_size() for p in unet.parameters()) >> 20
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="the tests' tiny UNet instead of the released size")
    p.add_argument("--json", action="store_true")
    p.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # the child process
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(_measure(args.measure)))
        return 0
    import torch
    from diffusers import UNet2DConditionModel

    from ootd.tools.bench.architectures import ARCHITECTURES

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        unet = UNet2DConditionModel(in_channels=4, **ARCHITECTURES["tiny" if args.tiny else "full"].unet)
        unet.save_pretrained(tmp, safe_serialization=True)
        del unet
        child = subprocess.run([sys.executable, __file__, "--measure", tmp], capture_output=True, text=True,
                               check=False)
    if child.returncode != 0:
        print(child.stderr.strip().splitlines()[-1] if child.stderr.strip() else "measurement failed",
              file=sys.stderr)
        return 1
    report = json.loads(child.stdout.strip().splitlines()[-1])
    if args.json:
        print(json.dumps(report))
    else:
        print(f"weights {report['weights_mib']} MiB; resident: before {report['before']}, loaded "
              f"{report['loaded']}, after start-up {report['start_up']}, all weights read {report['all_read']}, "
              f"channels_last {report['channels_last']} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
