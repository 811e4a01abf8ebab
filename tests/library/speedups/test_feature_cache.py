"""Feature caching across steps (ootd/speedups/feature_cache.py): exact at interval 1, a cached call reproduces the full
call on the same input, and the pipeline's images change (and keep their shapes) at intervals 2-3."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from diffusers import UNet2DConditionModel
from PIL import Image
from typer.testing import CliRunner

from ootd import cli
from ootd.errors import UsageError
from ootd.method.fusion import TryOnFusion, capture_block_inputs
from ootd.settings import Category, SamplingSettings, parse_resolution
from ootd.speedups.feature_cache import FeatureCacheHook, feature_cache
from ootd.speedups.modes import FeatureCache, SpeedModes
from tests.helpers.small_unets import three_level_unet


@pytest.fixture(scope="module")
def fused() -> tuple[UNet2DConditionModel, dict]:
    vton, garm = three_level_unet(0), three_level_unet(1)
    prompt = torch.randn(2, 5, 24)
    with torch.no_grad(), capture_block_inputs(garm) as features:
        garm(torch.randn(2, 8, 16, 16), 0, encoder_hidden_states=prompt)
    fusion = TryOnFusion(vton)
    return vton, {"fusion": fusion, "features": dict(features), "prompt": prompt}


def _call(unet: UNet2DConditionModel, x: torch.Tensor, t: int, prompt: torch.Tensor) -> torch.Tensor:
    return unet(x, t, encoder_hidden_states=prompt, return_dict=False)[0]


def _counting(module: torch.nn.Module) -> list[int]:
    """Calls of a module inside `module` (a stubbed block never reaches its own sub-modules)."""
    seen: list[int] = []
    module.register_forward_hook(lambda *_: seen.append(1))
    return seen


def test_a_cached_call_on_the_same_input_equals_the_full_call(fused) -> None:  # noqa: ANN001
    unet, ctx = fused
    x, prompt, index = torch.randn(2, 8, 16, 16), ctx["prompt"], torch.tensor([0, 1])
    mid = _counting(unet.mid_block.resnets[0])
    shallow = _counting(unet.down_blocks[0].resnets[0])
    with torch.no_grad(), ctx["fusion"].garment(ctx["features"], index):
        full = _call(unet, x, 10, prompt)
        other_t = _call(unet, x, 500, prompt)
        with FeatureCacheHook(unet, 2).installed() as cache:
            refreshed = _call(unet, x, 10, prompt)  # step 0: refresh, keeps the deep feature
            cache.on_step(0, torch.tensor(10), x)
            cached = _call(unet, x, 10, prompt)  # step 1: shallow path only, same input
            cache.on_step(1, torch.tensor(10), x)
            assert cache.cached_calls == 1 and len(mid) == 3 and len(shallow) == 4  # deep levels skipped once
            cached_other_t = (cache.on_step(2, torch.tensor(10), x), _call(unet, x, 500, prompt))[1]
        after = _call(unet, x, 10, prompt)
    assert torch.equal(refreshed, full) and torch.equal(after, full)
    assert torch.allclose(cached, full, rtol=0, atol=1e-6), (cached - full).abs().max()
    # step 3 is a cached step at another timestep: the deep levels still carry t=10's work (the control)
    assert cache.cached_calls == 2 and not torch.allclose(cached_other_t, other_t, atol=1e-4)
    assert cached_other_t.shape == other_t.shape
    assert "forward" not in unet.mid_block.__dict__  # nothing left behind


def test_interval_rules() -> None:
    with pytest.raises(UsageError, match="cache interval"):
        FeatureCache(0)
    with pytest.raises(UsageError, match="cache interval"):
        FeatureCache(FeatureCache.MAX + 1)
    with feature_cache(three_level_unet(0), FeatureCache(1)) as cache:
        assert cache is None  # interval 1 installs nothing: today's path


def _prepared(pipe, example_images, **words):  # noqa: ANN001, ANN202
    person = pipe.prepare_person(example_images["person"], Category.UPPER, mask=example_images["mask"],
                                 resolution=parse_resolution("384x512"))
    garment = pipe.prepare_garment(example_images["tshirt"], Category.UPPER, resolution=parse_resolution("384x512"))
    return person, garment, SamplingSettings.from_words(steps=4, seed=3, resolution=(384, 512), **words)


def caching(interval: int) -> SpeedModes:
    return SpeedModes(feature_cache=FeatureCache(interval))


def _arrays(result) -> list[np.ndarray]:  # noqa: ANN001
    return [np.asarray(im) for im in result.images]


def test_interval_1_is_the_exact_path_even_with_the_hooks_installed(pipe_hd, example_images) -> None:  # noqa: ANN001
    person, garment, settings = _prepared(pipe_hd, example_images, num_samples=1)
    plain = _arrays(pipe_hd.generate(person, garment, settings))
    one = pipe_hd.generate(person, garment, settings, modes=caching(1))
    assert all(np.array_equal(a, b) for a, b in zip(plain, _arrays(one), strict=True))
    with FeatureCacheHook(pipe_hd.components.unet_vton, 1).installed() as cache:
        hooked = pipe_hd.generate(person, garment, settings, callback=cache.on_step)
    assert cache.cached_calls == 0
    assert all(np.array_equal(a, b) for a, b in zip(plain, _arrays(hooked), strict=True))
    assert one.modes.feature_cache.interval == 1


def _words(settings) -> dict:  # noqa: ANN001
    return {"num_samples": settings.num_samples, "steps": settings.steps, "guidance_scale": settings.guidance_scale,
            "seed": settings.seed, "resolution": settings.resolution}


@pytest.mark.parametrize(("samples", "scale", "interval"), [(1, 2.0, 2), (4, 2.0, 3), (1, 0.0, 3), (4, 0.0, 2)])
def test_caching_changes_the_images_and_keeps_their_shapes(pipe_hd, example_images, samples: int, scale: float,  # noqa: ANN001
                                                           interval: int) -> None:
    person, garment, settings = _prepared(pipe_hd, example_images, num_samples=samples, guidance_scale=scale)
    exact = pipe_hd.generate(person, garment, settings)
    cached = pipe_hd.generate(person, garment, settings, modes=caching(interval))
    assert len(cached.images) == samples and cached.modes.feature_cache.interval == interval
    assert [im.size for im in cached.images] == [im.size for im in exact.images]
    assert all(not np.array_equal(a, b) for a, b in zip(_arrays(exact), _arrays(cached), strict=True))


def test_caching_with_guidance_in_two_halves(pipe_hd, example_images, monkeypatch) -> None:  # noqa: ANN001
    import contextlib

    import ootd.pipeline

    caches: list = []

    @contextlib.contextmanager
    def spied(unet, caching):  # noqa: ANN001, ANN202
        with feature_cache(unet, caching) as cache:
            caches.append(cache)
            yield cache

    monkeypatch.setattr(ootd.pipeline, "feature_cache", spied)
    # nothing fits: guidance in two halves (and VAE tiling)
    monkeypatch.setattr(pipe_hd.residency, "max_memory", 1 << 20)
    person, garment, settings = _prepared(pipe_hd, example_images, num_samples=2)
    halves = pipe_hd.generate(person, garment, settings, modes=caching(2))
    assert pipe_hd.plan.guidance_split
    assert caches[-1].cached_calls == 2 * 2  # steps 1 and 3 reuse the feature, two UNet calls each
    exact_halves = pipe_hd.generate(person, garment, settings)
    assert [im.size for im in halves.images] == [im.size for im in exact_halves.images]
    assert all(not np.array_equal(a, b) for a, b in zip(_arrays(halves), _arrays(exact_halves), strict=True))


def test_two_calls_per_step_reuse_their_own_features(fused) -> None:  # noqa: ANN001
    """Guidance in two halves calls the UNet twice per step: each call reuses the feature of its own half."""
    unet, ctx = fused
    x, prompt, index = torch.randn(2, 8, 16, 16), ctx["prompt"], torch.tensor([0, 1])
    fusion = ctx["fusion"]
    with torch.no_grad(), fusion.garment(ctx["features"], index):
        def halves() -> list[torch.Tensor]:
            out = []
            for part, rows in zip(x.chunk(2), index.chunk(2), strict=True):
                with fusion.rows(rows):
                    out.append(_call(unet, part, 10, prompt[:1]))
            return out

        full = halves()
        with FeatureCacheHook(unet, 3).installed() as cache:
            halves()
            cache.on_step(0, torch.tensor(10), x)
            cached = halves()
    assert cache.cached_calls == 2 and not torch.allclose(full[0], full[1], atol=1e-3)
    for a, b in zip(cached, full, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)


def test_cli_records_the_interval_and_refuses_bad_ones(tiny_tree, example_images, tmp_path) -> None:  # noqa: ANN001
    args = ["run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper", "--mask",
            example_images["mask"],
            "--checkpoints", tiny_tree, "--steps", "2", "--resolution", "384x512", "--seed", "5", "--device", "cpu",
            "-o", tmp_path, "--json"]
    out = CliRunner().invoke(cli.app, [str(a) for a in [*args, "--cache-interval", "2"]])
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["settings"]["cache_interval"] == 2  # JSON numbers are numbers
    with Image.open(report["outputs"][0]) as im:
        assert im.info["cache_interval"] == "2"
    bad = CliRunner().invoke(cli.app, [str(a) for a in [*args, "--cache-interval", "0"]])
    assert bad.exit_code == 2 and bad.stderr.strip().count("\n") == 0 and "--cache-interval" in bad.stderr


def test_outputs_from_before_the_setting_count_as_exact() -> None:
    from ootd.app.tryon.provenance import differences as _differences

    old = {"software": "ootd 0.9", "steps": "4"}  # written before cache_interval was recorded
    assert _differences(old, {"steps": "4", "cache_interval": "1"}) is None
    assert _differences(old, {"steps": "4", "cache_interval": "3"}) == "cache_interval 1 (now 3)"
