#!/usr/bin/env python
"""A/B timings of single components at full size (random weights), for choices made in the library.

  cross-attention  one denoising step's cross-attention calls (the released UNet's 16 blocks at their real
                   widths and token counts, a 2-token prompt): diffusers' stock processor against ootd's,
                   which folds the short prompt into the projections; max abs difference of the outputs
  vae-encode       two images encoded as one batch against one at a time (the CPU profile's choice),
                   alternating, with the max abs difference of the latents
  garment-unet     the garment UNet's pass as a try-on runs it (timestep 0, block inputs captured, stopping
                   after the last), on [garment, zeros] (guidance) against [garment] alone (no guidance: a
                   few-step adapter's), alternating, wall and process-CPU seconds; max abs difference of the
                   garment's features

    python scripts/bench_components.py cross-attention --resolution 768x1024 --batch 2
    python scripts/bench_components.py cross-attention --resolution 384x512 --batch 4
    python scripts/bench_components.py vae-encode --resolution 768x1024 --repeats 2
    python scripts/bench_components.py garment-unet --resolution 384x512 --repeats 2 --threads 1
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def best_of(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def cross_attention(width: int, height: int, batch: int, repeats: int) -> None:
    import torch
    from diffusers.models.attention_processor import Attention, AttnProcessor2_0

    from ootd.attention import AttentionProcessor
    from ootd.tools.bench.architectures import FULL

    tokens = (width // 8) * (height // 8)
    widths = FULL.unet["block_out_channels"]
    # (channels, tokens, blocks): 2 down + 3 up transformer blocks per level with attention, 1 in the middle
    levels = [(c, tokens // 4**i, 5) for i, c in enumerate(widths[:3])] + [(widths[-1], tokens // 64, 1)]
    cross = FULL.unet["cross_attention_dim"]
    heads = FULL.unet["attention_head_dim"]
    total = {"stock": 0.0, "ootd": 0.0}
    torch.manual_seed(0)
    with torch.inference_mode():
        for channels, n, blocks in levels:
            attn = Attention(query_dim=channels, cross_attention_dim=cross, heads=heads, dim_head=channels // heads,
                             out_bias=True).eval()
            x, context = torch.randn(batch, n, channels), torch.randn(1, 2, cross).expand(batch, -1, -1)
            diff = (AttnProcessor2_0()(attn, x, context) - AttentionProcessor()(attn, x, context)).abs().max()
            stock = best_of(lambda: AttnProcessor2_0()(attn, x, context), repeats)  # noqa: B023
            ours = best_of(lambda: AttentionProcessor()(attn, x, context), repeats)  # noqa: B023
            total["stock"] += stock * blocks
            total["ootd"] += ours * blocks
            print(f"{channels:5d} channels, {n:6d} tokens, batch {batch}: stock {stock * 1e3:7.1f} ms, "
                  f"ootd {ours * 1e3:6.1f} ms, max abs diff {diff:.1e}")
    print(f"one step's cross-attention at {width}x{height}, batch {batch}: stock {total['stock']:.3f} s, "
          f"ootd {total['ootd']:.3f} s")


def vae_encode(width: int, height: int, repeats: int) -> None:
    import torch
    from diffusers import AutoencoderKL

    from ootd.tools.bench.architectures import FULL
    from ootd.weights.loading import quiet_loading

    torch.manual_seed(0)
    with quiet_loading():
        vae = AutoencoderKL(**FULL.vae).eval()
    pixels = torch.randn(2, 3, height, width)
    with torch.inference_mode():
        for r in range(repeats):
            start = time.perf_counter()
            batched = vae.encode(pixels).latent_dist.mode()
            mid = time.perf_counter()
            single = torch.cat([vae.encode(p[None]).latent_dist.mode() for p in pixels])
            end = time.perf_counter()
            print(f"round {r + 1}: batch of 2 {mid - start:.1f} s, one at a time {end - mid:.1f} s, "
                  f"max abs diff {(batched - single).abs().max():.1e}", flush=True)


def garment_unet(width: int, height: int, repeats: int) -> None:
    import torch
    from diffusers import UNet2DConditionModel

    from ootd.method.fusion import capture_block_inputs
    from ootd.tools.bench.architectures import FULL
    from ootd.weights.loading import quiet_loading

    torch.manual_seed(0)
    with quiet_loading():
        unet = UNet2DConditionModel(**FULL.unet).eval().requires_grad_(False)
    garment = torch.randn(1, 4, height // 8, width // 8)
    prompt = torch.randn(1, 2, int(unet.config.cross_attention_dim))

    def features(batch: torch.Tensor) -> tuple[dict[str, torch.Tensor], float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        with capture_block_inputs(unet, stop_early=True) as captured:
            unet(batch, 0, encoder_hidden_states=prompt.expand(batch.shape[0], -1, -1), return_dict=False)
        return dict(captured), time.perf_counter() - wall, time.process_time() - cpu

    with torch.inference_mode():
        for r in range(repeats):
            both, wall2, cpu2 = features(torch.cat([garment, torch.zeros_like(garment)]))
            alone, wall1, cpu1 = features(garment)
            diff = max(float((both[k][:1] - alone[k]).abs().max()) for k in alone)
            print(f"round {r + 1}: [garment, zeros] {wall2:.1f} s wall, {cpu2:.1f} s CPU; [garment] {wall1:.1f} s "
                  f"wall, {cpu1:.1f} s CPU; max abs diff of the garment's features {diff:.1e}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("component", choices=("cross-attention", "vae-encode", "garment-unet"))
    p.add_argument("--resolution", default="768x1024")
    p.add_argument("--batch", type=int, default=2, help="cross-attention: UNet batch (samples x 2 with guidance)")
    p.add_argument("--repeats", type=int, default=None, help="default: 5 for cross-attention, 2 for vae-encode")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    from ootd.errors import UsageError
    from ootd.settings import parse_resolution

    try:
        width, height = parse_resolution(args.resolution).size
    except UsageError as exc:
        print(f"bench_components: {exc}", file=sys.stderr)
        return 2
    if args.batch < 1 or (args.repeats is not None and args.repeats < 1):
        print("bench_components: --batch and --repeats must be at least 1", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.component == "cross-attention":
        cross_attention(width, height, args.batch, args.repeats or 5)
    elif args.component == "garment-unet":
        garment_unet(width, height, args.repeats or 2)
    else:
        vae_encode(width, height, args.repeats or 2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
