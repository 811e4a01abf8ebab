"""Speed options (channels_last, torch.compile, the garment UNet's early stop): applied, and exact."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ootd.errors import DeviceError
from ootd.hardware.device import DeviceInfo
from ootd.hardware.policy import SpeedOptions, choose_speed, keep_freed_memory, malloc_heap_bytes
from ootd.hardware.profiles import load_profile
from ootd.method.fusion import capture_block_inputs, transformer_blocks
from ootd.models import Models
from ootd.pipeline import TryOnPipeline
from ootd.speedups.execution import (
    ChannelsLastGroupNorm,
    as_memory_format,
    compile_error,
    is_compile_failure,
    set_memory_format,
    temporary_memory_format,
    uncompiled,
)

CPU = DeviceInfo(type="cpu", total_memory=24 << 30, free_memory=20 << 30)
H200 = DeviceInfo(type="cuda", index=0, vendor="nvidia", arch="sm_90", name="H200", total_memory=141 << 30)


def _conv_weights_channels_last(module: torch.nn.Module) -> bool:
    convs = [m for m in module.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)]
    assert convs
    return all(c.weight.is_contiguous(memory_format=torch.channels_last) and not c.weight.is_contiguous()
               for c in convs)


# -- policy -------------------------------------------------------------------------------------------


def test_shipped_profiles_leave_both_options_off() -> None:
    assert choose_speed(CPU) == SpeedOptions(channels_last=False, compile=False)
    assert choose_speed(H200) == SpeedOptions(channels_last=False, compile=False)
    assert choose_speed(CPU, vae_dtype=torch.float32) == SpeedOptions()  # fp32: NCHW everywhere, as before


def test_the_cpu_profile_runs_a_bf16_vae_channels_last() -> None:
    """bf16 on the CPU: the VAE alone in NHWC (oneDNN's brgemm kernels); an explicit choice decides for it too;
    GPU profiles keep NCHW."""
    bf16 = choose_speed(CPU, vae_dtype=torch.bfloat16)
    assert bf16 == SpeedOptions(channels_last=False, compile=False, vae_channels_last=True)
    assert choose_speed(CPU, channels_last=False, vae_dtype=torch.bfloat16).vae_channels_last is False
    assert choose_speed(H200, vae_dtype=torch.bfloat16).vae_channels_last is False
    assert SpeedOptions(channels_last=True).vae_channels_last is True  # the UNets' layout takes the VAE along


def _group_norm_errors(x: torch.Tensor, groups: int = 32) -> dict[str, float]:
    """Max abs error against float64 of the stock kernel on NCHW and on NHWC input, and of ours on NHWC."""
    channels = x.shape[1]
    gen = torch.Generator().manual_seed(1)
    norm = torch.nn.GroupNorm(groups, channels).to(x.dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(channels, generator=gen))
        norm.bias.copy_(torch.randn(channels, generator=gen))
        ref = torch.nn.functional.group_norm(x.double(), groups, norm.weight.double(), norm.bias.double(), norm.eps)
        nhwc = x.contiguous(memory_format=torch.channels_last)
        ours = ChannelsLastGroupNorm(groups, channels).to(x.dtype)
        ours.load_state_dict(norm.state_dict())
        out = ours(nhwc)
        assert out.is_contiguous(memory_format=torch.channels_last) and out.dtype == x.dtype
        return {"nchw": (norm(x).double() - ref).abs().max().item(),
                "stock_nhwc": (norm(nhwc).double() - ref).abs().max().item(),
                "ours": (out.double() - ref).abs().max().item(),
                "ours_vs_nchw_steps": _bf16_steps(out, norm(x)) if x.dtype is torch.bfloat16 else None}


def _bf16_steps(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference between two bf16 tensors in bf16 steps at their largest magnitude."""
    step = 2.0 ** (math.floor(math.log2(max(a.abs().max().item(), b.abs().max().item()))) - 7)
    return (a.double() - b.double()).abs().max().item() / step


@pytest.mark.parametrize("offset", [0.0, 3.0, 30.0])
def test_channels_last_group_norm_keeps_the_nchw_precision_in_fp32(offset: float) -> None:
    """PyTorch's CPU GroupNorm for NHWC input sums x and x^2 in one float32 pass and loses the variance of
    groups whose mean is large against their spread; ours computes the statistics in two passes."""
    x = torch.randn(2, 64, 64, 48, generator=torch.Generator().manual_seed(0)) * 0.5 + offset
    err = _group_norm_errors(x)
    assert err["ours"] < max(1e-5, 10 * err["nchw"]), err
    if offset >= 30:  # the stock NHWC kernel's failure this replaces (pinned: a torch that fixes it shows here)
        assert err["stock_nhwc"] > 100 * err["ours"], err


@pytest.mark.parametrize("offset", [0.0, 3.0, 30.0])
def test_channels_last_group_norm_in_bf16_differs_only_by_bf16_rounding(offset: float) -> None:
    """In bf16 ours is as far from float64 as the NCHW kernel is, and at most one bf16 step from its output."""
    x = (torch.randn(2, 64, 96, 64, generator=torch.Generator().manual_seed(0)) * 0.5 + offset).bfloat16()
    err = _group_norm_errors(x)
    assert err["ours"] <= err["nchw"] * 1.01, err
    assert err["ours_vs_nchw_steps"] <= 1.0, err
    if offset >= 30:
        assert err["stock_nhwc"] > 4 * err["ours"], err


def test_group_norm_on_nchw_input_is_the_stock_kernel() -> None:
    """The default layout computes exactly what it did: NCHW and 3-D input go to the stock kernel."""
    norm = torch.nn.GroupNorm(4, 16)
    ours = ChannelsLastGroupNorm(4, 16)
    ours.load_state_dict(norm.state_dict())
    gen = torch.Generator().manual_seed(0)
    for x in (torch.randn(2, 16, 12, 10, generator=gen) + 5, torch.randn(2, 16, 30, generator=gen) + 5,
              torch.randn(2, 16, 1, 1, generator=gen)):
        with torch.no_grad():
            assert torch.equal(ours(x), norm(x))
    with torch.no_grad():  # a batch in NHWC: each image on its own
        x = (torch.randn(3, 16, 12, 10, generator=gen) + 5).contiguous(memory_format=torch.channels_last)
        assert torch.equal(ours(x), torch.cat([ours(x[i: i + 1]) for i in range(3)]))


def test_set_memory_format_gives_every_group_norm_the_precise_forward_and_takes_it_back() -> None:
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.GroupNorm(2, 8), torch.nn.SiLU(),
                              torch.nn.Sequential(torch.nn.GroupNorm(4, 8)))
    before = dict(net.state_dict())

    def norms() -> list[type]:
        return [type(m) for m in net.modules() if isinstance(m, torch.nn.GroupNorm)]

    set_memory_format([net], True)
    assert norms() == [ChannelsLastGroupNorm] * 2
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())
    with temporary_memory_format([net], False):  # the original formulation's layout: PyTorch's own kernels
        assert norms() == [torch.nn.GroupNorm] * 2
    assert norms() == [ChannelsLastGroupNorm] * 2
    set_memory_format([net], False)
    assert norms() == [torch.nn.GroupNorm] * 2


def test_user_choices_override_the_profile() -> None:
    assert choose_speed(CPU, channels_last=False).channels_last is False
    assert choose_speed(H200, channels_last=True, compile=True) == SpeedOptions(channels_last=True, compile=True)


def test_profile_speed_section_is_validated(tmp_path: Path) -> None:
    user = tmp_path / "mine.toml"
    user.write_text("[speed]\ncompile = true\n")
    assert choose_speed(CPU, load_profile(CPU, user)).compile is True
    user.write_text("[speed]\ncompile = 1\n")
    with pytest.raises(DeviceError, match="true or false"):
        load_profile(CPU, user)
    user.write_text("[speed]\nturbo = true\n")
    with pytest.raises(DeviceError, match="unknown key 'turbo'"):
        load_profile(CPU, user)


def test_the_cpu_profile_has_malloc_keep_freed_memory_and_checks_the_setting(tmp_path: Path) -> None:
    assert malloc_heap_bytes(CPU) == 1024 << 20
    assert malloc_heap_bytes(H200) == 0  # GPU memory is not malloc's
    user = tmp_path / "mine.toml"
    user.write_text("[environment]\nmalloc_heap_mib = 0\n")
    assert malloc_heap_bytes(CPU, load_profile(CPU, user)) == 0
    assert keep_freed_memory(0) is False
    for bad in ("-1", "1.5", '"lots"', "true"):
        user.write_text(f"[environment]\nmalloc_heap_mib = {bad}\n")
        with pytest.raises(DeviceError, match="whole number"):
            load_profile(CPU, user)


_FAULTS = """
import resource, sys, torch
from ootd.hardware.policy import keep_freed_memory
kept = keep_freed_memory(int(sys.argv[1]))
for _ in range(3):  # the first 32 MiB tensors, freed
    torch.empty(8 << 20).fill_(1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(30):
    torch.empty(8 << 20).fill_(1)
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_malloc_keeping_freed_memory_ends_the_page_faults_of_each_new_tensor() -> None:
    """Without it every 32 MiB tensor is a fresh mmap whose 8,192 pages fault in; with it the freed block is
    reused (a process-wide setting, so each case runs in a process of its own)."""
    def faults(heap: int) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", _FAULTS, str(heap)], capture_output=True, text=True, check=True,
                             timeout=120).stdout.split()
        return out[0], int(out[1])

    (kept_off, stock), (kept_on, kept) = faults(0), faults(1 << 30)
    assert (kept_off, kept_on) == ("False", "True")
    assert stock > 30 * 4000  # ~8,192 per tensor (4 KiB pages; fewer with transparent huge pages)
    assert kept < stock / 5, (stock, kept)  # a few blocks may still fault in once; 30 fresh ones would not


# -- memory layout --------------------------------------------------------------------------------------


def test_memory_format_helpers_convert_and_restore() -> None:
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 3))
    set_memory_format([net], True)
    assert _conv_weights_channels_last(net)
    with temporary_memory_format([net], False):
        assert not _conv_weights_channels_last(net)
        assert all(m.weight.is_contiguous() for m in net)
    assert _conv_weights_channels_last(net)
    x = torch.randn(2, 3, 8, 6).permute(0, 1, 3, 2)  # a strided view
    y = as_memory_format(x, True)
    assert y.is_contiguous(memory_format=torch.channels_last) and torch.equal(x, y)
    assert as_memory_format(x, False).is_contiguous()
    tokens = torch.randn(2, 5, 7)
    assert as_memory_format(tokens, True) is tokens


def test_pipeline_applies_the_options_to_its_models(tiny_tree: Path) -> None:
    on = Models.from_pretrained(tiny_tree, device="cpu", channels_last=True).pipeline("hd")
    off = Models.from_pretrained(tiny_tree, device="cpu", channels_last=False).pipeline("hd")
    for module in (on.components.unet_garm, on.components.unet_vton, on.components.vae):
        assert _conv_weights_channels_last(module)
    for module in (off.components.unet_garm, off.components.unet_vton, off.components.vae):
        assert not _conv_weights_channels_last(module)
    assert on.describe().channels_last is True and off.describe().channels_last is False


def test_channels_last_gives_nearly_the_same_images(tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    """Same computation in another layout: other convolution kernels sum in another order, and GroupNorm keeps
    NCHW's precision (ChannelsLastGroupNorm), so the final latents agree to float32 rounding; with PyTorch's own
    NHWC GroupNorm they were ~1e-3 apart, and a layout mix-up would give unrelated latents."""
    kwargs = {"mask": example_images["mask"], "steps": 2, "seed": 5, "resolution": (384, 512), "num_samples": 2}
    seen: dict[bool, torch.Tensor] = {}
    for channels_last in (True, False):
        pipe = Models.from_pretrained(tiny_tree, device="cpu", channels_last=channels_last).pipeline("hd")
        original_decode = pipe._decode
        pipe._decode = lambda lat, prog, _o=original_decode, _k=channels_last: (  # noqa: E731
            seen.__setitem__(_k, lat.clone()), _o(lat, prog))[1]
        pipe(example_images["person"], example_images["tshirt"], "upper", **kwargs)
    err = (seen[True] - seen[False]).abs().max().item()
    assert err < 1e-4 * seen[False].abs().max().item(), err
    assert seen[True].abs().max().item() > 0


def _images(pipe: TryOnPipeline, example_images: dict) -> list[np.ndarray]:
    result = pipe(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"], steps=2,
                  seed=3, resolution=(384, 512))
    return [np.asarray(image, dtype=np.int16) for image in result.images]


def test_fp32_default_keeps_the_stock_layout_and_kernels(pipe_hd: TryOnPipeline) -> None:
    """The exact method in fp32 computes what it did: NCHW weights and PyTorch's own GroupNorm everywhere."""
    assert not pipe_hd.speed.channels_last and not pipe_hd.speed.vae_channels_last
    for module in (pipe_hd.components.vae, pipe_hd.components.unet_garm, pipe_hd.components.unet_vton):
        assert not _conv_weights_channels_last(module)
        assert all(type(m) is torch.nn.GroupNorm for m in module.modules() if isinstance(m, torch.nn.GroupNorm))


@pytest.mark.slow
def test_bf16_runs_the_vae_channels_last_within_bf16_rounding(tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    """bf16 on the CPU: the VAE in NHWC, the UNets in NCHW; the images are as close to fp32's as the NCHW VAE's
    are, and differ from those by bf16's rounding (two paths that round independently are about sqrt(2) times as
    far apart as each is from fp32; a layout mix-up would give unrelated images)."""
    cl = Models.from_pretrained(tiny_tree, device="cpu", dtype="bf16").pipeline("hd")
    assert cl.speed.vae_channels_last and not cl.speed.channels_last and cl.describe().vae_channels_last is True
    assert _conv_weights_channels_last(cl.components.vae)
    assert not _conv_weights_channels_last(cl.components.unet_vton)
    nchw = Models.from_pretrained(tiny_tree, device="cpu", dtype="bf16", channels_last=False).pipeline("hd")
    assert not nchw.speed.vae_channels_last and not _conv_weights_channels_last(nchw.components.vae)
    fp32 = _images(Models.from_pretrained(tiny_tree, device="cpu", dtype="fp32").pipeline("hd"),
                   example_images)
    ours, stock = _images(cl, example_images), _images(nchw, example_images)

    def mean_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
        return float(np.mean([np.abs(x - y).mean() for x, y in zip(a, b, strict=True)]))

    rounding = mean_diff(stock, fp32)
    assert rounding > 0
    assert mean_diff(ours, stock) <= 1.5 * rounding
    assert mean_diff(ours, fp32) <= 1.5 * rounding


# -- garment UNet early stop ----------------------------------------------------------------------------


def test_early_stop_captures_the_same_features_and_skips_the_rest(pipe_hd: TryOnPipeline) -> None:
    unet = pipe_hd.components.unet_garm
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 4, 16, 12, generator=gen)
    prompt = torch.randn(2, 2, unet.config.cross_attention_dim, generator=gen)
    ran_conv_out: list[bool] = []
    handle = unet.conv_out.register_forward_hook(lambda *_: ran_conv_out.append(True))
    try:
        with torch.inference_mode():
            with capture_block_inputs(unet) as full:
                unet(latents, 0, encoder_hidden_states=prompt, return_dict=False)
            assert ran_conv_out == [True]
            with capture_block_inputs(unet, stop_early=True) as early:
                unet(latents, 0, encoder_hidden_states=prompt, return_dict=False)
    finally:
        handle.remove()
    assert ran_conv_out == [True], "the early stop still ran the output convolution"
    assert set(early) == set(full) == set(transformer_blocks(unet))
    for name in full:
        assert torch.equal(early[name], full[name]), name
    assert not unet._forward_pre_hooks and all(not b._forward_pre_hooks for b in transformer_blocks(unet).values())


# -- torch.compile --------------------------------------------------------------------------------------


def test_compile_failures_become_one_line_errors(pipe_hd: TryOnPipeline, example_images, monkeypatch) -> None:  # noqa: ANN001
    from torch._dynamo.exc import TorchDynamoException

    assert is_compile_failure(TorchDynamoException("no C++ compiler"))
    assert not is_compile_failure(RuntimeError("something else"))

    def broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise TorchDynamoException("backend 'inductor' failed\ndetails")

    monkeypatch.setattr(pipe_hd, "speed", SpeedOptions(channels_last=True, compile=True))
    monkeypatch.setattr(pipe_hd, "_unet_vton", broken)
    with pytest.raises(DeviceError, match=r"torch.compile failed \(backend 'inductor' failed\); run without") as err:
        pipe_hd(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"], steps=1,
                seed=1, resolution=(384, 512))
    assert "\n" not in str(err.value)
    assert "details" not in str(compile_error(TorchDynamoException("a\ndetails")))


@pytest.mark.slow
def test_compiled_try_on_unet_gives_the_same_images(tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    torch._dynamo.reset()
    person = Image.open(example_images["person"]).convert("RGB")
    kwargs = {"mask": example_images["mask"], "steps": 2, "seed": 9, "resolution": (384, 512)}
    eager = Models.from_pretrained(tiny_tree, device="cpu").pipeline("hd")
    compiled = Models.from_pretrained(tiny_tree, device="cpu", compile=True).pipeline("hd")
    assert compiled.describe().compile is True
    seen: dict[str, torch.Tensor] = {}
    for label, pipe in (("eager", eager), ("compiled", compiled)):
        original_decode = pipe._decode
        pipe._decode = lambda lat, prog, _o=original_decode, _k=label: (seen.__setitem__(_k, lat.clone()),  # noqa: E731
                                                                          _o(lat, prog))[1]
        pipe(person, example_images["tshirt"], "upper", **kwargs)
    err = (seen["eager"] - seen["compiled"]).abs().max().item()
    assert err < 1e-4 * max(1.0, seen["eager"].abs().max().item()), err
    # a second garment reuses the compiled graph (the garment keys/values are inputs, not constants)
    from torch._dynamo.utils import counters

    frames = counters["stats"]["unique_graphs"]
    compiled(person, example_images["trousers"], "upper", **kwargs)
    assert counters["stats"]["unique_graphs"] == frames
    with uncompiled(compiled.components.unet_vton):
        assert compiled.components.unet_vton._compiled_call_impl is None
    assert compiled.components.unet_vton._compiled_call_impl is not None
