"""Loading a tree we did not write, and every damaged-tree error naming its file."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ootd.errors import CheckpointError, UsageError
from ootd.settings import ModelType
from ootd.weights.layout import Layout
from ootd.weights.loading import load_components

FP32 = {k: torch.float32 for k in ("unet", "vae", "text_encoder", "image_encoder")}


@pytest.fixture
def tree(tmp_path: Path, tiny_tree: Path) -> Path:
    """A private copy of the tiny tree that a test may damage."""
    return Path(shutil.copytree(tiny_tree, tmp_path / "checkpoints"))


def test_loads_fp16_variants_and_mixed_formats(tree: Path) -> None:
    layout = Layout(tree)
    # UNet as an fp16 .bin variant only, VAE as safetensors, text encoder as fp16 safetensors variant
    garm = layout.unet_garm(ModelType.HD)
    state = load_file(garm / "diffusion_pytorch_model.safetensors")
    (garm / "diffusion_pytorch_model.safetensors").unlink()
    torch.save({k: v.half() for k, v in state.items()}, garm / "diffusion_pytorch_model.fp16.bin")
    vae_state = torch.load(layout.vae / "diffusion_pytorch_model.bin", weights_only=True)
    (layout.vae / "diffusion_pytorch_model.bin").unlink()
    save_file({k: v.contiguous() for k, v in vae_state.items()}, layout.vae / "diffusion_pytorch_model.safetensors")
    te_state = torch.load(layout.text_encoder / "pytorch_model.bin", weights_only=True)
    (layout.text_encoder / "pytorch_model.bin").unlink()
    save_file({k: v.half().contiguous() for k, v in te_state.items()}, layout.text_encoder / "model.fp16.safetensors")

    c = load_components(tree, "hd", FP32)
    assert next(c.unet_garm.parameters()).dtype == torch.float32
    key = next(iter(state))
    assert torch.allclose(c.unet_garm.state_dict()[key], state[key].half().float())
    assert torch.equal(c.vae.state_dict()[next(iter(vae_state))], next(iter(vae_state.values())))


@pytest.mark.parametrize(
    ("relative", "damage"),
    [
        ("ootd/ootd_hd/checkpoint-36000/unet_vton/diffusion_pytorch_model.safetensors", "delete"),
        ("ootd/ootd_hd/checkpoint-36000/unet_garm/diffusion_pytorch_model.safetensors", "truncate"),
        ("ootd/vae/diffusion_pytorch_model.bin", "truncate"),
        ("ootd/text_encoder/pytorch_model.bin", "delete"),
        ("ootd/text_encoder/config.json", "garbage"),
        ("ootd/tokenizer/vocab.json", "delete"),
        ("ootd/scheduler/scheduler_config.json", "delete"),
        ("ootd/model_index.json", "garbage"),
        ("clip-vit-large-patch14/model.safetensors", "truncate"),
        ("clip-vit-large-patch14/preprocessor_config.json", "delete"),
        ("ootd/vae/diffusion_pytorch_model.bin", "empty"),
    ],
)
def test_damaged_file_is_named_in_the_error(tree: Path, relative: str, damage: str) -> None:
    path = tree / relative
    if damage == "delete":
        path.unlink()
    elif damage == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.write_text("{ not json")
    with pytest.raises(CheckpointError) as info:
        load_components(tree, "hd", FP32)
    message = str(info.value)
    assert "\n" not in message
    folder_or_file = str(path) if damage != "garbage" or "config.json" not in relative else str(path.parent)
    assert folder_or_file in message or str(path.parent) in message
    assert "ootd download" in message


def test_missing_root_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist.*ootd download"):
        load_components(tmp_path / "nowhere", "hd", FP32)


def test_pickled_weights_load_without_unpickling_code(tree: Path) -> None:
    """A .bin that would run code when fully unpickled is refused (weights_only=True)."""

    class Boom:
        def __reduce__(self):  # noqa: ANN204
            return (exec, ("raise SystemExit('unpickled!')",))

    vae_bin = Layout(tree).vae / "diffusion_pytorch_model.bin"
    with open(vae_bin, "wb") as f:
        pickle.dump({"weight": Boom()}, f)
    with pytest.raises(CheckpointError, match="diffusion_pytorch_model.bin"):
        load_components(tree, "hd", FP32)


def test_unknown_model_type_is_a_usage_error(tiny_tree: Path) -> None:
    from ootd.models import Models

    with pytest.raises(UsageError, match="model type"):
        Models.from_pretrained(tiny_tree).pipeline("xx")


def test_released_class_names_are_loaded_with_stock_classes(tiny_tree: Path) -> None:
    config = json.loads((Layout(tiny_tree).unet_vton(ModelType.DC) / "config.json").read_text())
    assert config["_class_name"] == "UNetVton2DConditionModel"
    c = load_components(tiny_tree, "dc", FP32)
    assert type(c.unet_vton).__name__ == "UNet2DConditionModel"
    assert c.unet_vton.config.in_channels == 8 and c.unet_garm.config.in_channels == 4
