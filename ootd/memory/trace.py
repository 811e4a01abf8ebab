"""Measuring activation memory without memory: run the architectures on the meta device and count the bytes
of the tensors alive at each stage's peak (the coefficients of ootd/memory/sizes.py come from here)."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch


class _LiveTensorBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts bytes of tensor storages created inside the mode while they are alive; `peak` is the maximum.

    Storages that existed before (weights, inputs) are not counted, and views share their base's count.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._refs: dict[int, list[int]] = {}  # storage id -> [python tensors alive, bytes]

    def reset_peak(self) -> None:
        self.peak = self.live

    def _release(self, key: int) -> None:
        entry = self._refs.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        flat_in = torch.utils._pytree.tree_leaves((args, kwargs))
        inputs = {t.untyped_storage()._cdata for t in flat_in if isinstance(t, torch.Tensor)}
        for tensor in torch.utils._pytree.tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key = storage._cdata
            if key in self._refs:
                self._refs[key][0] += 1
            elif key in inputs:
                continue  # a view of (or in-place op on) a tensor we do not count
            else:
                self._refs[key] = [1, storage.nbytes()]
                self.live += storage.nbytes()
            weakref.finalize(tensor, self._release, key)
        self.peak = max(self.peak, self.live)
        return out


def _shape_only_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any
                          ) -> torch.Tensor:
    """Attention's output without its workspace: the workspace is estimated per backend separately."""
    return q.new_empty(*q.shape[:-1], v.shape[-1])


@contextlib.contextmanager
def _shape_only_sdpa() -> Iterator[None]:
    import torch.nn.functional as F

    saved = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _shape_only_attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = saved


def trace_activations(garm_config: dict, vton_config: dict, vae_config: dict,
                      latent_hw: tuple[int, int] = (32, 32)) -> dict[str, float]:
    """Measure the activation coefficients of ModelSizes by running the architectures on the meta device.

    Uses the pipeline's own fusion code, so the numbers follow it. Attention kernels are replaced by their
    output shape (their workspace depends on the backend and is added by `estimate`). Takes about a second
    per SD1.5-size UNet and no real memory.
    """
    from diffusers import AutoencoderKL, UNet2DConditionModel

    h, w = latent_hw
    elem = 4  # traced in fp32
    with torch.device("meta"):
        garm = UNet2DConditionModel.from_config(garm_config)
        vton = UNet2DConditionModel.from_config(vton_config)
        vae = AutoencoderKL.from_config(vae_config)
    with torch.inference_mode(), _shape_only_sdpa():
        garm_peak, feature_bytes, kv_bytes, vton_peak = _unet_peaks(garm, vton, latent_hw)
        size, encode_peak, decode_peak = _vae_peaks(vae)
    per_token = 2 * h * w * elem
    return {
        "unet_activation": round(vton_peak / per_token, 1),
        "garm_activation": round(garm_peak / per_token, 1),
        "garment_features": round(feature_bytes / per_token, 1),
        "garment_kv": round(kv_bytes / per_token, 1),
        "vae_encode_activation": round(encode_peak / (size * size * elem), 1),
        "vae_decode_activation": round(decode_peak / (size * size * elem), 1),
    }


def _unet_peaks(garm: torch.nn.Module, vton: torch.nn.Module, latent_hw: tuple[int, int]
                ) -> tuple[int, int, int, int]:
    """Bytes of a batch of 2 on the meta device: the garment UNet's peak, the captured features, the garment keys
    and values the fusion holds, the try-on UNet's peak."""
    from ootd.method.fusion import TryOnFusion, capture_block_inputs

    h, w = latent_hw
    fusion = TryOnFusion(vton, _shape_only_attention)
    meta = torch.device("meta")
    prompt = torch.empty(2, 2, int(vton.config.get("cross_attention_dim", 768)), device=meta)
    with _LiveTensorBytes() as counter:
        garment = torch.empty(2, int(garm.config.get("in_channels", 4)), h, w, device=meta)
        base = counter.live
        with capture_block_inputs(garm) as captured:
            garm(garment, 0, encoder_hidden_states=prompt, return_dict=False)
        features = dict(captured)
        del captured, garment
        garm_peak = counter.peak - base
        feature_bytes = counter.live
        with fusion.garment(features, torch.arange(2, device=meta)):
            kv_bytes = counter.live - feature_bytes
            sample = torch.empty(2, int(vton.config.get("in_channels", 8)), h, w, device=meta)
            before = counter.live
            counter.reset_peak()
            vton(sample, 10, encoder_hidden_states=prompt, return_dict=False)
            vton_peak = counter.peak - before
    return garm_peak, feature_bytes, kv_bytes, vton_peak


def _vae_peaks(vae: torch.nn.Module) -> tuple[int, int, int]:
    """(pixels per side, encode peak bytes, decode peak bytes) of one small image on the meta device: the
    coefficients do not depend on its size."""
    meta = torch.device("meta")
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    size = 16 * factor
    with _LiveTensorBytes() as counter:
        pixels = torch.empty(1, 3, size, size, device=meta)
        base = counter.live
        vae.encode(pixels).latent_dist.mode()
        encode_peak = counter.peak - base
    with _LiveTensorBytes() as counter:
        latents = torch.empty(1, vae.config.latent_channels, size // factor, size // factor, device=meta)
        base = counter.live
        vae.decode(latents, return_dict=False)
        decode_peak = counter.peak - base
    return size, encode_peak, decode_peak
