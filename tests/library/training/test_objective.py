"""The training objective is the method's: for the same noised latents and timestep, its prediction is the inference
pipeline's own try-on UNet call (the conditional half for a kept garment, the unconditional half for a dropped
one), and its draws depend on (seed, step, index) only."""

from __future__ import annotations

import torch

from ootd.settings import Category, SamplingSettings, parse_resolution
from ootd.training.objective import TryOnObjective, draw


def test_the_training_prediction_is_the_inference_unet_call(pipe_hd, example_images: dict) -> None:  # noqa: ANN001
    res = parse_resolution("384x512")
    person = pipe_hd.prepare_person(example_images["person"], Category.UPPER, mask=example_images["mask"],
                                    resolution=res)
    garment = pipe_hd.prepare_garment(example_images["tshirt"], Category.UPPER, resolution=res)
    unet = pipe_hd.components.unet_vton
    calls = []
    handle = unet.register_forward_hook(lambda m, args, kwargs, out: calls.append((args, kwargs, out[0])),
                                        with_kwargs=True)
    try:
        pipe_hd.generate(person, garment, SamplingSettings(steps=1, guidance_scale=2.0, seed=3, resolution=res))
    finally:
        handle.remove()
    (args, kwargs, inference_pred), = calls
    model_in, t = args[0], args[1]
    assert model_in.shape[0] == 2  # [conditional, unconditional]
    (garment_latents,) = pipe_hd._encode([garment.garment])
    objective = TryOnObjective(pipe_hd.components.unet_garm, unet, pipe_hd.fusion, pipe_hd.components.scheduler_config)
    with torch.inference_mode():
        pred = objective.predict(model_in[:, :4], t.expand(2), model_in[:, 4:], garment_latents.expand(2, -1, -1, -1),
                                 garment.prompt.expand(2, -1, -1), torch.tensor([False, True]))
    objective.release()
    torch.testing.assert_close(pred, inference_pred, rtol=1e-4, atol=1e-5)
    assert (pred[0] - pred[1]).abs().max() > 1e-3  # the dropped garment is not a no-op


def test_draws_depend_on_seed_step_and_index_only() -> None:
    shape = (4, 8, 6)
    whole = draw(range(4), shape, 1000, 0.5, seed=7, step=3)
    halves = [draw(range(0, 2), shape, 1000, 0.5, seed=7, step=3), draw(range(2, 4), shape, 1000, 0.5, seed=7, step=3)]
    assert torch.equal(whole.noise, torch.cat([h.noise for h in halves]))
    assert torch.equal(whole.timesteps, torch.cat([h.timesteps for h in halves]))
    assert torch.equal(whole.drop, torch.cat([h.drop for h in halves]))
    other = draw(range(4), shape, 1000, 0.5, seed=7, step=4)
    assert not torch.equal(whole.noise, other.noise)
    many = draw(range(400), (1, 1, 1), 1000, 0.1, seed=0, step=0)
    assert 0.03 < many.drop.float().mean() < 0.2  # about the outfitting dropout rate
