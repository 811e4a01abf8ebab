"""The nodes' work in ootd's own terms (pictures in, pictures out): the try-on job of `ootd run`, the mask of `ootd
mask`, the category of `--category auto`, each on the loader's shared models, with nothing written to disk
(ComfyUI's SaveImage does that) and what ran reported as text.

    config = handle.run_config(...)                  # the node's settings, checked (ootd/comfyui/inputs.py)
    job = check_job(plan_inputs(config, inputs), owner, writes=False)  # `ootd run`'s checks but the files'
    outcome = job.run(owner, progress, callback)     # the passes; Cancel raises at the next step
    pictures = outcome.pictures()                    # in memory, at the working or the photo's size
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PIL import Image

from ootd.app.tryon.settings import CLASSIFY_NODE, MASK_NODE, NODE
from ootd.comfyui.backend import ModelHandle, SharedModels, shown
from ootd.comfyui.inputs import config_words
from ootd.comfyui.report import describe_run
from ootd.pipeline_types import Timings

if TYPE_CHECKING:
    from ootd.app.tryon.config import RunConfig
    from ootd.app.tryon.job import TryOnJob
    from ootd.comfyui.host import Steps

logger = logging.getLogger("ootd.comfyui")
# the way around a photo without a person that the mask node offers (`{@mask}`: the try-on's input)
MASK_REMEDY = ("or paint the mask yourself (white = repaint) in ComfyUI's mask editor and give it to a try-on's "
               "{@mask}")


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
    from ootd.app.tryon.loader import check_checkpoints_present
    from ootd.app.tryon.masking import mask_in_person_frame
    from ootd.app.tryon.preflight import check_job, plan_inputs
    from ootd.settings import parse_category_word

    started = time.perf_counter()
    config = handle.run_config(**config_words(NODE, settings))
    models = handle.models
    inputs = JobInputs.of(person, [GarmentInput(g.image, parse_category_word(g.category), g.mask, g.name,
                                                g.mask_name if g.mask is not None else None) for g in garments],
                          person_name="person")
    reset_peak_memory(config.device)
    timings = Timings()
    if not all(garment.resolved for garment in inputs.garments):
        t = time.perf_counter()
        models.classifier()  # loaded once, and counted among ComfyUI's models
        inputs = resolve_inputs(inputs, models.owner, config.category_margin)
        timings.add("classify", time.perf_counter() - t)
    t = time.perf_counter()
    job = plan_inputs(config, inputs)  # `ootd run`'s checks, steps 1 and 2 (ootd/app/tryon/preflight.py)
    if job.made_masks:  # pose + parsing from the shared models (their files checked first, as step 3 does)
        check_checkpoints_present(config.checkpoints, job.models, need_preprocess=True)
        models.preprocessor()
    job = check_job(job, models.owner, progress=steps.progress, writes=False)  # steps 3 to 7
    if job.parses:
        timings.add("pose_parsing", time.perf_counter() - t)
    loaded = get_pipelines(models, job, config, steps, timings)
    outcome = job.run(models.owner, progress=steps.progress, callback=steps.step)  # each pipeline held: no load
    timings.extend(outcome.timings())
    pictures, _ = outcome.pictures()
    kept = [picture.copy() for picture in pictures]  # photo-size pictures are made (and closed) one at a time
    masks = [mask_in_person_frame(mask, person.size, config.fit) for _, mask in outcome.garment_masks()]
    total = time.perf_counter() - started
    held = [shown(name) for name in sorted(models.held)]
    report = describe_run(outcome, timings, total, loaded, held, models.owner.device)
    logger.info("%s", report)
    return TryOnPictures(kept, masks, report)


def get_pipelines(models: SharedModels, job: TryOnJob, config: RunConfig, steps: Steps, timings: Timings
                  ) -> list[str]:
    """Every pipeline the job's passes run on, from the shared models before the job runs (room made in ComfyUI
    and the host told, for each one loaded now): the ones loaded for this prompt. The seconds spent getting them
    are the `load` stage (next to nothing when they were kept)."""
    loaded: list[str] = []
    t = time.perf_counter()
    for model_type in job.models:
        fresh = model_type.value not in models.held
        models.pipeline(model_type, config, progress=steps.progress if fresh else None)
        if fresh:
            loaded.append(model_type.value)
    timings.add("load", time.perf_counter() - t)
    return loaded


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
    from ootd.app.tryon.masking import PersonNotFound, mask_in_person_frame
    from ootd.app.tryon.preflight import prepare_mask_job
    from ootd.imaging.contact_sheet import contact_sheet
    from ootd.settings import Category

    config = handle.run_config(**config_words(MASK_NODE, settings))
    job = prepare_mask_job(config, person, Category.parse(category), label="person", writes=False)
    try:
        outcome = job.run(handle.models.preprocessor())
    except PersonNotFound as exc:  # the way around it here: the mask editor, then the try-on's mask input
        raise exc.with_remedy(MASK_REMEDY) from None
    assert outcome.working_mask is not None
    mask = mask_in_person_frame(outcome.working_mask, person.size, config.fit)
    preview = contact_sheet([outcome.images[kind] for kind in ("masked_person", "pose", "parsing")])
    return MaskPictures(mask, preview)


def category_of(handle: ModelHandle, garment: Image.Image, settings: dict[str, Any]) -> tuple[str, str]:
    """`auto`'s category of a garment (refused under the margin, as `auto` refuses it) and every category's
    probability as one line."""
    from ootd.app.tryon.autocategory import category_words, check_margin

    margin = handle.run_config(**config_words(CLASSIFY_NODE, settings)).category_margin
    found = handle.models.classifier().classify(garment)
    check_margin(found, margin, "garment")
    shown = ", ".join(f"{category.value} {p:.2f}" for category, p in found.ranked)
    return found.category.value, f"{category_words(found.category, found.probability)}: {shown}"
