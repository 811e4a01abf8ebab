"""ootd's fusion and denoising equal an independent re-statement of the original formulation.

The reference below is written from the method's description (docs/upstream.md §3-§5), not from
ootd's code: the garment UNet runs on 2 x samples, every try-on transformer block attends over
the concatenated [person; garment] tokens with stock diffusers attention and keeps the first
half, the three images are encoded one by one, and the loop is spelled out step by step.
"""

from __future__ import annotations

import inspect
import types

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKL, PNDMScheduler, UniPCMultistepScheduler
from diffusers.models.attention import BasicTransformerBlock
from diffusers.models.attention_processor import AttnProcessor2_0
from PIL import Image

from ootd.method.schedulers import set_timesteps
from ootd.pipeline import TryOnPipeline
from ootd.weights.loading import load_components


def _reference_block_forward(block: BasicTransformerBlock, garment: dict):  # noqa: ANN202
    """The original block: self-attention over cat(person, garment) tokens, first half kept.
    Garment features are consumed in execution order, as the original pops them from a list."""

    def forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None,  # noqa: ANN001, ANN202
                encoder_attention_mask=None, timestep=None, cross_attention_kwargs=None,
                class_labels=None, added_cond_kwargs=None):
        n = hidden_states.shape[1]
        feature = garment["features"][garment["next"] % len(garment["features"])]
        garment["next"] += 1
        x = torch.cat([hidden_states, feature], dim=1)
        x = self.attn1(self.norm1(x)) + x
        x = x[:, :n]
        x = self.attn2(self.norm2(x), encoder_hidden_states=encoder_hidden_states) + x
        return self.ff(self.norm3(x)) + x

    return types.MethodType(forward, block)


def reference_latents(tree, image_person, image_garment, image_mask, num_samples, steps, scale, seed):  # noqa: ANN001
    """Final latents of the original procedure, on freshly loaded stock components."""
    fp32 = {k: torch.float32 for k in ("unet", "vae", "text_encoder", "image_encoder")}
    c = load_components(tree, "hd", fp32)
    for m in (c.unet_garm, c.unet_vton, c.vae):
        m.set_attn_processor(AttnProcessor2_0())
    vae: AutoencoderKL = c.vae
    sf = vae.config.scaling_factor

    def encode(img: Image.Image) -> torch.Tensor:
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 127.5 - 1.0).permute(2, 0, 1)[None]
        return vae.encode(x).latent_dist.mode()

    size = (384, 512)
    person = image_person.resize(size)
    garment = image_garment.resize(size)
    mask = image_mask.resize(size, Image.NEAREST)
    mask_arr = (np.asarray(mask) >= 127).astype(np.float32)
    masked = np.asarray(person).copy()
    masked[mask_arr > 0] = 127
    masked_img = Image.fromarray(masked)

    # prompt embeddings, hd: 2 text tokens, the 2nd replaced by the image embedding
    ids = c.tokenizer([""], max_length=2, padding="max_length", truncation=True, return_tensors="pt").input_ids
    prompt = c.text_encoder(ids)[0].clone()
    pixels = c.image_processor(images=garment, return_tensors="pt").pixel_values
    prompt[:, 1:] = c.image_encoder(pixels).image_embeds.unsqueeze(1)

    guidance = scale >= 1.0
    garm_lat = encode(garment).repeat(num_samples, 1, 1, 1)
    if guidance:
        garm_lat = torch.cat([garm_lat, torch.zeros_like(garm_lat)])
    vton_lat = encode(masked_img).repeat(num_samples * (2 if guidance else 1), 1, 1, 1)
    orig_lat = encode(person) * sf
    prompt_b = prompt.repeat(garm_lat.shape[0], 1, 1)

    # garment UNet on 2 x samples, block inputs recorded in order
    captured: list[torch.Tensor] = []
    garm_blocks = [m for m in c.unet_garm.modules() if isinstance(m, BasicTransformerBlock)]
    hooks = [b.register_forward_pre_hook(lambda mod, args, kw: captured.append(kw.get("hidden_states", args[0]
                                                                                    if args else None)),
                                         with_kwargs=True) for b in garm_blocks]
    c.unet_garm(garm_lat, 0, encoder_hidden_states=prompt_b)
    for h in hooks:
        h.remove()
    vton_blocks = [m for m in c.unet_vton.modules() if isinstance(m, BasicTransformerBlock)]
    assert len(vton_blocks) == len(captured)
    shared = {"features": captured, "next": 0}  # one pass of the try-on UNet visits every block once
    for block in vton_blocks:
        block.forward = _reference_block_forward(block, shared)

    # the original's diffusers handed every key PNDM had read (its defaults included) to UniPC
    base = dict(PNDMScheduler.from_pretrained(tree / "ootd" / "scheduler").config)
    accepted = set(inspect.signature(UniPCMultistepScheduler.__init__).parameters)
    sched = UniPCMultistepScheduler(**{k: v for k, v in base.items() if k in accepted}, final_sigmas_type="sigma_min")
    assert sched.config.timestep_spacing == "leading"
    set_timesteps(sched, steps)  # diffusers' own, without numpy 2's notice about torch's __array__
    noise = torch.randn((num_samples, 4, 64, 48), generator=torch.manual_seed(seed))
    latents = noise * sched.init_noise_sigma
    mask_lat = torch.nn.functional.interpolate(torch.from_numpy(mask_arr)[None, None], size=(64, 48))
    for i, t in enumerate(sched.timesteps):
        x = torch.cat([latents] * 2) if guidance else latents
        x = torch.cat([sched.scale_model_input(x, t), vton_lat], dim=1)
        pred = c.unet_vton(x, t, encoder_hidden_states=prompt_b).sample
        if guidance:
            with_garment, without = pred.chunk(2)
            pred = without + scale * (with_garment - without)
        latents = sched.step(pred, t, latents).prev_sample
        init = orig_lat
        if i < len(sched.timesteps) - 1:
            init = sched.add_noise(init, noise, torch.tensor([sched.timesteps[i + 1]]))
        latents = (1 - mask_lat) * init + mask_lat * latents
    return latents


@pytest.mark.parametrize(("num_samples", "scale"), [(1, 2.0), (3, 2.0), (1, 0.5), (3, 0.5)])
def test_pipeline_equals_original_formulation(pipe_hd: TryOnPipeline, tiny_tree, example_images,  # noqa: ANN001
                                              monkeypatch, num_samples, scale) -> None:
    person = Image.open(example_images["person"]).convert("RGB")
    garment = Image.open(example_images["tshirt"]).convert("RGB")
    mask = Image.open(example_images["mask"]).convert("L")
    steps, seed = 2, 123

    seen: list[torch.Tensor] = []
    original_decode = pipe_hd._decode

    def spy(latents, progress):  # noqa: ANN001, ANN202
        seen.append(latents.clone())
        return original_decode(latents, progress)

    monkeypatch.setattr(pipe_hd, "_decode", spy)
    result = pipe_hd(person, garment, "upper", mask=mask, num_samples=num_samples, steps=steps,
                     guidance_scale=scale, seed=seed, resolution=(384, 512), fit="stretch")
    ours = seen[0]
    with torch.no_grad():
        ref = reference_latents(tiny_tree, person, garment, mask, num_samples, steps, scale, seed)
    assert ours.shape == ref.shape == (num_samples, 4, 64, 48)
    err = (ours - ref).abs().max().item()
    assert err < 1e-5 * max(1.0, ref.abs().max().item()), err
    assert len(result.images) == num_samples


def test_reference_is_sensitive_to_the_fusion(pipe_hd: TryOnPipeline, tiny_tree, example_images,  # noqa: ANN001
                                              monkeypatch) -> None:
    """Guard against a vacuous comparison: dropping the garment tokens changes the result."""
    person = Image.open(example_images["person"]).convert("RGB")
    garment = Image.open(example_images["tshirt"]).convert("RGB")
    mask = Image.open(example_images["mask"]).convert("L")
    seen: list[torch.Tensor] = []
    original_decode = pipe_hd._decode
    monkeypatch.setattr(pipe_hd, "_decode", lambda lat, prog: (seen.append(lat.clone()), original_decode(lat, prog))[1])
    for proc in pipe_hd.fusion.processors.values():
        monkeypatch.setattr(proc, "set_garment", _zero_garment(proc.set_garment))
    pipe_hd(person, garment, "upper", mask=mask, steps=2, seed=123, resolution=(384, 512), fit="stretch")
    with torch.no_grad():
        ref = reference_latents(tiny_tree, person, garment, mask, 1, 2, 2.0, 123)
    assert (seen[0] - ref).abs().max().item() > 1e-3


def _zero_garment(set_garment):  # noqa: ANN001, ANN202
    def wrapped(attn, garment_hidden, sample_index):  # noqa: ANN001, ANN202
        return set_garment(attn, torch.zeros_like(garment_hidden), sample_index)

    return wrapped
