#!/usr/bin/env python
"""Write a complete checkpoints tree in the released layout, with tiny random weights (or, with --full, the
released architectures at full size: the honest way to measure speed and memory without the released weights).

The tree has every file the real download has (docs/upstream.md §1), in the same formats (text
encoder and VAE as pickled `.bin` state dicts, UNets and CLIP as safetensors, parsing as ONNX,
OpenPose as a plain state dict of the real architecture), so the code that loads the released
checkpoints loads this one too. Pictures made with it are noise: the weights are random.

    python scripts/make_tiny_checkpoints.py OUT [--seed 0] [--full] [--models hd]

With --full the diffusion models, their encoders and CLIP are full size (the hd model alone is about 9 GB in
fp32; --models picks the model types); pose and parsing stay tiny (a run with a mask does not use them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from ootd.tools.bench.architectures import (  # noqa: E402 - after the path set-up above
    CLIP_TEXT_TOWER_TINY,
    FULL,
    SD15_SCHEDULER_CONFIG,
    TINY,
    TINY_HIDDEN,
    Architecture,
    text_config,
    write_json,
    write_tokenizer,
)

MODEL_INDEX = {
    "_class_name": "OotdPipeline",
    "_diffusers_version": "0.24.0",
    "feature_extractor": ["transformers", "CLIPImageProcessor"],
    "requires_safety_checker": False,
    "safety_checker": [None, None],
    "scheduler": ["diffusers", "PNDMScheduler"],
    "text_encoder": ["transformers", "CLIPTextModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "unet_garm": ["unet_garm_2d_condition", "UNetGarm2DConditionModel"],
    "unet_vton": ["unet_vton_2d_condition", "UNetVton2DConditionModel"],
    "vae": ["diffusers", "AutoencoderKL"],
}

IMAGE_PROCESSOR = {
    "crop_size": {"height": 224, "width": 224},
    "do_center_crop": True,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "CLIPImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": 224},
}


def write_text_encoder(folder: Path, vocab_size: int, arch: Architecture = TINY) -> None:
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(**text_config(arch, vocab_size))
    model = CLIPTextModel(config)
    folder.mkdir(parents=True, exist_ok=True)
    config.to_json_file(folder / "config.json")
    torch.save(model.state_dict(), folder / "pytorch_model.bin")


def write_vae(folder: Path, arch: Architecture = TINY) -> None:
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(**arch.vae)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", dict(vae.config))
    torch.save(vae.state_dict(), folder / "diffusion_pytorch_model.bin")


def write_unet(folder: Path, in_channels: int, class_name: str, arch: Architecture = TINY) -> None:
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel(in_channels=in_channels, **arch.unet)
    unet.save_pretrained(folder, safe_serialization=True)
    config = json.loads((folder / "config.json").read_text())
    config["_class_name"] = class_name  # as released: the original's own class names
    write_json(folder / "config.json", config)


def write_clip(folder: Path, arch: Architecture = TINY, vocab_size: int = 0) -> None:
    from transformers import CLIPConfig, CLIPModel

    if arch is TINY:
        config = CLIPConfig(text_config=dict(CLIP_TEXT_TOWER_TINY), vision_config=dict(TINY.vision),
                            projection_dim=TINY_HIDDEN)
    else:  # the released CLIP ViT-L/14: its text tower, vision tower and 768-wide projection
        config = CLIPConfig(text_config=text_config(arch, vocab_size), vision_config=dict(arch.vision),
                            projection_dim=768)
    CLIPModel(config).save_pretrained(folder, safe_serialization=True)
    write_json(folder / "preprocessor_config.json", IMAGE_PROCESSOR)


def write_parsing_onnx(path: Path, num_classes: int, input_size: int, rng: np.random.Generator) -> None:
    """An ONNX graph with the released interface: input `input.1` [1,3,S,S], outputs
    (parsing logits, fusion logits, edge logits) at S/4, the second being the one used."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def conv(name: str, out_ch: int) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
        w = numpy_helper.from_array(rng.normal(0, 0.5, (out_ch, 3, 4, 4)).astype(np.float32), f"{name}_w")
        b = numpy_helper.from_array(rng.normal(0, 0.1, (out_ch,)).astype(np.float32), f"{name}_b")
        node = helper.make_node("Conv", ["input.1", f"{name}_w", f"{name}_b"], [name], strides=[4, 4])
        return node, [w, b]

    out = input_size // 4
    nodes, inits = [], []
    for name, ch in (("parsing", num_classes), ("fusion", num_classes), ("edge", 2)):
        node, weights = conv(name, ch)
        nodes.append(node)
        inits += weights
    graph = helper.make_graph(
        nodes, "schp_tiny",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, input_size, input_size])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, c, out, out])
         for n, c in (("parsing", num_classes), ("fusion", num_classes), ("edge", 2))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def write_body_pose(path: Path) -> None:
    """The real architecture's keys and shapes; each tensor one random value broadcast over its
    shape, so the file is a few KB instead of the released 209 MB."""
    from preprocess.pose import expected_state_dict_shapes

    state = {key: (torch.randn(()) * 0.05).expand(shape) for key, shape in expected_state_dict_shapes().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)


def make_tiny_checkpoints(out: Path, seed: int = 0, full: bool = False, models: tuple[str, ...] = ("hd", "dc")
                          ) -> Path:
    """Write the whole tree under `out` and return it (`full`: the released architectures' sizes; `models`: the
    model types whose UNets are written)."""
    arch = FULL if full else TINY
    out = Path(out)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    ootd = out / "ootd"
    write_json(ootd / "model_index.json", MODEL_INDEX)
    write_json(ootd / "scheduler" / "scheduler_config.json", SD15_SCHEDULER_CONFIG)
    write_json(ootd / "feature_extractor" / "preprocessor_config.json", IMAGE_PROCESSOR)
    vocab_size = write_tokenizer(ootd / "tokenizer")
    write_text_encoder(ootd / "text_encoder", vocab_size, arch)
    write_vae(ootd / "vae", arch)
    for model_type in models:
        base = ootd / f"ootd_{model_type}" / "checkpoint-36000"
        write_unet(base / "unet_garm", 4, "UNetGarm2DConditionModel", arch)
        write_unet(base / "unet_vton", 8, "UNetVton2DConditionModel", arch)
    write_clip(out / "clip-vit-large-patch14", arch, vocab_size)
    write_parsing_onnx(out / "humanparsing" / "parsing_atr.onnx", 18, 512, rng)
    write_parsing_onnx(out / "humanparsing" / "parsing_lip.onnx", 20, 473, rng)
    write_body_pose(out / "openpose" / "ckpts" / "body_pose_model.pth")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder to write the checkpoints tree into")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    parser.add_argument("--full", action="store_true", help="the released architectures at full size")
    parser.add_argument("--models", nargs="+", default=["hd", "dc"], choices=["hd", "dc"],
                        help="the model types to write (default both)")
    args = parser.parse_args(argv)
    import logging

    logging.disable(logging.WARNING)
    make_tiny_checkpoints(args.out, args.seed, args.full, tuple(args.models))
    size = "full-size" if args.full else "tiny"
    print(f"wrote {size} random-weight checkpoints to {args.out} (their try-on pictures are noise)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
