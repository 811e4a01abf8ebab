"""Small fake checkpoint trees in the released layout: every file there, loadable by the cheap checks (not by the
models: for that, the tiny tree of scripts/make_tiny_checkpoints.py)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import torch
from onnx import TensorProto, helper
from safetensors.torch import save_file

from ootd.settings import ModelType
from ootd.weights.layout import Layout


def write_json(path: Path, data: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data if data is not None else {"_class_name": "Fake"}))


def write_safetensors(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"weight": torch.zeros(64, 64), "bias": torch.zeros(64)}, str(path))


def write_torch(path: Path, legacy: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"weight": torch.zeros(8, 8)}, path, _use_new_zipfile_serialization=not legacy)


def write_onnx(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    x = helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 3, 8, 8])
    weight = helper.make_tensor("w", TensorProto.FLOAT, [1], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["input.1", "w"], ["out"])], "g", [x], [y], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def make_tree(root: Path, models: tuple[str, ...] = ("hd", "dc")) -> Layout:
    """A complete, loadable, tiny checkpoints tree in the released layout (.bin where the release has it)."""
    layout = Layout(root)
    write_json(layout.model_index)
    write_json(layout.scheduler / "scheduler_config.json")
    write_json(layout.text_encoder / "config.json")
    write_torch(layout.text_encoder / "pytorch_model.bin")
    write_json(layout.tokenizer / "vocab.json", {"a": 0})
    (layout.tokenizer / "merges.txt").write_text("#version: 0.2\na b\n")
    write_json(layout.vae / "config.json")
    write_torch(layout.vae / "diffusion_pytorch_model.bin")
    for model in models:
        for folder in (layout.unet_garm(ModelType(model)), layout.unet_vton(ModelType(model))):
            write_json(folder / "config.json")
            write_safetensors(folder / "diffusion_pytorch_model.safetensors")
    write_json(layout.clip / "config.json")
    write_safetensors(layout.clip / "model.safetensors")
    write_json(layout.clip / "preprocessor_config.json")
    write_onnx(layout.parsing_atr)
    write_onnx(layout.parsing_lip)
    write_torch(layout.body_pose)
    return layout


