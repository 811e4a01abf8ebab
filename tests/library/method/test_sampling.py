"""The denoising loop as a function (ootd/method/sampling.py) and the pipeline's per-step callback."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler

from ootd import errors
from ootd.method.sampling import Inpaint, sample
from ootd.method.schedulers import build_scheduler, set_timesteps
from ootd.settings import Category, SamplingSettings, parse_resolution


def _scheduler(steps: int = 4) -> DDIMScheduler:
    sched = DDIMScheduler(num_train_timesteps=1000, beta_schedule="scaled_linear", beta_start=0.00085,
                          beta_end=0.012, clip_sample=False, set_alpha_to_one=False)
    set_timesteps(sched, steps)
    return sched


def _model(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return 0.1 * x + float(t) / 1000.0


def test_sample_is_the_plain_scheduler_loop() -> None:
    latents = torch.randn(2, 4, 8, 6, generator=torch.Generator().manual_seed(0))
    reference, sched = latents.clone(), _scheduler()
    for t in sched.timesteps:  # written out here, independently of ootd.method.sampling
        reference = sched.step(_model(reference, t), t, reference).prev_sample
    assert torch.equal(sample(_model, _scheduler(), latents), reference)


def test_inpaint_keeps_the_unmasked_region_and_ends_on_the_original() -> None:
    gen = torch.Generator().manual_seed(1)
    latents, original, noise = (torch.randn(1, 4, 8, 6, generator=gen) for _ in range(3))
    mask = torch.zeros(1, 1, 8, 6)
    mask[..., :4, :] = 1.0
    sched = _scheduler(3)
    seen: list[torch.Tensor] = []
    out = sample(_model, sched, latents, inpaint=Inpaint(original, noise, mask),
                 callback=lambda i, t, x: seen.append(x.clone()))
    # after step 0 the kept region is the original noised to the next timestep
    expected = sched.add_noise(original, noise, sched.timesteps[1:2])
    assert torch.equal(seen[0][..., 4:, :], expected[..., 4:, :])
    assert torch.equal(out[..., 4:, :], original[..., 4:, :])  # clean after the last step
    assert not torch.equal(out[..., :4, :], original[..., :4, :])


def test_callback_sees_every_step_and_may_replace_latents() -> None:
    latents = torch.randn(1, 4, 8, 6, generator=torch.Generator().manual_seed(2))
    calls: list[tuple[int, float]] = []
    sample(_model, _scheduler(), latents, callback=lambda i, t, x: calls.append((i, float(t))))
    assert calls == [(i, float(t)) for i, t in enumerate(_scheduler().timesteps)]
    zeroed = sample(_model, _scheduler(), latents, callback=lambda i, t, x: torch.zeros_like(x) if i == 3 else None)
    assert torch.equal(zeroed, torch.zeros_like(latents))  # the last step's replacement is the result
    inputs: list[torch.Tensor] = []

    def model(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        inputs.append(x.clone())
        return _model(x, t)

    sample(model, _scheduler(), latents, callback=lambda i, t, x: torch.full_like(x, 3.0) if i == 0 else None)
    assert torch.equal(inputs[1], torch.full_like(latents, 3.0))  # the next step starts from the replacement


def _prepared(pipe, example_images):  # noqa: ANN001, ANN202
    person = pipe.prepare_person(example_images["person"], Category.UPPER, mask=example_images["mask"],
                                 resolution=parse_resolution("384x512"))
    garment = pipe.prepare_garment(example_images["tshirt"], Category.UPPER, resolution=parse_resolution("384x512"))
    return person, garment, SamplingSettings.from_words(num_samples=1, steps=3, seed=11, resolution=(384, 512))


def test_pipeline_callback(pipe_hd, example_images) -> None:  # noqa: ANN001
    person, garment, settings = _prepared(pipe_hd, example_images)
    plain = pipe_hd.generate(person, garment, settings)
    seen: list[tuple[int, float]] = []
    watched = pipe_hd.generate(person, garment, settings, callback=lambda i, t, x: seen.append((i, float(t))))
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(plain.images, watched.images, strict=True))
    sched = build_scheduler(settings.scheduler, pipe_hd.components.scheduler_config)
    set_timesteps(sched, settings.steps)
    assert seen == [(i, float(t)) for i, t in enumerate(sched.timesteps)]
    assert len(watched.timings.steps) == settings.steps
    edited = pipe_hd.generate(person, garment, settings, callback=lambda i, t, x: x + 1.0 if i == 1 else None)
    assert not np.array_equal(np.asarray(plain.images[0]), np.asarray(edited.images[0]))


def test_preprocess_errors_become_ootd_errors() -> None:
    from ootd.preprocessing import ootd_errors
    from preprocess import errors as preprocess_errors

    for name, code in (("NoPersonError", 1), ("CheckpointError", 1), ("DeviceError", 1), ("UsageError", 2)):
        with pytest.raises(getattr(errors, name), match="the message") as caught:
            with ootd_errors():
                raise getattr(preprocess_errors, name)("the message")
        assert caught.value.exit_code == code
