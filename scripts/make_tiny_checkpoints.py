#!/usr/bin/env python
"""Write a complete checkpoints tree in the released layout, with tiny random weights.

The tree has every file the real download has (SPEC section 1), in the same formats (text
encoder and VAE as pickled `.bin` state dicts, UNets and CLIP as safetensors, parsing as ONNX,
OpenPose as a plain state dict of the real architecture), so the code that loads the released
checkpoints loads this one too. Pictures made with it are noise: the weights are random.

    python scripts/make_tiny_checkpoints.py OUT [--seed 0]
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

HIDDEN = 32  # text hidden size = CLIP projection size = UNet cross-attention size
CATEGORY_WORDS = ["upperbody", "lowerbody", "dress"]

SCHEDULER_CONFIG = {  # the Stable Diffusion 1.5 scheduler file the released folder carries
    "_class_name": "PNDMScheduler",
    "_diffusers_version": "0.6.0",
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "num_train_timesteps": 1000,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "trained_betas": None,
    "clip_sample": False,
}

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


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _bytes_to_unicode() -> list[str]:
    """The byte-level alphabet of CLIP's BPE (printable stand-ins for all 256 bytes)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    keep += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def write_tokenizer(folder: Path) -> int:
    """A small hand-made CLIP BPE vocabulary: every byte symbol, plus merges for the category words."""
    alphabet = _bytes_to_unicode()
    vocab: list[str] = list(alphabet) + [c + "</w>" for c in alphabet]
    merges: list[str] = []
    for word in CATEGORY_WORDS:
        symbols = list(word[:-1]) + [word[-1] + "</w>"]
        current = symbols[0]
        for nxt in symbols[1:]:
            merges.append(f"{current} {nxt}")
            current = current + nxt
            if current not in vocab:
                vocab.append(current)
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps({tok: i for i, tok in enumerate(vocab)}, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    special = {
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
    }
    _write_json(folder / "special_tokens_map.json", special)
    _write_json(
        folder / "tokenizer_config.json",
        {**special, "add_prefix_space": False, "do_lower_case": True, "errors": "replace",
         "model_max_length": 77, "tokenizer_class": "CLIPTokenizer"},
    )
    return len(vocab)


def write_text_encoder(folder: Path, vocab_size: int) -> None:
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(
        vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=37, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=77, projection_dim=HIDDEN,
        bos_token_id=vocab_size - 2, eos_token_id=vocab_size - 1, pad_token_id=vocab_size - 1,
    )
    model = CLIPTextModel(config)
    folder.mkdir(parents=True, exist_ok=True)
    config.to_json_file(folder / "config.json")
    torch.save(model.state_dict(), folder / "pytorch_model.bin")


def write_vae(folder: Path) -> None:
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16), layers_per_block=1, norm_num_groups=4, sample_size=64,
    )
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / "config.json", dict(vae.config))
    torch.save(vae.state_dict(), folder / "diffusion_pytorch_model.bin")


def write_unet(folder: Path, in_channels: int, class_name: str) -> None:
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel(
        sample_size=64, in_channels=in_channels, out_channels=4, layers_per_block=1,
        # attention one level down from the real model's first level keeps the tests' attention cheap
        block_out_channels=(32, 64), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=HIDDEN,
        attention_head_dim=2, norm_num_groups=32,
    )
    unet.save_pretrained(folder, safe_serialization=True)
    config = json.loads((folder / "config.json").read_text())
    config["_class_name"] = class_name  # as released: the original's own class names
    _write_json(folder / "config.json", config)


def write_clip(folder: Path) -> None:
    from transformers import CLIPConfig, CLIPModel

    config = CLIPConfig(
        text_config={"vocab_size": 600, "hidden_size": HIDDEN, "intermediate_size": 37,
                     "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 77,
                     "bos_token_id": 598, "eos_token_id": 599, "pad_token_id": 599, "projection_dim": HIDDEN},
        vision_config={"hidden_size": HIDDEN, "intermediate_size": 37, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "image_size": 224, "patch_size": 32,
                       "projection_dim": HIDDEN},
        projection_dim=HIDDEN,
    )
    CLIPModel(config).save_pretrained(folder, safe_serialization=True)
    _write_json(folder / "preprocessor_config.json", IMAGE_PROCESSOR)


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


def make_tiny_checkpoints(out: Path, seed: int = 0) -> Path:
    """Write the whole tree under `out` and return it."""
    out = Path(out)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    ootd = out / "ootd"
    _write_json(ootd / "model_index.json", MODEL_INDEX)
    _write_json(ootd / "scheduler" / "scheduler_config.json", SCHEDULER_CONFIG)
    _write_json(ootd / "feature_extractor" / "preprocessor_config.json", IMAGE_PROCESSOR)
    vocab_size = write_tokenizer(ootd / "tokenizer")
    write_text_encoder(ootd / "text_encoder", vocab_size)
    write_vae(ootd / "vae")
    for model_type in ("hd", "dc"):
        base = ootd / f"ootd_{model_type}" / "checkpoint-36000"
        write_unet(base / "unet_garm", 4, "UNetGarm2DConditionModel")
        write_unet(base / "unet_vton", 8, "UNetVton2DConditionModel")
    write_clip(out / "clip-vit-large-patch14")
    write_parsing_onnx(out / "humanparsing" / "parsing_atr.onnx", 18, 512, rng)
    write_parsing_onnx(out / "humanparsing" / "parsing_lip.onnx", 20, 473, rng)
    write_body_pose(out / "openpose" / "ckpts" / "body_pose_model.pth")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder to write the checkpoints tree into")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    args = parser.parse_args(argv)
    import logging

    logging.disable(logging.WARNING)
    make_tiny_checkpoints(args.out, args.seed)
    print(f"wrote tiny random-weight checkpoints to {args.out} (their try-on pictures are noise)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
