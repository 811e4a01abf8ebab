"""Zero-shot garment classification with the CLIP model the conditioning already uses (`--category auto`).

The released `clip-vit-large-patch14` folder is the whole CLIP model; the try-on uses its image tower only. Here
its text tower embeds a few prompts per category (CATEGORY_PROMPTS, the one table of them), each prompt's
embedding is normalised and the prompts are averaged per category (then normalised again: CLIP's prompt
ensembling); the garment's image embedding is compared with each category by cosine similarity, and a softmax
with CLIP's own logit scale turns the similarities into probabilities. The text side depends on nothing but the
table, so it is computed once per process (`CategoryTexts`) and the text tower is then dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from PIL import Image

from ootd.method.conditioning import image_embedding
from ootd.settings import Category

PROMPT_TEMPLATE = "a photo of a {}"
# the garments each category stands for; the prompts are PROMPT_TEMPLATE filled with each word
CATEGORY_WORDS: dict[Category, tuple[str, ...]] = {
    Category.UPPER: ("shirt", "t-shirt", "top", "blouse", "jacket", "sweater"),
    Category.LOWER: ("trousers", "jeans", "shorts", "skirt"),
    Category.DRESS: ("dress", "jumpsuit"),
}
CATEGORY_PROMPTS: dict[Category, tuple[str, ...]] = {
    category: tuple(PROMPT_TEMPLATE.format(word) for word in words) for category, words in CATEGORY_WORDS.items()
}


@dataclass(frozen=True)
class Classification:
    """A garment's category probabilities, likeliest first."""

    ranked: tuple[tuple[Category, float], ...]

    @property
    def category(self) -> Category:
        return self.ranked[0][0]

    @property
    def probability(self) -> float:
        return self.ranked[0][1]

    @property
    def margin(self) -> float:
        """How far the likeliest category is ahead of the second (probabilities)."""
        return self.ranked[0][1] - self.ranked[1][1]

    def words(self) -> str:
        """`dress 0.81, upper 0.12, lower 0.07`."""
        return ", ".join(f"{category.value} {p:.2f}" for category, p in self.ranked)


@dataclass(frozen=True)
class CategoryTexts:
    """The per-category text features ([categories, D], unit length) and CLIP's logit scale (as a factor)."""

    categories: tuple[Category, ...]
    features: torch.Tensor
    scale: float


@torch.inference_mode()
def category_texts(tokenizer, text_model, logit_scale: float,  # noqa: ANN001
                   prompts: dict[Category, tuple[str, ...]] = CATEGORY_PROMPTS) -> CategoryTexts:
    """Embed every prompt with the text tower (a CLIPTextModelWithProjection), normalise, average per category
    and normalise again. `logit_scale` is the checkpoint's stored value (its exp is the softmax factor)."""
    categories = tuple(prompts)
    texts = [prompt for category in categories for prompt in prompts[category]]
    tokens = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    param = next(text_model.parameters())
    embeds = text_model(input_ids=tokens.input_ids.to(param.device),
                        attention_mask=tokens.attention_mask.to(param.device)).text_embeds.float().cpu()
    embeds = embeds / embeds.norm(dim=-1, keepdim=True)
    rows, start = [], 0
    for category in categories:
        count = len(prompts[category])
        mean = embeds[start:start + count].mean(dim=0)
        rows.append(mean / mean.norm())
        start += count
    return CategoryTexts(categories, torch.stack(rows), float(torch.tensor(logit_scale).exp()))


def classify_embedding(image_embeds: torch.Tensor, texts: CategoryTexts) -> Classification:
    """Cosine similarity of one image embedding with each category, softmax at CLIP's scale."""
    image = image_embeds.reshape(-1).float().cpu()
    image = image / image.norm()
    probs = torch.softmax(texts.scale * (texts.features @ image), dim=0)
    ranked = sorted(zip(texts.categories, probs.tolist(), strict=True), key=lambda item: -item[1])
    return Classification(tuple(ranked))


@torch.inference_mode()
def classify_garment(garment: Image.Image, texts: CategoryTexts, image_processor,  # noqa: ANN001
                     image_encoder) -> Classification:  # noqa: ANN001
    """The category probabilities of a garment photo (the image embedding the conditioning uses)."""
    return classify_embedding(image_embedding(garment.convert("RGB"), image_processor, image_encoder), texts)


@dataclass
class GarmentClassifier:
    """What classifying a garment needs: the per-category text features (the text tower itself is dropped once
    they are computed), CLIP's image processor and image tower. The model owner (ootd/models/) loads it."""

    texts: CategoryTexts
    image_processor: object
    image_encoder: torch.nn.Module
    load_seconds: float = 0.0

    def classify(self, garment: Image.Image) -> Classification:
        """The Classification of a garment image."""
        return classify_garment(garment, self.texts, self.image_processor, self.image_encoder)
