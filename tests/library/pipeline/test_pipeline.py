"""The library API end to end on the tiny tree: sizes, seeds, samples, hd/dc, conditioning, scheduler."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from diffusers import PNDMScheduler, UniPCMultistepScheduler
from PIL import Image

from ootd.errors import UsageError
from ootd.method.guidance import latent_mask
from ootd.method.schedulers import build_scheduler, set_timesteps
from ootd.settings import Category, ModelType, SamplingSettings, SchedulerName, parse_resolution
from ootd.weights.layout import Layout
from ootd.weights.loading import load_scheduler_config


def _arr(img: Image.Image) -> np.ndarray:
    return np.asarray(img, dtype=np.int16)


@pytest.mark.parametrize("resolution", [(384, 512), (768, 1024)])
def test_hd_images_have_the_working_size(pipe_hd, example_images, resolution) -> None:  # noqa: ANN001
    steps = 2 if resolution == (384, 512) else 1
    result = pipe_hd(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"],
                     num_samples=2 if steps == 2 else 1, steps=steps, seed=5, resolution=resolution)
    assert all(img.size == resolution and img.mode == "RGB" for img in result.images)
    assert result.mask.size == resolution and result.mask.mode == "L"
    assert result.masked_person.size == resolution
    assert result.seed == 5
    assert len(result.timings.steps) == steps
    assert str(result.sampling.resolution) == f"{resolution[0]}x{resolution[1]}"


@pytest.mark.parametrize("category", ["lower", "dress", "upper"])
def test_dc_runs_every_category(pipe_dc, example_images, category) -> None:  # noqa: ANN001
    result = pipe_dc(example_images["person"], example_images["trousers"], category, mask=example_images["mask"],
                     steps=1, seed=1, resolution=(384, 512))
    assert result.images[0].size == (384, 512)
    assert result.category.value == category


def test_same_seed_same_images_other_seed_other_images(pipe_hd, example_images) -> None:  # noqa: ANN001
    kw = dict(mask=example_images["mask"], num_samples=3, steps=2, resolution=(384, 512))
    a = pipe_hd(example_images["person"], example_images["tshirt"], "upper", seed=7, **kw)
    b = pipe_hd(example_images["person"], example_images["tshirt"], "upper", seed=7, **kw)
    c = pipe_hd(example_images["person"], example_images["tshirt"], "upper", seed=8, **kw)
    assert len(a.images) == 3
    for x, y in zip(a.images, b.images, strict=True):
        assert np.array_equal(_arr(x), _arr(y))
    assert not np.array_equal(_arr(a.images[0]), _arr(c.images[0]))
    # three samples are three different pictures
    assert not np.array_equal(_arr(a.images[0]), _arr(a.images[1]))
    assert not np.array_equal(_arr(a.images[1]), _arr(a.images[2]))


def test_random_seed_is_reported_and_reproduces(pipe_hd, example_images) -> None:  # noqa: ANN001
    kw = dict(mask=example_images["mask"], steps=1, resolution=(384, 512))
    a = pipe_hd(example_images["person"], example_images["tshirt"], "upper", **kw)
    b = pipe_hd(example_images["person"], example_images["tshirt"], "upper", seed=a.seed, **kw)
    assert np.array_equal(_arr(a.images[0]), _arr(b.images[0]))


def test_outside_the_mask_the_latents_are_the_person(pipe_hd, example_images, monkeypatch) -> None:  # noqa: ANN001
    """Mask blending: after the last step every latent outside the mask is the person's own."""
    seen: list[torch.Tensor] = []
    decode = pipe_hd._decode
    monkeypatch.setattr(pipe_hd, "_decode", lambda lat, prog: (seen.append(lat.clone()), decode(lat, prog))[1])
    person = pipe_hd.prepare_person(example_images["person"], Category.UPPER, mask=example_images["mask"],
                                    resolution=parse_resolution("384x512"))
    garment = pipe_hd.prepare_garment(example_images["tshirt"], Category.UPPER, resolution=parse_resolution("384x512"))
    settings = SamplingSettings.from_words(num_samples=2, steps=3, seed=3, resolution=(384, 512))
    pipe_hd.generate(person, garment, settings)
    latents = seen[0]
    mask = latent_mask(person.mask, latents.shape[-2:], latents.device, latents.dtype)[0, 0].bool()
    assert 0 < mask.sum() < mask.numel()
    outside = ~mask
    for i in range(2):
        assert torch.equal(latents[i][:, outside], person.original_latents[0][:, outside])
        assert not torch.allclose(latents[i][:, mask], person.original_latents[0][:, mask])


def test_hd_refuses_lower_and_dress(pipe_hd, example_images) -> None:  # noqa: ANN001
    with pytest.raises(UsageError, match="hd model only does upper-body"):
        pipe_hd(example_images["person"], example_images["trousers"], "lower", mask=example_images["mask"], steps=1)


def test_bad_settings_are_usage_errors(pipe_hd, example_images) -> None:  # noqa: ANN001
    args = (example_images["person"], example_images["tshirt"], "upper")
    for kw in ({"resolution": (500, 500)}, {"resolution": "1x1"}, {"steps": 0}, {"num_samples": 0},
               {"scheduler": "nope"}, {"fit": "squash"}, {"mask_grow": -1}):
        with pytest.raises(UsageError):
            pipe_hd(*args, mask=example_images["mask"], **kw)
    with pytest.raises(UsageError):
        pipe_hd(*args[:2], "shoes", mask=example_images["mask"])


def test_padding_is_cut_away_again(pipe_hd, example_images) -> None:  # noqa: ANN001
    wide = Image.new("RGB", (900, 600), (120, 140, 160))
    result = pipe_hd(wide, example_images["tshirt"], "upper", mask=Image.new("L", (900, 600), 255), steps=1,
                     resolution=(384, 512), fit="pad")
    w, h = result.images[0].size
    assert w == 384 and abs(h - round(384 * 600 / 900)) <= 1
    stretched = pipe_hd(wide, example_images["tshirt"], "upper", mask=Image.new("L", (900, 600), 255), steps=1,
                        resolution=(384, 512), fit="stretch")
    assert stretched.images[0].size == (384, 512)


@pytest.mark.parametrize("scheduler", ["dpmpp", "ddim", "euler"])
def test_other_schedulers_run(pipe_hd, example_images, scheduler) -> None:  # noqa: ANN001
    result = pipe_hd(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"],
                     steps=2, seed=1, resolution=(384, 512), scheduler=scheduler)
    assert np.isfinite(_arr(result.images[0])).all()


def test_prompt_embeddings_shapes(pipe_hd, pipe_dc, example_images) -> None:  # noqa: ANN001
    garment = Image.open(example_images["tshirt"]).convert("RGB")
    hd = pipe_hd._conditioning(garment, Category.UPPER)
    dc = pipe_dc._conditioning(garment, Category.DRESS)
    assert hd.shape == (1, 2, 32) and dc.shape == (1, 4, 32)
    c = pipe_hd.components
    pixels = c.image_processor(images=garment, return_tensors="pt").pixel_values
    image_embed = c.image_encoder(pixels).image_embeds
    assert torch.allclose(hd[0, 1], image_embed[0], atol=1e-6)  # hd: position 1 is the image
    assert torch.allclose(dc[0, 3], pipe_dc.components.image_encoder(pixels).image_embeds[0], atol=1e-6)
    ids = c.tokenizer(["dress"], max_length=3, padding="max_length", truncation=True, return_tensors="pt").input_ids
    text = pipe_dc.components.text_encoder(ids)[0]
    assert torch.allclose(dc[0, :3], text[0], atol=1e-6)  # dc: the category word's 3 tokens first


def test_scheduler_is_built_through_the_folder_class(tiny_tree) -> None:  # noqa: ANN001
    """PNDM reads the file first (leading spacing, steps_offset), then UniPC ending on sigma_min."""
    config = load_scheduler_config(Layout(tiny_tree))
    ours = build_scheduler(SchedulerName.UNIPC, config)
    set_timesteps(ours, 20)
    pndm = dict(PNDMScheduler.from_pretrained(tiny_tree / "ootd" / "scheduler").config)
    assert pndm["timestep_spacing"] == "leading"
    ref = UniPCMultistepScheduler(**{k: v for k, v in pndm.items() if not k.startswith("_") and k not in
                                     ("skip_prk_steps", "set_alpha_to_one", "clip_sample")},
                                  final_sigmas_type="sigma_min")
    set_timesteps(ref, 20)
    assert torch.equal(ours.timesteps, ref.timesteps)
    assert ours.config.timestep_spacing == "leading" and ours.config.steps_offset == 1
    # UniPC's "leading": multiples of 1000 // 21, newest first, last dropped, plus steps_offset 1
    assert ours.timesteps[0].item() == 941 and ours.timesteps[-1].item() == 48
    direct = UniPCMultistepScheduler.from_pretrained(tiny_tree / "ootd" / "scheduler")
    set_timesteps(direct, 20)
    assert not torch.equal(direct.timesteps, ours.timesteps)  # the trap the spec warns about
    assert ours.config.final_sigmas_type == "sigma_min"


@pytest.mark.parametrize("name", list(SchedulerName))
def test_setting_the_timesteps_warns_nothing(tiny_tree, name: SchedulerName) -> None:  # noqa: ANN001
    """numpy 2's notice about torch's __array__ (raised inside diffusers' set_timesteps, every call) is not
    shown: the locked set runs clean. Any other warning still is."""
    scheduler = build_scheduler(name, load_scheduler_config(Layout(tiny_tree)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        set_timesteps(scheduler, 4)
    assert len(scheduler.timesteps) == 4


def test_model_types_are_parsed(pipe_hd, pipe_dc) -> None:  # noqa: ANN001
    assert pipe_hd.model_type is ModelType.HD and pipe_dc.model_type is ModelType.DC


def test_without_guidance_the_garment_unet_runs_on_the_garment_alone(pipe_hd, example_images) -> None:  # noqa: ANN001
    """Guidance off (a few-step adapter's scale 0): the garment UNet on [garment], not on [garment, zeros] whose
    zeros item no step reads; the same pictures as with it; such features refuse a guided call."""
    batches: list[int] = []
    handle = pipe_hd.components.unet_garm.register_forward_pre_hook(lambda _m, args: batches.append(args[0].shape[0]))
    kw = dict(mask=example_images["mask"], steps=2, seed=3, resolution=(384, 512))
    try:
        off = pipe_hd(example_images["person"], example_images["tshirt"], "upper", guidance_scale=0.0, **kw)
        pipe_hd(example_images["person"], example_images["tshirt"], "upper", guidance_scale=2.0, **kw)
    finally:
        handle.remove()
    assert batches == [1, 2]
    res = parse_resolution("384x512")
    person = pipe_hd.prepare_person(example_images["person"], Category.UPPER, mask=example_images["mask"],
                                    resolution=res)
    both = pipe_hd.prepare_garment(example_images["tshirt"], Category.UPPER, resolution=res)
    alone = pipe_hd.prepare_garment(example_images["tshirt"], Category.UPPER, resolution=res, guidance=False)
    assert both.unconditional and not alone.unconditional
    assert {k: v.shape[0] for k, v in alone.features.items()} == {k: 1 for k in both.features}
    unguided = SamplingSettings.from_words(steps=2, seed=3, guidance_scale=0.0, resolution=(384, 512))
    before = pipe_hd.generate(person, both, unguided)  # the unconditional item computed, and not read
    assert np.abs(_arr(before.images[0]) - _arr(off.images[0])).max() <= 1
    guided = SamplingSettings.from_words(steps=2, seed=3, guidance_scale=2.0, resolution=(384, 512))
    with pytest.raises(UsageError, match="without guidance's unconditional half"):
        pipe_hd.generate(person, alone, guided)
