#!/usr/bin/env python
"""Benchmark the attention backends at the try-on UNet's largest fusion shape.

Default shape: batch 1, 8 heads, head dim 40, 12,288 person queries against 24,576 person+garment keys
(768x1024, first UNet level). Cases:

  chunked   ootd's chunked backend with a fixed budget (default 1 GiB)
  sdpa      ootd's sdpa backend (PyTorch fused kernels only)
  math      explicit softmax(QK^T)V in fp32; skipped when the score matrix does not fit in memory
  original  the upstream formulation: all 2N tokens attend to all 2N tokens through plain
            F.scaled_dot_product_attention (PyTorch picks the kernel), garment half of the output discarded
  original-math  the same through PyTorch's math kernel (what SDPA falls back to when no fused kernel
            applies); skipped when it does not fit

Each case runs in a fresh subprocess. Peak extra memory is, on CPU, the rise of the process's peak RSS
(VmHWM, reset through /proc/self/clear_refs after the inputs exist) and, on GPU, torch's peak allocated
minus what was allocated before the call. All cases share the same random inputs (the original case
concatenates person and garment queries), so the fingerprint of the person rows must agree.

    python scripts/bench_attention.py                # table
    python scripts/bench_attention.py --json         # machine-readable
    python scripts/bench_attention.py --device cuda --dtype fp16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CASES = ("chunked", "sdpa", "math", "original", "original-math")
DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2}


def read_status(field: str) -> int:
    """A /proc/self/status memory field in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def math_bytes(args: argparse.Namespace, original: bool = False) -> int:
    """Scores and probabilities of the math path (fp32), both alive at the softmax."""
    nq = 2 * args.queries if original else args.queries
    nk = args.keys
    return 2 * args.batch * args.heads * nq * nk * 4


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Run one case in this (fresh) process and report time and peak extra memory."""
    try:
        Path("/proc/self/oom_score_adj").write_text("1000")  # if memory runs out, this process goes first
    except OSError:
        pass
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ootd.attention import ChunkedBackend, MathBackend, SdpaBackend

    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    b, h, n, nk, d = args.batch, args.heads, args.queries, args.keys, args.head_dim

    def rand(tokens: int) -> torch.Tensor:
        return torch.randn(b, h, tokens, d, generator=gen).to(device, dtype)

    q, q_garment, k, v = rand(n), rand(nk - n), rand(nk), rand(nk)
    if args.case.startswith("original"):
        q = torch.cat([q, q_garment], dim=2)

        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if args.case == "original":
                return F.scaled_dot_product_attention(q, k, v)  # PyTorch picks the kernel
            with sdpa_kernel([SDPBackend.MATH]):
                return F.scaled_dot_product_attention(q, k, v)
    else:
        backend = {"chunked": ChunkedBackend(budget_bytes=args.budget_mib << 20), "sdpa": SdpaBackend(),
                   "math": MathBackend()}[args.case]
        fn = lambda q, k, v: backend(q, k, v, None)  # noqa: E731
    del q_garment
    small = [t[:, :, :64] for t in (q, k, v)]
    fn(*small)  # warm-up: kernel selection, thread pools

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        base = read_status("VmRSS")
    start = time.perf_counter()
    with torch.no_grad():
        out = fn(q, k, v)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() if device.type == "cuda" else read_status("VmHWM")) - base
    person = out[:, :, :n].double()
    return {"case": args.case, "seconds": round(seconds, 3), "peak_extra_bytes": int(peak),
            "fingerprint": [round(person.sum().item(), 3), round(person.abs().max().item(), 5)],
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def run_case(args: argparse.Namespace, case: str) -> dict[str, Any]:
    if case in ("math", "original-math"):
        need = math_bytes(args, original=case == "original-math")
        free = available_memory()
        if args.device == "cpu" and need > free - (2 << 30):
            return {"case": case, "skipped": f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB available"}
    cmd = [sys.executable, __file__, "--child", case, "--device", args.device, "--dtype", args.dtype,
           "--budget-mib", str(args.budget_mib), "--shape", *map(str, (args.batch, args.heads, args.queries,
                                                                         args.keys, args.head_dim))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return {"case": case, "failed": tail[0][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    total = 0
    try:
        total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return f"{cpu}, {os.cpu_count()} cores, {total / 2**30:.0f} GiB RAM"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (ROCm too)")
    parser.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    parser.add_argument("--budget-mib", type=int, default=1024, help="chunked attention budget")
    parser.add_argument("--shape", type=int, nargs=5, default=[1, 8, 12288, 24576, 40],
                        metavar=("B", "H", "NQ", "NK", "D"), help="keys must be >= queries")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.batch, args.heads, args.queries, args.keys, args.head_dim = args.shape
    if args.child:
        args.case = args.child
        print(json.dumps(child(args)))
        return 0

    load_before = os.getloadavg()[0]
    results = [run_case(args, case) for case in args.cases]
    load = f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    report = {"shape": {"batch": args.batch, "heads": args.heads, "queries": args.queries, "keys": args.keys,
                        "head_dim": args.head_dim}, "device": args.device, "dtype": args.dtype,
              "budget_mib": args.budget_mib, "machine": machine(), "load": load, "results": results}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"shape B={args.batch} H={args.heads} Nq={args.queries} Nk={args.keys} D={args.head_dim}, "
          f"{args.dtype} on {args.device}; {report['machine']}; {load}")
    print(f"{'case':<14} {'seconds':>9} {'peak extra':>12}  fingerprint / note")
    for r in results:
        if "seconds" in r:
            print(f"{r['case']:<14} {r['seconds']:>9.2f} {r['peak_extra_bytes'] / 2**20:>8.0f} MiB  {r['fingerprint']}")
        else:
            print(f"{r['case']:<14} {'-':>9} {'-':>12}  {r.get('skipped') or 'FAILED: ' + r['failed']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
