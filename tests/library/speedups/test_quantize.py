"""Quantized UNet weights (ootd/speedups/quantize.py) on the tiny tree: `none` is exact, int8 is close, small and
planned."""

from __future__ import annotations

import importlib.util
import math
import sys

import numpy as np
import pytest
import torch

from ootd.errors import DeviceError, UnsupportedError, UsageError
from ootd.hardware.device import DeviceInfo
from ootd.hardware.policy import choose_quantization, supported_quantization
from ootd.memory.estimate import PlanRequest
from ootd.memory.planner import make_plan
from ootd.memory.sizes import RELEASED_SIZES, ModelSizes
from ootd.models import Models
from ootd.pipeline import TryOnPipeline
from ootd.settings import QuantizeName
from ootd.speedups.quantize import is_quantized, module_weight_bytes
from ootd.weights.released import RELEASED_UNET_CONFIG

GIB = 1 << 30
# the tests that quantize need the `quant` extra; the policy, planner and error tests run without it
needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao (quant extra)")
CALL = dict(num_samples=2, steps=2, seed=7, resolution=(384, 512))


@pytest.fixture(scope="module")
def exact(tiny_tree):  # noqa: ANN001, ANN201
    return Models.from_pretrained(tiny_tree, device="cpu", dtype="fp32").pipeline("hd")


@pytest.fixture(scope="module")
def int8(tiny_tree):  # noqa: ANN001, ANN201
    return Models.from_pretrained(tiny_tree, device="cpu", dtype="fp32", quantize="int8-dynamic").pipeline("hd")


def _try_on(pipe: TryOnPipeline, images: dict) -> list[np.ndarray]:
    result = pipe(images["person"], images["tshirt"], "upper", mask=images["mask"], **CALL)
    return [np.asarray(img, dtype=np.float64) for img in result.images]


def _linears(pipe: TryOnPipeline) -> list[torch.nn.Linear]:
    c = pipe.components
    return [m for unet in (c.unet_garm, c.unet_vton) for m in unet.modules() if isinstance(m, torch.nn.Linear)]


def test_none_is_the_exact_path_bit_for_bit(tiny_tree, exact, example_images) -> None:  # noqa: ANN001
    none = Models.from_pretrained(tiny_tree, device="cpu", dtype="fp32", quantize="none").pipeline("hd")
    assert none.describe().quantize == "none" == exact.describe().quantize
    for unet in (none.components.unet_garm, none.components.unet_vton):
        assert not any(is_quantized(t) for t in (*unet.parameters(), *unet.buffers()))
    for ours, theirs in zip(_try_on(none, example_images), _try_on(exact, example_images), strict=True):
        assert np.array_equal(ours, theirs)


@needs_torchao
def test_int8_dynamic_runs_and_stays_close(int8, exact, example_images) -> None:  # noqa: ANN001
    assert int8.describe().quantize == "int8-dynamic"
    quantized, reference = _try_on(int8, example_images), _try_on(exact, example_images)
    assert [img.shape for img in quantized] == [(512, 384, 3)] * 2
    for ours, theirs in zip(quantized, reference, strict=True):
        mse = float(((ours - theirs) ** 2).mean())
        assert mse > 0  # it is approximate: the int8 path really ran
        # measured 61-62 dB here (8-bit images: 48 dB is one level off on every pixel); the bound leaves room
        # for other CPUs' int8 kernels
        assert 10 * math.log10(255**2 / mse) > 45


@needs_torchao
def test_one_unet_call_is_within_two_percent(int8, exact) -> None:  # noqa: ANN001
    """The try-on UNet's output for the same inputs: relative L2 error of the quantized one (0.4% measured)."""
    gen = torch.Generator().manual_seed(0)
    sample = torch.randn(2, 8, 64, 48, generator=gen)
    prompt = torch.randn(2, 2, exact.components.unet_vton.config.cross_attention_dim, generator=gen)
    garment = torch.randn(1, 4, 64, 48, generator=gen)
    outputs = []
    for pipe in (exact, int8):
        with torch.inference_mode():
            features = pipe.garment_features(garment, prompt[:1])  # garment UNet on [garment, zeros]
        with torch.inference_mode(), pipe.fusion.garment(features, torch.arange(2)):
            outputs.append(pipe.components.unet_vton(sample, 500, encoder_hidden_states=prompt,
                                                     return_dict=False)[0])
    reference, ours = outputs
    relative = float((ours - reference).norm() / reference.norm())
    assert 0 < relative < 0.02


@needs_torchao
def test_linear_weights_are_int8_and_the_rest_stays_float(int8) -> None:  # noqa: ANN001
    linears = _linears(int8)
    assert linears and all(is_quantized(m.weight) and m.weight.qdata.dtype is torch.int8 for m in linears)
    assert all(m.weight.qdata.shape == (m.out_features, m.in_features) for m in linears)
    linear_weights = {id(m.weight) for m in linears}
    for unet in (int8.components.unet_garm, int8.components.unet_vton):
        rest = [p for p in unet.parameters() if id(p) not in linear_weights]
        assert rest and all(not is_quantized(p) and p.dtype is torch.float32 for p in rest)


@needs_torchao
def test_int8_linear_matches_a_per_row_reference(int8, exact) -> None:  # noqa: ANN001
    """One quantized layer against symmetric per-row int8 quantization of weights and of each input token,
    written out here: scale = absmax / 127.5 (half the int8 range), q = round(x * (1 / scale)) clamped to
    [-128, 127] (multiplying by the reciprocal, as torchao does: it decides ties differently from x / scale)."""
    name, layer = next((n, m) for n, m in int8.components.unet_vton.named_modules()
                       if isinstance(m, torch.nn.Linear) and n.endswith("attn1.to_k"))
    float_layer = exact.components.unet_vton.get_submodule(name)

    def fake_quant(x: torch.Tensor) -> torch.Tensor:
        scale = (x.abs().amax(dim=-1, keepdim=True) / 127.5).clamp(min=torch.finfo(torch.float32).eps)
        return (x * (1.0 / scale)).round().clamp(-128, 127) * scale

    x = torch.randn(5, layer.in_features, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got = layer(x)
        expected = torch.nn.functional.linear(fake_quant(x), fake_quant(float_layer.weight), float_layer.bias)
        exact_out = float_layer(x)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(got, exact_out, rtol=1e-4, atol=1e-5)


@needs_torchao
def test_weights_are_smaller_and_the_planner_counts_them(int8, exact) -> None:  # noqa: ANN001
    for name in ("unet_garm", "unet_vton"):
        before = module_weight_bytes(getattr(exact.components, name))
        after = module_weight_bytes(getattr(int8.components, name))
        # int8 data + a float32 scale and an int8 zero point per output row, instead of float32 weights
        linears = [m for m in getattr(int8.components, name).modules() if isinstance(m, torch.nn.Linear)]
        saved = sum(3 * m.weight.numel() - 5 * m.out_features for m in linears)
        assert after == before - saved < before
        # the planner's bytes equal the bytes the tensors really hold, before and after
        planned = {pipe: ModelSizes.from_components(pipe.components).weight_bytes(torch.float32)[name]
                   for pipe in (exact, int8)}
        assert (planned[exact], planned[int8]) == (before, after)


def test_the_plan_of_quantized_released_unets_is_smaller() -> None:
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel(in_channels=8, **RELEASED_UNET_CONFIG)
    linears = [m for m in unet.modules() if isinstance(m, torch.nn.Linear)]
    assert RELEASED_SIZES.unet_linear == sum(m.weight.numel() for m in linears)
    assert RELEASED_SIZES.unet_linear_rows == sum(m.out_features for m in linears)
    cpu = DeviceInfo(type="cpu", total_memory=64 * GIB, free_memory=60 * GIB)
    plans = [make_plan(PlanRequest(cpu, (768, 1024), 1, True, torch.float32, "sdpa", sizes))
             for sizes in (RELEASED_SIZES, RELEASED_SIZES.quantized())]
    weights = [plan.estimate["weights_total"] for plan in plans]
    # two UNets, each 270M Linear weights going from 4 bytes to 1, plus 5 bytes per row: ~1.5 GiB less
    assert weights[0] - weights[1] == 2 * (3 * 270_049_280 - 5 * 234_880)
    assert plans[1].estimate["peak"] < plans[0].estimate["peak"]
    assert "quantized" in plans[1].explain().splitlines()[0] and "quantized" not in plans[0].explain()
    half = RELEASED_SIZES.quantized().weight_bytes(torch.float16)["unet_vton"]
    assert half == (859_532_484 - 270_049_280) * 2 + 270_049_280 + 5 * 234_880


FAKE = {
    "cpu": DeviceInfo(type="cpu"),
    "mps": DeviceInfo(type="mps", vendor="apple", arch="mps"),
    "sm_86": DeviceInfo(type="cuda", index=0, vendor="nvidia", arch="sm_86"),
    "sm_89": DeviceInfo(type="cuda", index=0, vendor="nvidia", arch="sm_89"),
    "sm_90": DeviceInfo(type="cuda", index=0, vendor="nvidia", arch="sm_90"),
    "sm_120": DeviceInfo(type="cuda", index=0, vendor="nvidia", arch="sm_120"),
    "gfx942": DeviceInfo(type="cuda", index=0, vendor="amd", arch="gfx942"),
    "gfx1100": DeviceInfo(type="cuda", index=0, vendor="amd", arch="gfx1100"),
}


@pytest.mark.parametrize(("device", "fp8"), [
    ("cpu", False), ("sm_86", False), ("sm_89", True), ("sm_90", True), ("sm_120", True), ("gfx942", True),
    ("gfx1100", False),
])
def test_which_devices_run_which_modes(device: str, fp8: bool) -> None:
    modes = supported_quantization(FAKE[device])
    assert (QuantizeName.FP8 in modes) is fp8
    assert {QuantizeName.NONE, QuantizeName.INT8_DYNAMIC, QuantizeName.INT8_WEIGHT} <= set(modes)
    assert supported_quantization(FAKE["mps"]) == (QuantizeName.NONE,)


def test_fp8_on_the_cpu_is_a_one_line_error(tiny_tree) -> None:  # noqa: ANN001
    with pytest.raises(DeviceError) as err:
        Models.from_pretrained(tiny_tree, device="cpu", dtype="fp32", quantize="fp8").pipeline("hd")
    assert str(err.value) == ("quantization fp8 is not supported on the CPU: use none, int8-dynamic, int8-weight")
    with pytest.raises(DeviceError, match="not supported on gfx1100: use none, int8-dynamic, int8-weight$"):
        choose_quantization(FAKE["gfx1100"], "fp8")
    with pytest.raises(UsageError, match="^quantization fp8 needs precision bf16, not fp16$"):
        choose_quantization(FAKE["sm_90"], "fp8", torch.float16)
    assert choose_quantization(FAKE["sm_90"], "fp8", torch.bfloat16) is QuantizeName.FP8
    words = "none, int8-dynamic, int8-weight, fp8"
    with pytest.raises(UsageError, match=f"unknown quantization 'int4': use one of {words}$"):
        choose_quantization(FAKE["cpu"], "int4")


def test_missing_torchao_is_a_one_line_error(tiny_tree, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)  # what an environment without it raises
    loads = []
    monkeypatch.setattr("ootd.models.build.read_components", lambda *args: loads.append(args))
    with pytest.raises(UnsupportedError) as err:  # a setting this machine cannot run (exit 3)
        Models.from_pretrained(tiny_tree, device="cpu", dtype="fp32", quantize="int8-dynamic").pipeline("hd")
    assert str(err.value) == "quantization needs torchao, which is not installed: pip install 'ootd[quant]'"
    assert not loads  # said before loading anything
