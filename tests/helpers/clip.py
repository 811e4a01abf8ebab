"""A checkpoints tree whose CLIP model classifies one garment photo as the test decides, and a reference of the
zero-shot classification written independently of ootd/method/classify.py (only its prompt table, which is
data, is shared).

`controlled_tree(tiny_tree, dest, garment, weights)` copies the tiny tree and rewrites its CLIP so that the
garment's image embedding is exactly sum(weights[c] * text_feature[c]) (the visual projection is set to map this
photo's pooled image features onto that vector) and the logit scale is log(SCALE).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch
from PIL import Image

from ootd.method.classify import CATEGORY_PROMPTS
from ootd.settings import Category

SCALE = 100.0  # exp(logit_scale) of the controlled model (as CLIP ViT-L/14's released one)


def reference_features(model, tokenizer) -> dict[Category, torch.Tensor]:  # noqa: ANN001
    """Per category: the mean of the prompts' unit text embeddings, unit length again (CLIP's prompt
    ensembling), computed one prompt at a time with transformers' CLIPModel."""
    features = {}
    with torch.no_grad():
        for category, prompts in CATEGORY_PROMPTS.items():
            rows = []
            for prompt in prompts:
                ids = tokenizer([prompt], return_tensors="pt").input_ids
                text = model.get_text_features(input_ids=ids)
                text = getattr(text, "pooler_output", text).reshape(-1)
                rows.append(text / text.norm())
            mean = torch.stack(rows).mean(0)
            features[category] = mean / mean.norm()
    return features


def reference_probabilities(image_embed: torch.Tensor, features: dict[Category, torch.Tensor],
                            scale: float) -> dict[Category, float]:
    """softmax(scale * cosine(image, category)) over the categories, written out by hand."""
    unit = image_embed / image_embed.norm()
    logits = {c: scale * float(unit @ f) for c, f in features.items()}
    top = max(logits.values())
    weights = {c: math.exp(v - top) for c, v in logits.items()}
    total = sum(weights.values())
    return {c: w / total for c, w in weights.items()}


def controlled_tree(tiny_tree: Path, dest: Path, garment: Path,
                    weights: dict[Category, float]) -> tuple[Path, dict[Category, float]]:
    """The copied tree and the probabilities the reference expects for `garment` on it."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    shutil.copytree(tiny_tree, dest)
    clip = dest / "clip-vit-large-patch14"
    tokenizer = CLIPTokenizer.from_pretrained(dest / "ootd" / "tokenizer")
    config = CLIPConfig.from_pretrained(clip)  # the text tower pools at the tokenizer's own end token
    config.text_config.bos_token_id, config.text_config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    config.text_config.pad_token_id = tokenizer.pad_token_id
    model = CLIPModel.from_pretrained(clip, config=config).eval()
    features = reference_features(model, tokenizer)
    target = sum(weights.get(c, 0.0) * f for c, f in features.items())
    processor = CLIPImageProcessor.from_pretrained(clip)
    with torch.no_grad():
        pixels = processor(images=Image.open(garment).convert("RGB"), return_tensors="pt").pixel_values
        pooled = model.vision_model(pixel_values=pixels).pooler_output.reshape(-1)
        model.visual_projection.weight.copy_(torch.outer(target, pooled) / pooled.dot(pooled))
        model.logit_scale.fill_(math.log(SCALE))
        embed = model.get_image_features(pixel_values=pixels)
        embed = getattr(embed, "pooler_output", embed).reshape(-1)
    assert torch.allclose(embed, target, atol=1e-4), "the projection does not give the chosen embedding"
    for old in clip.glob("model*.safetensors"):
        old.unlink()
    model.save_pretrained(clip, safe_serialization=True)
    return dest, reference_probabilities(target, features, SCALE)


def without_text_tower(tiny_tree: Path, dest: Path) -> Path:
    """A copy of the tree whose CLIP folder holds only the image tower (CLIPVisionModelWithProjection)."""
    from transformers import CLIPVisionModelWithProjection

    shutil.copytree(tiny_tree, dest)
    clip = dest / "clip-vit-large-patch14"
    vision = CLIPVisionModelWithProjection.from_pretrained(clip)
    for old in clip.glob("model*.safetensors"):
        old.unlink()
    vision.save_pretrained(clip, safe_serialization=True)
    return dest
