"""Memory planner: estimates, plans over fake devices, monotonicity, OOM re-planning, VAE switches."""

from __future__ import annotations

import json

import pytest
import torch

from ootd.hardware.device import DeviceInfo
from ootd.hardware.units import size_text
from ootd.memory.estimate import (
    GIB,
    GPU_OVERHEAD,
    MIB,
    OFFLOAD_LEVELS,
    STAGES,
    PlanRequest,
    attention_workspace,
    estimate,
)
from ootd.memory.planner import apply_plan_to_vae, make_plan, memory_budget
from ootd.memory.sizes import RELEASED_SIZES, ModelSizes
from ootd.memory.trace import trace_activations
from ootd.weights.released import RELEASED_UNET_CONFIG, RELEASED_VAE_CONFIG


def gpu(gib: int, **kw) -> DeviceInfo:
    return DeviceInfo(type="cuda", index=0, vendor="nvidia", arch="sm_89", name=f"{gib} GiB GPU",
                      total_memory=gib * GIB, free_memory=gib * GIB, **kw)


DEVICES = {
    "gpu8": gpu(8), "gpu12": gpu(12), "gpu24": gpu(24), "gpu48": gpu(48),
    "unified128": DeviceInfo(type="cuda", index=0, vendor="amd", arch="gfx1151", name="APU", total_memory=128 * GIB,
                             free_memory=120 * GIB, unified_memory=True),
    "cpu": DeviceInfo(type="cpu", total_memory=24 * GIB, free_memory=22 * GIB),
}
RESOLUTIONS = [(384, 512), (768, 1024)]


def _plan(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - make_plan of a request given as its fields
    return make_plan(PlanRequest(*args, **kwargs))


def dtype_for(device: DeviceInfo) -> torch.dtype:
    return torch.float32 if device.type == "cpu" else torch.float16


def savings(plan) -> tuple[int, int, int, int]:  # noqa: ANN001
    return (int(plan.guidance_split), int(plan.vae_slicing), int(plan.vae_tiling), OFFLOAD_LEVELS.index(plan.offload))


@pytest.mark.parametrize("device_name", list(DEVICES))
@pytest.mark.parametrize("resolution", RESOLUTIONS)
@pytest.mark.parametrize("samples", [1, 4])
@pytest.mark.parametrize("attention", ["sdpa", "chunked"])
def test_plans_fit_their_budget(device_name: str, resolution: tuple[int, int], samples: int, attention: str) -> None:
    device = DEVICES[device_name]
    plan = _plan(device, resolution, samples, True, dtype_for(device), attention, RELEASED_SIZES)
    assert plan.budget_bytes == memory_budget(device)
    if plan.fits:
        assert plan.estimate["peak"] <= plan.budget_bytes
        assert all(plan.estimate[s] <= plan.budget_bytes for s in STAGES)
    else:  # the last resort: everything on
        assert plan.vae_slicing and plan.vae_tiling and plan.guidance_split
        assert plan.offload == ("none" if device.type == "cpu" else "sequential")
    assert plan.vae_encode_batched is not plan.vae_slicing
    if device.type == "cpu":
        assert plan.offload == "none"  # offloading from the CPU to the CPU saves nothing
    # the plan's estimate is the estimator's own number for these settings
    again = estimate(PlanRequest(device, resolution, samples, True, dtype_for(device), attention, RELEASED_SIZES),
                     attention_budget_bytes=plan.attention_budget_bytes, guidance_split=plan.guidance_split,
                     vae_slicing=plan.vae_slicing, vae_tiling=plan.vae_tiling, offload=plan.offload)
    assert again == plan.estimate


def test_big_devices_need_no_savings() -> None:
    for name in ("gpu24", "gpu48", "unified128", "cpu"):
        for resolution in RESOLUTIONS:
            plan = _plan(DEVICES[name], resolution, 4, True, dtype_for(DEVICES[name]), "sdpa", RELEASED_SIZES)
            expected = (0, 0, 0, 0)
            if name == "cpu" and resolution == (768, 1024):
                expected = (0, 1, 0, 0)  # fp32: decoding 4 images at once would not fit in 22 GiB with the weights
            assert plan.fits and savings(plan) == expected, (name, resolution)


def test_full_resolution_four_samples_fp16_fits_on_8_gib() -> None:
    plan = _plan(DEVICES["gpu8"], (768, 1024), 4, True, torch.float16, "sdpa", RELEASED_SIZES)
    assert plan.fits
    assert plan.estimate["peak"] <= 8 * GIB
    assert plan.offload == "none"  # fp16 weights (4.2 GiB) stay resident


@pytest.mark.parametrize("attention", ["sdpa", "chunked", "flash"])
@pytest.mark.parametrize("resolution", RESOLUTIONS)
@pytest.mark.parametrize("samples", [1, 4])
def test_smaller_budget_never_gives_a_larger_plan(attention: str, resolution: tuple[int, int], samples: int) -> None:
    device = DEVICES["gpu24"]
    previous = None
    for mib in range(24 * 1024, 256, -128):
        plan = _plan(device, resolution, samples, True, torch.float16, attention, RELEASED_SIZES,
                         max_memory=mib * MIB)
        if previous is not None:
            assert all(now >= before for now, before in zip(savings(plan), savings(previous), strict=True)), mib
            assert plan.attention_budget_bytes <= previous.attention_budget_bytes
            assert plan.fits <= previous.fits  # once it does not fit, a smaller budget does not either
        previous = plan
    assert previous is not None and not previous.fits  # 256 MiB cannot hold the model


def test_savings_come_on_in_order() -> None:
    """Offloading only after guidance split and VAE slicing/tiling are all on."""
    seen = set()
    for mib in range(12 * 1024, 512, -64):
        plan = _plan(DEVICES["gpu12"], (768, 1024), 4, True, torch.float16, "sdpa", RELEASED_SIZES,
                         max_memory=mib * MIB)
        if plan.offload != "none":
            assert plan.guidance_split and plan.vae_slicing and plan.vae_tiling
        seen.add(savings(plan))
    assert (1, 1, 1, 2) in seen and (0, 0, 0, 0) in seen


def test_halved_halves_the_budget() -> None:
    plan = _plan(DEVICES["gpu12"], (768, 1024), 4, True, torch.float16, "chunked", RELEASED_SIZES)
    half = plan.halved()
    assert half.budget_bytes == plan.budget_bytes // 2
    assert all(h >= p for h, p in zip(savings(half), savings(plan), strict=True))
    assert half.attention_budget_bytes <= plan.attention_budget_bytes
    assert half.halved().budget_bytes == plan.budget_bytes // 4


def test_plans_hash_and_compare_by_their_choices() -> None:
    plan = _plan(DEVICES["gpu12"], (768, 1024), 4, True, torch.float16, "chunked", RELEASED_SIZES)
    same = _plan(DEVICES["gpu12"], (768, 1024), 4, True, torch.float16, "chunked", RELEASED_SIZES)
    half = plan.halved()
    assert plan == same and hash(plan) == hash(same)
    assert plan != half
    assert len({plan, same, half}) == 2  # usable as dict keys / in sets, e.g. to cache per plan


def test_unknown_memory_plans_without_savings() -> None:
    mps = DeviceInfo(type="mps", vendor="apple", arch="mps", name="Apple MPS", unified_memory=True)
    plan = _plan(mps, (768, 1024), 4, True, torch.float16, "sdpa", RELEASED_SIZES)
    assert plan.fits and savings(plan) == (0, 0, 0, 0) and plan.budget_bytes == 0
    assert plan.halved().budget_bytes == plan.estimate["peak"] // 2


def test_no_guidance_never_splits() -> None:
    plan = _plan(DEVICES["gpu8"], (768, 1024), 4, False, torch.float16, "sdpa", RELEASED_SIZES,
                     max_memory=1 * GIB)
    assert not plan.guidance_split


def test_without_guidance_the_garment_pass_counts_the_garment_alone() -> None:
    """The garment UNet runs on [garment, zeros] with guidance and on [garment] alone without
    (TryOnPipeline.garment_features): the garment stage counts one item's activations and attention workspace
    fewer, and the features held through the loop are half."""
    def stages(guidance: bool) -> dict[str, int]:
        return estimate(PlanRequest(DEVICES["gpu24"], (768, 1024), 1, guidance, torch.float16, "sdpa",
                                    RELEASED_SIZES))

    on, off = stages(True), stages(False)
    sizes = RELEASED_SIZES
    tokens = (768 // sizes.vae_factor) * (1024 // sizes.vae_factor)
    attn_tokens = int(tokens * sizes.attn_token_scale)
    one_item = (tokens * sizes.garm_activation * 2
                + attention_workspace("sdpa", 1, sizes.attn_heads, attn_tokens, attn_tokens, torch.float16, GIB))
    assert on["garment_unet"] - off["garment_unet"] == pytest.approx(GPU_OVERHEAD * one_item, abs=8)
    assert on["garment_features"] == pytest.approx(2 * off["garment_features"], abs=2)


def test_estimate_behaves() -> None:
    def peak(**kw) -> dict[str, int]:  # noqa: ANN003
        args = {"resolution": (768, 1024), "num_samples": 4, "guidance": True, "dtype": torch.float16,
                "attention": "sdpa", "sizes": RELEASED_SIZES}
        savings = {k: kw.pop(k) for k in list(kw) if k not in args}
        args.update(kw)
        return estimate(PlanRequest(DEVICES["gpu24"], **args), **savings)

    base = peak()
    assert peak(num_samples=1)["denoise"] < base["denoise"]
    assert peak(resolution=(384, 512))["peak"] < base["peak"]
    assert peak(guidance_split=True)["denoise"] < base["denoise"]
    assert peak(vae_slicing=True)["decode"] < base["decode"]
    assert peak(vae_slicing=True, vae_tiling=True)["decode"] < peak(vae_slicing=True)["decode"]
    # tiling changes nothing at or below the VAE's 512-pixel tile
    small = {"resolution": (384, 512), "vae_slicing": True}
    assert peak(**small, vae_tiling=True)["decode"] == peak(**small)["decode"]
    assert peak(offload="model")["peak"] < base["peak"]
    assert peak(offload="sequential")["peak"] < peak(offload="model")["peak"]
    assert peak(dtype=torch.float32)["peak"] > base["peak"]
    # fp16 weights of the released models: ~4.2 GiB
    assert 4.0 * GIB < base["weights_total"] < 4.4 * GIB
    # the original's full 2N x 2N attention in math at 4 samples: the reported out-of-memory on 48 GB
    full = attention_workspace("math", 8, 8, 2 * 12288, 2 * 12288, torch.float16, 0)
    assert full > 48 * GIB
    # chunked stays within its budget, fused kernels need next to nothing
    assert attention_workspace("chunked", 8, 8, 12288, 24576, torch.float16, 512 * MIB) == 512 * MIB
    assert attention_workspace("sdpa", 8, 8, 12288, 24576, torch.float16, 512 * MIB) < 16 * MIB
    assert peak(attention="math")["peak"] > 48 * GIB


def test_plan_to_dict_and_explain() -> None:
    plan = _plan(DEVICES["gpu8"], (768, 1024), 4, True, torch.float16, "chunked", RELEASED_SIZES)
    data = json.loads(json.dumps(plan.to_dict()))
    for key in ("budget_bytes", "attention_budget_bytes", "guidance_split", "vae_encode_batched", "vae_slicing",
                "vae_tiling", "offload", "estimate", "fits"):
        assert key in data
    assert data["request"]["resolution"] == [768, 1024]
    text = plan.explain()
    for word in (*STAGES, "peak", "offload", "guidance", "GiB", "fits"):
        assert word in text


def test_explain_shows_each_size_in_the_unit_that_shows_it() -> None:
    """A 10 MiB budget is `10.0 MiB`, not `0.01 GiB`; gigabytes keep two decimals."""
    assert [size_text(n) for n in (10 * MIB, int(4.2 * GIB), 512 * 1024, 0)] == \
        ["10.0 MiB", "4.20 GiB", "512.0 KiB", "0 B"]
    text = _plan(DEVICES["cpu"], (384, 512), 1, True, torch.float32, "sdpa", RELEASED_SIZES,
                 max_memory=10 * MIB).explain()
    assert "budget                    10.0 MiB  (--max-memory)" in text, text
    assert " 0.00 GiB" not in text and " 0.01 GiB" not in text, text
    assert "GiB of 10.0 MiB: DOES NOT FIT" in text, text


def test_apply_plan_to_vae_toggles_the_diffusers_flags() -> None:
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, norm_num_groups=4,
                        sample_size=32)
    tight = _plan(DEVICES["gpu8"], (768, 1024), 4, True, torch.float16, "sdpa", RELEASED_SIZES,
                      max_memory=int(5.5 * GIB))
    roomy = _plan(DEVICES["gpu48"], (768, 1024), 4, True, torch.float16, "sdpa", RELEASED_SIZES)
    assert tight.vae_slicing and tight.vae_tiling and not roomy.vae_slicing and not roomy.vae_tiling
    apply_plan_to_vae(vae, tight)
    assert vae.use_slicing and vae.use_tiling
    apply_plan_to_vae(vae, roomy)
    assert not vae.use_slicing and not vae.use_tiling


def test_from_components_counts_parameters_and_traces_unknown_architectures() -> None:
    from ootd.hardware.policy import Precision
    from ootd.tools.bench.random_weights import build_random_components

    fp32 = Precision(torch.float32, torch.float32, torch.float32, torch.float32)
    c = build_random_components("tiny", fp32)
    sizes = ModelSizes.from_components(c)
    assert sizes.unet_vton == sum(p.numel() for p in c.unet_vton.parameters())
    assert sizes.vae == sum(p.numel() for p in c.vae.parameters())
    assert sizes.attn_heads == 2 and sizes.vae_tile == 64
    # a tiny UNet has far smaller activations per token than SD1.5, and tracing found that
    assert 0 < sizes.unet_activation < RELEASED_SIZES.unet_activation
    assert sizes.garment_kv == pytest.approx(2 * sizes.garment_features)
    assert sizes.vae_encode_activation > 0 and sizes.vae_decode_activation > 0


@pytest.mark.slow
def test_released_constants_match_a_trace_of_the_released_architectures() -> None:
    """The constants follow the pipeline's fusion code: re-measure them if this fails."""
    traced = trace_activations(dict(RELEASED_UNET_CONFIG, in_channels=4), dict(RELEASED_UNET_CONFIG, in_channels=8),
                               RELEASED_VAE_CONFIG)
    for key, value in traced.items():
        assert getattr(RELEASED_SIZES, key) == pytest.approx(value, rel=0.01), key


def test_cpu_profile_encodes_one_image_at_a_time_and_the_estimate_follows() -> None:
    from ootd.hardware.profiles import load_profile

    cpu = DEVICES["cpu"]
    profile = load_profile(cpu)
    assert profile.vae_encode_batched is False  # measured faster on the CPU (docs/benchmarks.md)
    plan = _plan(cpu, (768, 1024), 1, True, torch.float32, "sdpa", RELEASED_SIZES, profile=profile)
    batched = _plan(cpu, (768, 1024), 1, True, torch.float32, "sdpa", RELEASED_SIZES)
    assert plan.fits and not plan.vae_slicing  # plenty of memory: not a saving, a speed choice
    assert not plan.vae_encode_batched and batched.vae_encode_batched
    assert plan.estimate["encode"] < batched.estimate["encode"]
    assert "one by one" in plan.explain()
    gpu_plan = _plan(DEVICES["gpu24"], (768, 1024), 1, True, torch.float16, "sdpa", RELEASED_SIZES,
                         profile=load_profile(DEVICES["gpu24"]))
    assert gpu_plan.vae_encode_batched
