"""`--category auto`: the garment's category from the checkpoints' CLIP model (ootd/method/classify.py), resolved
to a real Category before a job is planned, so nothing past this point ever sees the word `auto`.

The classifier comes from the model owner (`Models.classifier`, ootd/models/): loaded only when a request asks
for `auto`, once, on the CPU in fp32; its cost is one ViT-L/14 image embedding per garment (docs/benchmarks.md). A
command's owner drops it when the try-on's pipeline loads; a server's keeps it. A garment whose likeliest category
is not ahead of the second by `RunConfig.category_margin` is refused with one line naming both and `--category`
as the way out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.app.tryon.inputs import JobInputs
from ootd.errors import CheckpointError, OotdError, UsageError
from ootd.imaging.files import decode_image, load_image
from ootd.settings import Category

if TYPE_CHECKING:
    from ootd.method.classify import Classification, GarmentClassifier
    from ootd.models import Models

CATEGORY_SOURCE_AUTO = "auto"


def check_margin(classification: Any, margin: float, label: str) -> None:
    """Refuse a classification whose likeliest category is not ahead of the second by `margin`."""
    if classification.margin >= margin:
        return
    (first, p1), (second, p2) = classification.ranked[:2]
    others = " or ".join(c.value for c in Category if c not in (first, second))
    raise UsageError.about(
        "category", "cannot tell the category of {label}: {first} {p1:.2f} or {second} {p2:.2f} (ahead by "
        "{lead:.2f}, under the margin {margin:.2f}); give it with {@category} {first}, {second} or {others}",
        value="auto", label=label, first=first.value, second=second.value, p1=p1, p2=p2,
        lead=classification.margin, margin=margin, others=others)


def classify_image(garment: Any, label: str, classifier: GarmentClassifier, margin: float) -> Classification:
    """The Classification of one garment (a path, PIL image or encoded bytes), refused under the margin."""
    if isinstance(garment, bytes | bytearray):
        garment = decode_image(bytes(garment), "garment", label)
    image = load_image(garment, "garment") if isinstance(garment, str | Path) else garment
    classification = classifier.classify(image)
    check_margin(classification, margin, label)
    return classification


Classified = dict[Any, "tuple[Category, float] | OotdError"]  # a garment's key -> its category, or why not


def resolve_inputs(inputs: JobInputs, models: Models, margin: float, known: Classified | None = None
                   ) -> JobInputs:
    """The inputs with every `auto` garment classified by the owner's classifier (refused under the margin: that
    garment's UsageError, or its image's error): what every front end calls before a job is planned. `known`:
    garments already classified (a batch classifies each of its garment files once), filled as garments are
    classified."""
    if all(garment.resolved for garment in inputs.garments):
        return inputs
    garments = []
    for garment in inputs.garments:
        if garment.resolved:
            garments.append(garment)
            continue
        key = str(garment.image) if isinstance(garment.image, str | Path) else None
        found = known.get(key) if known is not None and key is not None else None
        if found is None:
            try:
                classification = classify_image(garment.image, garment.label(), models.classifier(), margin)
                found = (classification.category, classification.probability)
            except CheckpointError:
                raise
            except OotdError as exc:
                found = exc
            if known is not None and key is not None:
                known[key] = found
        if isinstance(found, OotdError):  # raised again for each of its rows: a fresh traceback each time, or
            raise found.with_traceback(None)  # every raise would chain onto the last, frames and all (O(rows))
        garments.append(replace(garment, category=found[0], category_p=found[1]))
    return inputs.with_garments(garments)


def category_words(category: Category, probability: float | None) -> str:
    """How summaries show a category: `dress (auto, p 0.87)` or `upper`."""
    return category.value if probability is None else f"{category.value} (auto, p {probability:.2f})"


@dataclass(frozen=True)
class Review:
    """One garment of a reviewed folder: its classification, whether `auto` would refuse it, or why it failed."""

    path: Path
    classification: Any = None
    refused: bool = False
    error: str | None = None

    def json(self) -> dict[str, Any]:
        found = self.classification
        return {"garment": str(self.path), "category": found.category.value if found else None,
                "category_p": found.probability if found else None,
                "probabilities": {c.value: p for c, p in found.ranked} if found else None,
                "refused": self.refused, "error": self.error}


def review_garments(paths: list[Path], models: Models, margin: float) -> Iterator[Review]:
    """Classify each garment as `auto` would (a bad file is reported and the review goes on): what a team reads
    before spending GPU time on a catalogue (`ootd classify DIR`)."""
    classifier = models.classifier()  # a checkpoint problem stops the review at once
    for path in paths:
        try:
            found = classifier.classify(load_image(path, "garment"))
        except OotdError as exc:
            yield Review(path, error=str(exc))
            continue
        yield Review(path, found, refused=found.margin < margin)
