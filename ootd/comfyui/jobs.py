"""The nodes' work in ootd's own terms (pictures in, pictures out): the try-on job of `ootd run`, the mask of `ootd
mask`, the category of `--category auto`, each on the loader's shared models, with nothing written to disk
(ComfyUI's SaveImage does that) and what ran reported as text.

    config = handle.run_config(...)                  # the node's settings, checked (ootd/comfyui/backend.py)
    job = prepare_job(config, inputs, ..., writes=False)   # every check of `ootd run` but the output files'
    outcome = job.run(pipe_for, progress, callback)  # the passes; Cancel raises at the next step
    pictures = outcome.pictures()                    # in memory, at the working or the photo's size
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PIL import Image

from ootd.comfyui.backend import ModelHandle, mask_keywords, tryon_keywords
from ootd.comfyui.report import describe_run

if TYPE_CHECKING:
    from ootd.comfyui.host import Steps

logger = logging.getLogger("ootd.comfyui")


@dataclass(frozen=True)
class Garment:
    """One garment as the node got it: the picture, the category word (`auto` too), the mask (None: made from
    pose and parsing) and the input names messages use."""

    image: Image.Image
    category: str
    mask: Image.Image | None = None
    name: str = "garment"
    mask_name: str = "mask"


@dataclass(frozen=True)
class TryOnPictures:
    pictures: list[Image.Image]  # one per sample
    masks: list[Image.Image]  # each garment's, in the person photo's frame and size, in the order given
    report: str


def try_on(handle: ModelHandle, person: Image.Image, garments: list[Garment], settings: dict[str, Any],
           steps: Steps) -> TryOnPictures:
    """One try-on (a garment, or an outfit of two) as `ootd run` makes it with the same settings and seed."""
    from ootd.app.tryon.autocategory import resolve_inputs
    from ootd.app.tryon.inputs import GarmentInput, JobInputs
    from ootd.app.tryon.masking import mask_in_person_frame
    from ootd.app.tryon.preflight import prepare_job
    from ootd.settings import parse_category_word

    started = time.perf_counter()
    config = handle.run_config(**tryon_keywords(settings))
    models = handle.models
    inputs = JobInputs.of(person, [GarmentInput(g.image, parse_category_word(g.category), g.mask, g.name,
                                                g.mask_name if g.mask is not None else None) for g in garments],
                          person_name="person")
    reset_peak_memory(config.device)
    timings: dict[str, Any] = {}
    if not all(garment.resolved for garment in inputs.garments):
        t = time.perf_counter()
        models.classifier()  # loaded once, and counted among ComfyUI's models
        inputs = resolve_inputs(inputs, config.checkpoints, config.category_margin)
        timings["classify"] = time.perf_counter() - t
    t = time.perf_counter()
    job = prepare_job(config, inputs, models.preprocessor_loader(), progress=steps.progress, writes=False)
    if job.parses:
        timings["pose_parsing"] = time.perf_counter() - t
    pipes = Pipes(models, config, steps, timings)
    outcome = job.run(pipes, progress=steps.progress, callback=steps.step)
    timings.update(outcome.timings())
    pictures, _ = outcome.pictures()
    kept = [picture.copy() for picture in pictures]  # photo-size pictures are made (and closed) one at a time
    masks = [mask_in_person_frame(mask, person.size, config.fit) for _, mask in outcome.garment_masks()]
    timings["total"] = time.perf_counter() - started
    report = describe_run(outcome, timings, pipes.loaded, sorted(models.held), pipes.last)
    logger.info("%s", report)
    return TryOnPictures(kept, masks, report)


class Pipes:
    """A job's `pipe_for`: each pipeline from the shared models; the ones loaded for this prompt are noted, and the
    seconds spent getting them (`load`)."""

    def __init__(self, models: Any, config: Any, steps: Steps, timings: dict[str, Any]) -> None:
        self.models, self.config, self.steps, self.timings = models, config, steps, timings
        self.loaded: list[str] = []
        self.last: Any = None

    def __call__(self, model_type: Any) -> Any:
        fresh = model_type.value not in self.models.held
        t = time.perf_counter()
        self.last = self.models.pipeline(model_type, self.config, progress=self.steps.progress if fresh else None)
        if fresh:
            self.loaded.append(model_type.value)
        # the seconds spent getting the models: the loads, or next to nothing when they were kept
        self.timings["load"] = self.timings.get("load", 0.0) + time.perf_counter() - t
        return self.last


def reset_peak_memory(device: str | None) -> None:
    """The GPU's peak from here on (the performance text's), not since ComfyUI started."""
    import torch

    if device and device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(torch.device(device))


@dataclass(frozen=True)
class MaskPictures:
    mask: Image.Image  # in the person photo's frame and size: what the try-on's mask input takes
    preview: Image.Image  # masked person | pose | parsing, side by side


def mask_of(handle: ModelHandle, person: Image.Image, category: str, settings: dict[str, Any]) -> MaskPictures:
    """The mask a try-on with these settings would make (`ootd mask`), and what explains it."""
    from ootd.app.tryon.masking import mask_in_person_frame
    from ootd.app.tryon.preflight import prepare_mask_job
    from ootd.imaging.contact_sheet import contact_sheet
    from ootd.settings import Category

    config = handle.run_config(**mask_keywords(settings))
    job = prepare_mask_job(config, person, Category.parse(category), label="person", writes=False)
    outcome = job.run(handle.models.preprocessor_loader().preprocessor())
    assert outcome.working_mask is not None
    mask = mask_in_person_frame(outcome.working_mask, person.size, config.fit)
    preview = contact_sheet([outcome.images[kind] for kind in ("masked_person", "pose", "parsing")])
    return MaskPictures(mask, preview)


def category_of(handle: ModelHandle, garment: Image.Image, margin: float) -> tuple[str, str]:
    """`auto`'s category of a garment (refused under the margin, as `auto` refuses it) and every category's
    probability as one line."""
    from ootd.app.tryon.autocategory import category_words, check_margin
    from ootd.settings import check_category_margin

    margin = check_category_margin(margin)
    found = handle.models.classifier().classify(garment)
    check_margin(found, margin, "garment")
    shown = ", ".join(f"{category.value} {p:.2f}" for category, p in found.ranked)
    return found.category.value, f"{category_words(found.category, found.probability)}: {shown}"
