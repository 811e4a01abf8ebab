"""Prompt embeddings: the garment's CLIP image embedding, joined to a text embedding (docs/upstream.md §3)."""

from __future__ import annotations

import torch
from PIL import Image

from ootd.settings import Category, ModelType


def image_embedding(garment: Image.Image, image_processor, image_encoder) -> torch.Tensor:  # noqa: ANN001
    """CLIP image embedding of the garment, shape [1, 1, D]."""
    param = next(image_encoder.parameters())
    pixels = image_processor(images=garment, return_tensors="pt").pixel_values
    embeds = image_encoder(pixels.to(param.device, param.dtype)).image_embeds
    return embeds.unsqueeze(1)


def text_embedding(words: str, max_length: int, tokenizer, text_encoder) -> torch.Tensor:  # noqa: ANN001
    ids = tokenizer(
        [words], max_length=max_length, padding="max_length", truncation=True, return_tensors="pt"
    ).input_ids
    param = next(text_encoder.parameters())
    return text_encoder(ids.to(param.device))[0]


def prompt_embeddings(
    garment: Image.Image, category: Category, model_type: ModelType,
    tokenizer, text_encoder, image_processor, image_encoder,  # noqa: ANN001
) -> torch.Tensor:
    """hd: an empty caption of 2 tokens whose 2nd position becomes the image embedding -> [1, 2, D].
    dc: the category word in 3 tokens, then the image embedding -> [1, 4, D]."""
    image = image_embedding(garment, image_processor, image_encoder)
    if model_type is ModelType.HD:
        text = text_embedding("", 2, tokenizer, text_encoder).clone()
        text[:, 1:] = image.to(text.dtype)
        return text
    text = text_embedding(category.prompt_word, 3, tokenizer, text_encoder)
    return torch.cat([text, image.to(text.dtype)], dim=1)
