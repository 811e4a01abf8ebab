"""`--lora`: an adapter at scale 0 and a fresh adapter give the base model's images bit for bit, a trained one
changes them and the record names it; damaged or mismatched adapters are refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ootd.errors import CheckpointError, UsageError
from ootd.models import Models
from ootd.pipeline import TryOnPipeline
from ootd.settings import ModelType
from ootd.weights.lora import LoraChoice, adapter_bytes, check_lora_scale, read_adapter
from tests.helpers.training import write_adapter

RES = "384x512"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, tiny_tree: Path) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("adapters")
    return {"fresh": write_adapter(tiny_tree, folder / "fresh.safetensors", False),
            "trained": write_adapter(tiny_tree, folder / "trained.safetensors", True)}


def _images(pipe: TryOnPipeline, example_images: dict) -> tuple[np.ndarray, object]:
    result = pipe(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"], steps=2,
                  seed=5, resolution=RES)
    return np.asarray(result.images[0]), result.lora


def test_scale_zero_and_a_fresh_adapter_keep_the_base_images(tiny_tree: Path, adapters: dict, example_images: dict,
                                                             pipe_hd: TryOnPipeline) -> None:
    base, base_settings = _images(pipe_hd, example_images)
    assert base_settings is None
    for path, scale in ((adapters["trained"], 0.0), (adapters["fresh"], 1.0)):
        pipe = Models.from_pretrained(tiny_tree, device="cpu").pipeline("hd", lora=path, lora_scale=scale)
        images, settings = _images(pipe, example_images)
        assert np.array_equal(images, base), (path.name, scale)
        assert settings.path.name == path.name and settings.scale == scale
    pipe = Models.from_pretrained(tiny_tree, device="cpu").pipeline("hd", lora=adapters["trained"], lora_scale=0.5)
    images, settings = _images(pipe, example_images)
    assert not np.array_equal(images, base)
    assert settings.sha256 == read_adapter(adapters["trained"]).sha256 and settings.scale == 0.5


def test_damaged_and_mismatched_adapters_are_refused_in_one_line(tiny_tree: Path, adapters: dict,
                                                                 tmp_path: Path) -> None:
    good = adapters["trained"].read_bytes()
    cases = {"empty": b"", "truncated": good[: len(good) // 2], "text": b"\x10\x00\x00\x00\x00\x00\x00\x00not json",
             "other safetensors": _other_safetensors()}
    for name, data in cases.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(data)
        with pytest.raises(CheckpointError) as caught:
            read_adapter(path)
        assert "\n" not in str(caught.value) and path.name in str(caught.value), name
    dc = write_adapter(tiny_tree, tmp_path / "dc.safetensors", True, ModelType.DC)
    with pytest.raises(CheckpointError, match="trained on the dc model, this try-on uses the hd model"):
        Models.from_pretrained(tiny_tree, device="cpu").pipeline("hd", lora=dc)
    state = read_adapter(adapters["trained"]).tensors
    wrong = {u: {k: torch.zeros(v.shape[0] + 1, v.shape[1]) if k.endswith("lora_B.weight") else v
                 for k, v in s.items()} for u, s in state.items()}
    (tmp_path / "shape.safetensors").write_bytes(adapter_bytes(wrong, ModelType.HD, 4, 4))
    with pytest.raises(CheckpointError, match="does not fit this model: .* has shape"):
        Models.from_pretrained(tiny_tree, device="cpu").pipeline("hd", lora=tmp_path / "shape.safetensors")
    with pytest.raises(UsageError, match="^lora_scale must be from 0 to 4") as refused:  # the setting's own name
        check_lora_scale(-1)
    assert refused.value.setting == "lora_scale"
    with pytest.raises(UsageError, match="not found"):
        LoraChoice.parse(tmp_path / "nowhere.safetensors")
    assert LoraChoice.parse(None) is None


def _other_safetensors() -> bytes:
    from safetensors.torch import save

    return save({"weight": torch.zeros(2)}, metadata={"format": "pt"})
