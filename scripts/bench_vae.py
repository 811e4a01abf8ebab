#!/usr/bin/env python
"""The VAE alone, for comparing environments and kernels (full-size architecture, random weights).

  weights     write one set of random weights (safetensors) and the config, for the runs below to share
  time        decode and encode once each with those weights in *this* environment: run it with ours and
              with a venv holding the original's diffusers pin, and compare outputs and CPU time
  attention   the VAE mid block's attention shape (one head of 512) through PyTorch's default SDPA choice,
              its fused flash kernel and the unfused math kernel, in fp32 or bf16
  profile     where an encode and a decode spend their CPU time, per kind of module and resolution, in each
              dtype and memory layout given (e.g. fp32-nchw,bf16-nchw,bf16-nhwc), with page faults, optionally
              oneDNN's kernels and reorders, and each variant's difference from the first

    python scripts/bench_vae.py weights --out /tmp/vae
    python scripts/bench_vae.py time --weights /tmp/vae --resolution 384x512 --threads 1
    OLD_VENV/bin/python scripts/bench_vae.py time --weights /tmp/vae --resolution 384x512 --threads 1
    python scripts/bench_vae.py attention --resolution 768x1024 --dtype bf16
    python scripts/bench_vae.py profile --resolution 768x1024 --threads 1 --variants fp32-nchw,bf16-nchw,bf16-nhwc \\
        --onednn --malloc-heap-mib 0

The profile encodes examples/person.png (resized) and decodes its latents; the VAE has random weights of the
released architecture (seed 0). `--malloc-heap-mib` sets what glibc's malloc keeps (the CPU profile's
`[environment] malloc_heap_mib`; 0: malloc's own default, every large tensor a fresh mmap).

OLD_VENV: a venv with torch and the original's pin (diffusers 0.24.0, huggingface_hub<0.21, safetensors).
`time` needs only torch, diffusers and safetensors, so it runs in an environment without ootd installed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _size(text: str) -> tuple[int, int]:
    width, _, height = text.partition("x")
    return int(width), int(height)


def write_weights(out: Path) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    import torch
    from diffusers import AutoencoderKL
    from safetensors.torch import save_file

    from ootd.tools.bench.architectures import FULL

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    vae = AutoencoderKL(**FULL.vae)
    (out / "config.json").write_text(json.dumps(dict(FULL.vae)))
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, str(out / "vae.safetensors"))
    print(f"wrote {out}")


def time_vae(weights: Path, size: tuple[int, int], threads: int) -> None:
    import diffusers
    import torch
    from diffusers import AutoencoderKL
    from diffusers.models.attention_processor import AttnProcessor2_0
    from safetensors.torch import load_file

    torch.set_num_threads(threads)
    vae = AutoencoderKL(**json.loads((weights / "config.json").read_text())).eval()
    vae.load_state_dict(load_file(str(weights / "vae.safetensors")))
    vae.set_attn_processor(AttnProcessor2_0())  # the stock SDPA processor, in both versions
    g = torch.Generator().manual_seed(0)
    width, height = size
    latents = torch.randn(1, 4, height // 8, width // 8, generator=g)
    pixels = torch.rand(1, 3, height, width, generator=g) * 2 - 1
    runs = {"decode": lambda: vae.decode(latents).sample, "encode": lambda: vae.encode(pixels).latent_dist.mode()}
    with torch.no_grad():
        for name, run in runs.items():
            wall, cpu = time.perf_counter(), time.process_time()
            out = run()
            wall = time.perf_counter() - wall
            print(f"diffusers {diffusers.__version__} {name} {width}x{height}: wall {wall:.2f} s, "
                  f"CPU {time.process_time() - cpu:.2f} s, mean |output| {float(out.abs().mean()):.6f}", flush=True)


def time_attention(size: tuple[int, int], repeats: int, dtype: str = "fp32") -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tokens = (size[0] // 8) * (size[1] // 8)
    q, k, v = (torch.randn(1, 1, tokens, 512).to(getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[dtype]))
               for _ in range(3))
    kernels = {"default": None, "flash": [SDPBackend.FLASH_ATTENTION], "math": [SDPBackend.MATH]}
    for name, allowed in kernels.items():
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            if allowed is None:
                F.scaled_dot_product_attention(q, k, v)
            else:
                with sdpa_kernel(allowed):
                    F.scaled_dot_product_attention(q, k, v)
            times.append(time.perf_counter() - start)
        print(f"attention {tokens} tokens, one head of 512, {name}: " + ", ".join(f"{t:.2f}" for t in times) + " s"
              + (f" ({dtype})" if dtype != "fp32" else ""), flush=True)


def profile(size: tuple[int, int], variants: str, threads: int, stages: str, onednn: bool, malloc_heap_mib: int,
            out: Path | None) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    import os

    import numpy as np
    import torch
    from diffusers import AutoencoderKL
    from PIL import Image

    from ootd.hardware.policy import keep_freed_memory
    from ootd.imaging.files import load_image
    from ootd.tools.bench.architectures import FULL
    from ootd.tools.bench.vae_profile import Variant, profile_table, profile_vae

    try:
        chosen = [Variant.parse(v) for v in variants.split(",")]
    except ValueError as exc:
        raise SystemExit(f"bench_vae.py profile: {exc}") from None
    torch.set_num_threads(threads)
    kept = keep_freed_memory(malloc_heap_mib << 20)
    torch.manual_seed(0)
    vae = AutoencoderKL(**FULL.vae).eval().requires_grad_(False)
    picture = load_image(REPO_ROOT / "examples" / "person.png", "person").resize(size, Image.BICUBIC)
    image = torch.from_numpy(np.asarray(picture, dtype=np.float32) / 127.5 - 1).permute(2, 0, 1)[None].contiguous()
    print(f"VAE profile {size[0]}x{size[1]}, {threads} thread(s), malloc keeps freed memory: {kept}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    report = profile_vae(vae, image, chosen, stages=tuple(stages.split(",")), onednn=onednn,
                         log=lambda line: print("  " + line, flush=True))
    report.update(resolution=list(size), malloc_keeps_freed=kept, load_average_after=list(os.getloadavg()))
    print("\n".join(profile_table(report)))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if out is not None:
        out.write_text(json.dumps(report, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("weights")
    w.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("time")
    t.add_argument("--weights", type=Path, required=True)
    t.add_argument("--resolution", type=_size, default=(384, 512))
    t.add_argument("--threads", type=int, default=1)
    a = sub.add_parser("attention")
    a.add_argument("--resolution", type=_size, default=(768, 1024))
    a.add_argument("--repeats", type=int, default=3)
    a.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    f = sub.add_parser("profile")
    f.add_argument("--resolution", type=_size, default=(768, 1024))
    f.add_argument("--variants", default="fp32-nchw,bf16-nchw,bf16-nhwc")
    f.add_argument("--threads", type=int, default=1)
    f.add_argument("--stages", default="encode,decode", choices=("encode,decode", "encode", "decode"))
    f.add_argument("--onednn", action="store_true", help="also summarise oneDNN's verbose log (kernels, reorders)")
    f.add_argument("--malloc-heap-mib", type=int, default=0)
    f.add_argument("--out", type=Path, default=None, help="write the JSON report there")
    args = p.parse_args()
    if args.command == "weights":
        write_weights(args.out)
    elif args.command == "time":
        if not (args.weights / "vae.safetensors").is_file():
            p.error(f"no weights in {args.weights}: run `weights --out {args.weights}` first")
        time_vae(args.weights, args.resolution, args.threads)
    elif args.command == "attention":
        time_attention(args.resolution, args.repeats, args.dtype)
    else:
        profile(args.resolution, args.variants, args.threads, args.stages, args.onednn, args.malloc_heap_mib,
                args.out)


if __name__ == "__main__":
    main()
