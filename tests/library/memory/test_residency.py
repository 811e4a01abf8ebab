"""The memory plan is applied to the pipeline, changes nothing in the result, and OOM is retried once."""

from __future__ import annotations

import logging

import pytest
import torch

from ootd.errors import OutOfMemoryError
from ootd.settings import Category, Resolution, SamplingSettings

MiB = 1 << 20


def _latents(pipe, example_images, monkeypatch) -> torch.Tensor:  # noqa: ANN001
    seen: list[torch.Tensor] = []
    decode = pipe._decode
    monkeypatch.setattr(pipe, "_decode", lambda lat, prog: (seen.append(lat.clone()), decode(lat, prog))[1])
    pipe(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"], num_samples=2,
         steps=2, seed=21, resolution=(384, 512))
    monkeypatch.setattr(pipe, "_decode", decode)
    return seen[0]


@pytest.mark.slow  # whole try-ons under several budgets
def test_tight_budget_turns_savings_on_and_gives_the_same_result(pipe_hd, example_images, monkeypatch) -> None:  # noqa: ANN001
    """The savings of the denoising stage (guidance in two halves, chunked attention) change no latent; the VAE's
    (slicing, tiling) are switched on too."""
    monkeypatch.setattr(pipe_hd.residency, "max_memory", None)
    resolution = Resolution(384, 512)
    person = pipe_hd.prepare_person(example_images["person"], Category.UPPER, mask=example_images["mask"],
                                    resolution=resolution)
    garment = pipe_hd.prepare_garment(example_images["tshirt"], Category.UPPER, resolution=resolution)
    settings = SamplingSettings(num_samples=2, steps=2, seed=21, resolution=resolution)
    roomy = _generated_latents(pipe_hd, person, garment, settings, monkeypatch)
    assert pipe_hd.plan is not None and not pipe_hd.plan.guidance_split
    monkeypatch.setattr(pipe_hd.residency, "max_memory", 1 * MiB)  # nothing fits: every saving on
    tight = _generated_latents(pipe_hd, person, garment, settings, monkeypatch)
    plan = pipe_hd.plan
    assert plan.guidance_split and plan.vae_slicing and plan.vae_tiling and not plan.fits
    assert pipe_hd.components.vae.use_slicing and pipe_hd.components.vae.use_tiling
    chunked = [b for b in pipe_hd.attention.backends if type(b).__name__ == "ChunkedBackend"]
    assert all(b.budget_bytes == plan.attention_budget_bytes for b in chunked)
    assert (roomy - tight).abs().max().item() < 1e-5 * max(1.0, roomy.abs().max().item())
    monkeypatch.setattr(pipe_hd.residency, "max_memory", None)
    pipe_hd.residency.apply(pipe_hd.residency.make_plan(resolution.size, 1, True))
    assert not pipe_hd.components.vae.use_tiling


def _generated_latents(pipe, person, garment, settings, monkeypatch) -> torch.Tensor:  # noqa: ANN001
    seen: list[torch.Tensor] = []
    decode = pipe._decode
    monkeypatch.setattr(pipe, "_decode", lambda lat, prog: (seen.append(lat.clone()), decode(lat, prog))[1])
    pipe.generate(person, garment, settings)
    monkeypatch.setattr(pipe, "_decode", decode)
    return seen[0]


def test_encodes_plan_for_one_image_whatever_the_call_before(pipe_hd, example_images, monkeypatch) -> None:  # noqa: ANN001
    """A call's encodes do not inherit the plan of the call before (more samples, a tighter budget): a batch's
    second pair is encoded as a first try-on would be."""
    resolution = Resolution(384, 512)

    def encoded() -> torch.Tensor:
        return pipe_hd.prepare_person(example_images["person"], Category.UPPER, mask=example_images["mask"],
                                      resolution=resolution).person_latents

    monkeypatch.setattr(pipe_hd.residency, "plan", None)
    first = encoded()
    monkeypatch.setattr(pipe_hd.residency, "max_memory", 1 * MiB)
    # what a tight 4-sample call left behind
    pipe_hd.residency.apply(pipe_hd.residency.make_plan(resolution.size, 4, True))
    monkeypatch.setattr(pipe_hd.residency, "max_memory", None)
    assert torch.equal(encoded(), first) and pipe_hd.plan.request.num_samples == 1
    assert not pipe_hd.plan.vae_tiling


def test_the_garment_pass_runs_under_a_plan_for_its_own_items(pipe_hd, example_images, monkeypatch) -> None:  # noqa: ANN001
    """The garment UNet runs on [garment, zeros] with guidance and on [garment] alone without: the plan in force
    for that pass counts as many garment items as it runs on, so without guidance its garment stage is the guided
    one's less one item's share (tests/library/memory/test_planner.py: what that share is)."""
    resolution = Resolution(384, 512)
    monkeypatch.setattr(pipe_hd.residency, "max_memory", None)
    seen: dict[bool, tuple[bool, int, int]] = {}
    features = pipe_hd.garment_features

    def spy(latents, prompt, unconditional=True):  # noqa: ANN001, ANN202
        made = features(latents, prompt, unconditional)
        plan = pipe_hd.plan
        seen[unconditional] = (plan.request.guidance, plan.estimate["garment_unet"],
                               next(iter(made.values())).shape[0])
        return made

    monkeypatch.setattr(pipe_hd, "garment_features", spy)
    for guidance in (True, False):
        pipe_hd.prepare_garment(example_images["tshirt"], Category.UPPER, resolution=resolution, guidance=guidance)
    (planned_on, stage_on, items_on), (planned_off, stage_off, items_off) = seen[True], seen[False]
    assert (items_on, items_off) == (2, 1)
    assert (planned_on, planned_off) == (True, False)
    assert stage_off < stage_on


def test_out_of_memory_in_denoising_is_retried_once(pipe_hd, example_images, monkeypatch, caplog) -> None:  # noqa: ANN001
    real = pipe_hd._denoise
    calls = {"n": 0}

    def flaky(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls["n"] += 1
        if calls["n"] == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 72.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(pipe_hd, "_denoise", flaky)
    monkeypatch.setattr(pipe_hd.residency, "max_memory", 8 << 30)
    with caplog.at_level(logging.WARNING, logger="ootd"):
        result = pipe_hd(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"],
                         steps=1, seed=1, resolution=(384, 512))
    assert calls["n"] == 2 and len(result.images) == 1
    assert any("retrying once with half the memory budget" in r.getMessage() for r in caplog.records)
    assert pipe_hd.plan.budget_bytes == 4 << 30
    monkeypatch.setattr(pipe_hd.residency, "max_memory", None)


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
    monkeypatch.setattr(pipe_hd.residency, "max_memory", None)

    def latents() -> torch.Tensor:
        batches.clear()
        return _latents(pipe_hd, example_images, monkeypatch)

    assert pipe_hd.profile.name == "cpu" and not pipe_hd.profile.vae_encode_batched
    one_by_one = latents()
    assert batches and set(batches) == {1} and not pipe_hd.plan.vae_encode_batched
    monkeypatch.setattr(pipe_hd.residency, "profile", dataclasses.replace(pipe_hd.profile, vae_encode_batched=True))
    monkeypatch.setattr(pipe_hd.residency, "plan", None)  # a plan made with the old profile
    batched = latents()
    assert 2 in batches and pipe_hd.plan.vae_encode_batched  # [masked person, person] together
    assert (one_by_one - batched).abs().max().item() < 1e-5 * max(1.0, one_by_one.abs().max().item())
