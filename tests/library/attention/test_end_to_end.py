"""Whole try-ons through different attention backends agree (issue: attention backends end to end)."""

from __future__ import annotations

import pytest
import torch

from ootd.attention import build_attention
from ootd.hardware.device import DeviceInfo
from ootd.models import Models
from ootd.pipeline import TryOnPipeline


def _final_latents(pipe: TryOnPipeline, example_images, monkeypatch) -> torch.Tensor:  # noqa: ANN001
    seen: list[torch.Tensor] = []
    decode = pipe._decode
    monkeypatch.setattr(pipe, "_decode", lambda lat, prog: (seen.append(lat.clone()), decode(lat, prog))[1])
    pipe(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"], num_samples=2,
         steps=2, seed=11, resolution=(384, 512))
    return seen[0]


@pytest.mark.slow  # two whole try-ons
def test_chunked_and_math_give_the_same_try_on(tiny_tree, example_images, monkeypatch) -> None:  # noqa: ANN001
    cpu = DeviceInfo(type="cpu")
    # a budget small enough that every fusion attention call is cut into query and key chunks
    chunked = build_attention("chunked", cpu, torch.float32, budget_bytes=256 * 1024)
    math = build_attention("math", cpu, torch.float32)
    a = _final_latents(Models.from_pretrained(tiny_tree, device="cpu", attention=chunked).pipeline("hd"),
                       example_images, monkeypatch)
    b = _final_latents(Models.from_pretrained(tiny_tree, device="cpu", attention=math).pipeline("hd"),
                       example_images, monkeypatch)
    assert chunked.used["chunked"] > 0 and math.used["math"] > 0
    assert (a - b).abs().max().item() < 1e-4 * max(1.0, b.abs().max().item())


def test_pipeline_reports_its_attention(pipe_hd) -> None:  # noqa: ANN001
    ran = pipe_hd.describe()
    assert ran.device == "cpu" and ran.model_type == "hd"
    assert ran.precision == "fp32" and ran.precision_by_component["unet"] == "float32"
    assert "sdpa" in ran.attention
