"""The memory plan is applied to the pipeline, changes nothing in the result, and OOM is retried once."""

from __future__ import annotations

import logging

import pytest
import torch

from ootd.config import Resolution
from ootd.errors import OutOfMemoryError

MiB = 1 << 20


def _latents(pipe, example_images, monkeypatch) -> torch.Tensor:  # noqa: ANN001
    seen: list[torch.Tensor] = []
    decode = pipe._decode
    monkeypatch.setattr(pipe, "_decode", lambda lat, prog: (seen.append(lat.clone()), decode(lat, prog))[1])
    pipe(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"], num_samples=2,
         steps=2, seed=21, resolution=(384, 512))
    monkeypatch.setattr(pipe, "_decode", decode)
    return seen[0]


def test_tight_budget_turns_savings_on_and_gives_the_same_result(pipe_hd, example_images, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(pipe_hd, "max_memory", None)
    roomy = _latents(pipe_hd, example_images, monkeypatch)
    assert pipe_hd.plan is not None
    monkeypatch.setattr(pipe_hd, "max_memory", 1 * MiB)  # nothing fits: every saving on
    tight = _latents(pipe_hd, example_images, monkeypatch)
    plan = pipe_hd.plan
    assert plan.guidance_split and plan.vae_slicing and plan.vae_tiling and not plan.fits
    assert pipe_hd.components.vae.use_slicing and pipe_hd.components.vae.use_tiling
    chunked = [b for b in pipe_hd.attention.backends if type(b).__name__ == "ChunkedBackend"]
    assert all(b.budget_bytes == plan.attention_budget_bytes for b in chunked)
    assert (roomy - tight).abs().max().item() < 1e-5 * max(1.0, roomy.abs().max().item())
    monkeypatch.setattr(pipe_hd, "max_memory", None)
    pipe_hd.apply_plan(pipe_hd.make_plan(Resolution(384, 512), 1, True))
    assert not pipe_hd.components.vae.use_tiling


def test_out_of_memory_in_denoising_is_retried_once(pipe_hd, example_images, monkeypatch, caplog) -> None:  # noqa: ANN001
    real = pipe_hd._denoise
    calls = {"n": 0}

    def flaky(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls["n"] += 1
        if calls["n"] == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 72.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(pipe_hd, "_denoise", flaky)
    monkeypatch.setattr(pipe_hd, "max_memory", 8 << 30)
    with caplog.at_level(logging.WARNING, logger="ootd"):
        result = pipe_hd(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"],
                         steps=1, seed=1, resolution=(384, 512))
    assert calls["n"] == 2 and len(result.images) == 1
    assert any("retrying once with half the memory budget" in r.getMessage() for r in caplog.records)
    assert pipe_hd.plan.budget_bytes == 4 << 30
    monkeypatch.setattr(pipe_hd, "max_memory", None)


def test_second_out_of_memory_is_a_clear_error(pipe_hd, example_images, monkeypatch) -> None:  # noqa: ANN001
    def always(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise torch.OutOfMemoryError("out of memory")

    monkeypatch.setattr(pipe_hd, "_denoise", always)
    with pytest.raises(OutOfMemoryError, match="again after re-planning.*plan that failed"):
        pipe_hd(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"], steps=1,
                seed=1, resolution=(384, 512))


def test_encode_batching_follows_the_device_profile(pipe_hd, example_images, monkeypatch) -> None:  # noqa: ANN001
    import dataclasses

    vae = pipe_hd.components.vae
    batches: list[int] = []
    encode = vae.encode
    monkeypatch.setattr(vae, "encode", lambda x, *a, **k: (batches.append(x.shape[0]), encode(x, *a, **k))[1])
    monkeypatch.setattr(pipe_hd, "max_memory", None)

    def latents() -> torch.Tensor:
        batches.clear()
        return _latents(pipe_hd, example_images, monkeypatch)

    assert pipe_hd.profile.name == "cpu" and not pipe_hd.profile.vae_encode_batched
    one_by_one = latents()
    assert batches and set(batches) == {1} and not pipe_hd.plan.vae_encode_batched
    monkeypatch.setattr(pipe_hd, "profile", dataclasses.replace(pipe_hd.profile, vae_encode_batched=True))
    monkeypatch.setattr(pipe_hd, "plan", None)  # the person's encode reuses the last call's plan otherwise
    batched = latents()
    assert 2 in batches and pipe_hd.plan.vae_encode_batched  # [masked person, person] together
    assert (one_by_one - batched).abs().max().item() < 1e-5 * max(1.0, one_by_one.abs().max().item())
