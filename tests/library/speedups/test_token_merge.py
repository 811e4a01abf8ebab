"""Token merging (ootd/speedups/token_merge.py): merge/unmerge against a reference matching written here, the finest
attention level chosen, ratio 0 exact, and the pipeline's images changed (shapes kept) with the other modes."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from ootd.errors import UsageError
from ootd.method.fusion import TryOnFusion, capture_block_inputs
from ootd.settings import Category, SamplingSettings, parse_resolution
from ootd.speedups.modes import FeatureCache, SpeedModes, TokenMerge
from ootd.speedups.token_merge import level_grid, merge_tokens, token_merging
from tests.helpers.small_unets import three_level_unet


def _reference_groups(x: torch.Tensor, height: int, width: int, removed: int) -> list[list[int]]:
    """ToMe-SD's bipartite matching, one item, spelled out: destinations are the top-left token of each whole
    2x2 cell, every other token is a source; the `removed` sources most cosine-similar to their best destination
    join it. Returns the groups of token indices that end up as one token."""
    dst = [r * width + c for r in range(0, height - height % 2, 2) for c in range(0, width - width % 2, 2)]
    src = [i for i in range(height * width) if i not in dst]
    unit = x / x.norm(dim=-1, keepdim=True)
    best = []  # (similarity, source, destination)
    for s in src:
        sims = [float(unit[s] @ unit[d]) for d in dst]
        j = max(range(len(dst)), key=sims.__getitem__)
        best.append((sims[j], s, dst[j]))
    merged = sorted(best, reverse=True)[:removed]
    groups = {d: [d] for d in dst}
    for _, s, d in merged:
        groups[d].append(s)
    kept = [[s] for s in src if s not in {m[1] for m in merged}]
    return list(groups.values()) + kept


def _reference_round_trip(x: torch.Tensor, groups: list[list[int]]) -> torch.Tensor:
    """Every token replaced by the mean of its group: what unmerge(merge(x)) must give."""
    out = torch.empty_like(x)
    for group in groups:
        out[group] = x[group].mean(dim=0)
    return out


def test_hand_made_tokens_merge_into_the_destination_they_resemble() -> None:
    # a 2x4 grid: destinations 0 and 2 (top-left of the two 2x2 cells); token 1 resembles 0, token 6 resembles 2
    x = torch.tensor([[1.0, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0.2, 0.1, 1],
                      [0.1, 0.3, 1], [0.3, 0.2, 1], [0.05, 1, 0], [0.2, 0.3, 1]])[None]
    merged, unmerge = merge_tokens(x, (2, 4), 0.25)  # removes 2 of 8 tokens
    assert merged.shape == (1, 6, 3)
    expected = x[0].clone()
    expected[[0, 1]] = (x[0, 0] + x[0, 1]) / 2
    expected[[2, 6]] = (x[0, 2] + x[0, 6]) / 2
    assert torch.allclose(unmerge(merged)[0], expected, atol=1e-6)
    # the merged tokens are the two means and the four untouched tokens
    rows = {tuple(round(v, 5) for v in row.tolist()) for row in merged[0]}
    assert rows == {tuple(round(v, 5) for v in row.tolist()) for row in expected[[0, 2, 3, 4, 5, 7]]}


@pytest.mark.parametrize(("grid", "ratio"), [((6, 8), 0.5), ((5, 7), 0.3), ((4, 4), 0.75)])
def test_merge_and_unmerge_against_the_reference_matching(grid: tuple[int, int], ratio: float) -> None:
    torch.manual_seed(0)
    height, width = grid
    x = torch.randn(3, height * width, 4)
    removed = int(height * width * ratio)
    merged, unmerge = merge_tokens(x, grid, ratio)
    assert merged.shape == (3, height * width - removed, 4)
    back = unmerge(merged)
    for item in range(3):  # each batch item matched on its own
        expected = _reference_round_trip(x[item], _reference_groups(x[item], height, width, removed))
        assert torch.allclose(back[item], expected, atol=1e-6)
    # the token mean is preserved: each group's mean is copied to all of its members
    assert torch.allclose(back.mean(dim=1), x.mean(dim=1), atol=1e-6)
    # unmerge spreads any per-token output (another channel count: after the projections)
    wide = torch.randn(3, merged.shape[1], 7)
    assert unmerge(wide).shape == (3, height * width, 7)
    again, _ = merge_tokens(x, grid, ratio)
    assert torch.equal(again, merged)  # deterministic


def test_ratio_0_merges_nothing() -> None:
    x = torch.randn(2, 48, 5)
    merged, unmerge = merge_tokens(x, (6, 8), 0.0)
    assert torch.equal(merged, x) and torch.equal(unmerge(merged), x)


def test_level_grid_rounds_up_like_the_strided_convolutions() -> None:
    assert level_grid((64, 48), 1) == (64, 48)
    assert level_grid((64, 48), 2) == (32, 24)
    assert level_grid((13, 9), 4) == (4, 3)
    with pytest.raises(RuntimeError, match="do not form"):
        merge_tokens(torch.randn(1, 10, 2), (3, 3), 0.5)


def test_only_the_finest_level_is_merged_and_garment_tokens_stay_whole() -> None:
    vton, garm = three_level_unet(0), three_level_unet(1)
    prompt = torch.randn(2, 5, 24)
    with torch.no_grad(), capture_block_inputs(garm) as features:
        garm(torch.randn(2, 8, 16, 16), 0, encoder_hidden_states=prompt)
    seen: list[tuple[int, int]] = []

    def spy(q, k, v, scale):  # noqa: ANN001, ANN202
        seen.append((q.shape[2], k.shape[2]))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)

    fusion = TryOnFusion(vton, spy)
    x, index = torch.randn(2, 8, 16, 16), torch.tensor([0, 1])
    with torch.no_grad(), fusion.garment(dict(features), index):
        exact = vton(x, 10, encoder_hidden_states=prompt, return_dict=False)[0]
        with token_merging(fusion, TokenMerge(0.5), (16, 16)) as names:
            assert sorted(n.split(".")[0] + n.split(".")[1] for n in names) == ["down_blocks0", "up_blocks2",
                                                                                "up_blocks2"]
            seen.clear()
            merged = vton(x, 10, encoder_hidden_states=prompt, return_dict=False)[0]
        # level 0: 256 person tokens -> 128 queries, keys 128 person + 256 garment; level 1 (8x8), mid (4x4) whole
        assert sorted(set(seen)) == [(16, 32), (64, 128), (128, 384)]
        with token_merging(fusion, TokenMerge(0.5), (16, 16), max_downsample=2) as names:
            assert len(names) == 6  # the mid block (4x4) is not at those levels
            seen.clear()
            vton(x, 10, encoder_hidden_states=prompt, return_dict=False)
        assert sorted(set(seen)) == [(16, 32), (32, 96), (128, 384)]
        after = vton(x, 10, encoder_hidden_states=prompt, return_dict=False)[0]
    assert merged.shape == exact.shape and not torch.allclose(merged, exact, atol=1e-4)
    assert torch.equal(after, exact) and all(p.merge is None for p in fusion.processors.values())


def test_invalid_ratios_are_usage_errors(pipe_hd, example_images) -> None:  # noqa: ANN001
    for bad in (-0.1, 0.8, math.nan):
        with pytest.raises(UsageError, match="token merge ratio must be between 0 .exact. and 0.75"):
            TokenMerge(bad)
        with pytest.raises(UsageError, match="token merge ratio"):
            pipe_hd(example_images["person"], example_images["tshirt"], "upper", steps=1, token_merge=bad)
    assert TokenMerge(0.75).ratio == 0.75 and TokenMerge(0).ratio == 0.0


# -- the pipeline on the tiny tree (attention at its second level only: 24x32 tokens at 384x512) -----------


def _prepared(pipe, example_images):  # noqa: ANN001, ANN202
    person = pipe.prepare_person(example_images["person"], Category.UPPER, mask=example_images["mask"],
                                 resolution=parse_resolution("384x512"))
    garment = pipe.prepare_garment(example_images["tshirt"], Category.UPPER, resolution=parse_resolution("384x512"))
    return person, garment


def _arrays(result) -> list[np.ndarray]:  # noqa: ANN001
    return [np.asarray(im) for im in result.images]


def _no_merge_left(pipe) -> bool:  # noqa: ANN001
    return all(p.merge is None for p in pipe.fusion.processors.values())


def test_ratio_0_is_the_exact_path_and_nothing_is_left_installed(pipe_hd, example_images) -> None:  # noqa: ANN001
    words = {"mask": example_images["mask"], "steps": 2, "seed": 5, "resolution": (384, 512)}
    plain = pipe_hd(example_images["person"], example_images["tshirt"], "upper", **words)
    zero = pipe_hd(example_images["person"], example_images["tshirt"], "upper", token_merge=0.0, **words)
    assert all(np.array_equal(a, b) for a, b in zip(_arrays(plain), _arrays(zero), strict=True))
    assert zero.modes.token_merge.ratio == 0.0 and _no_merge_left(pipe_hd)

    class Stop(Exception):
        pass

    installed: list[int] = []

    def stop(step, t, latents):  # noqa: ANN001, ANN202
        installed.append(sum(p.merge is not None for p in pipe_hd.fusion.processors.values()))
        raise Stop

    with pytest.raises(Stop):
        pipe_hd(example_images["person"], example_images["tshirt"], "upper", token_merge=0.5, callback=stop, **words)
    assert installed == [len(pipe_hd.fusion.processors)] and _no_merge_left(pipe_hd)  # all at the second level


@pytest.mark.parametrize(("samples", "scale", "interval"), [(1, 2.0, 1), (4, 2.0, 1), (1, 0.5, 1), (4, 0.5, 2),
                                                            (1, 2.0, 2)])
def test_merging_changes_the_images_and_keeps_their_shapes(pipe_hd, example_images, samples: int, scale: float,  # noqa: ANN001
                                                           interval: int) -> None:
    person, garment = _prepared(pipe_hd, example_images)
    settings = SamplingSettings.from_words(num_samples=samples, guidance_scale=scale, steps=3, seed=3,
                                           resolution=(384, 512))
    cached = SpeedModes(feature_cache=FeatureCache(interval))
    exact = pipe_hd.generate(person, garment, settings, modes=cached)
    merged = pipe_hd.generate(person, garment, settings, modes=replace(cached, token_merge=TokenMerge(0.5)))
    again = pipe_hd.generate(person, garment, settings, modes=replace(cached, token_merge=TokenMerge(0.5)))
    assert len(merged.images) == samples and merged.modes.token_merge.ratio == 0.5
    assert [im.size for im in merged.images] == [im.size for im in exact.images]
    assert all(not np.array_equal(a, b) for a, b in zip(_arrays(exact), _arrays(merged), strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(_arrays(merged), _arrays(again), strict=True))  # same seed
    assert _no_merge_left(pipe_hd)


def test_merging_with_the_guidance_batch_split_gives_the_same_latents(pipe_hd, example_images,  # noqa: ANN001
                                                                       monkeypatch) -> None:
    seen: list[torch.Tensor] = []
    decode = pipe_hd._decode
    monkeypatch.setattr(pipe_hd, "_decode", lambda lat, prog: (seen.append(lat.clone()), decode(lat, prog))[1])
    words = {"mask": example_images["mask"], "num_samples": 2, "steps": 2, "seed": 21, "resolution": (384, 512),
             "token_merge": 0.75}
    pipe_hd(example_images["person"], example_images["tshirt"], "upper", **words)
    assert not pipe_hd.plan.guidance_split
    make_plan = pipe_hd.residency.make_plan  # the plan's guidance split alone: the guidance batch runs in two halves
    monkeypatch.setattr(pipe_hd.residency, "make_plan",
                        lambda *a, **k: dataclasses.replace(make_plan(*a, **k), guidance_split=True))
    pipe_hd(example_images["person"], example_images["tshirt"], "upper", **words)
    assert pipe_hd.plan.guidance_split
    whole, split = seen
    assert (whole - split).abs().max().item() < 1e-5 * max(1.0, whole.abs().max().item())
