"""One pass of a job: one garment tried on, on the person photo or on each result of the pass before, with its
own model and seed (the job, ootd/app/tryon/job.py, plans its passes and runs them in order).

An outfit is two passes. The lower garment goes first, with the dc model (the only one that dresses legs); the
upper garment is then tried on each result of the first pass, with the model its category asks for (hd, or dc with
`--model-type dc`). Pose and parsing run once, on the original photo: both masks come from that one parse
(ootd/preprocessing.py `ParseOnce`), or from the user's mask per garment. Each pass has its own seed derived from
the run's seed (`pass_seed`), so every pass can be rerun by hand with `ootd run` (pass 2: `--model` the first
pass's result, `--mask` its mask): the PNG record names every pass.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.inputs import GarmentInput, JobInputs
from ootd.app.tryon.masking import check_mask_input, no_person_error
from ootd.app.tryon.outcome import InputCache, TryOnOutcome
from ootd.app.tryon.outputs import describe_pipeline
from ootd.app.tryon.record import AUTO_MASK
from ootd.app.tryon.request import TryOnRequest
from ootd.errors import NoPersonError, UsageError
from ootd.pipeline_types import Progress
from ootd.preprocessing import PersonMask
from ootd.settings import Category, ModelType

if TYPE_CHECKING:
    from ootd.pipeline import TryOnPipeline


@dataclass(frozen=True)
class Pass:
    """One garment's try-on within a job. `on_results`: tried on each result of the pass before (one sample each,
    its own seed) instead of on the photo. `mask`: the mask this pass uses instead of its garment's, made from the
    job's one parse (in the photo's framing); `person_mask`: the photo's automatic mask, made during the checks."""

    name: str  # "" for one garment; an outfit's passes: PASS_NAMES
    garment: GarmentInput
    model_type: ModelType
    config: RunConfig
    on_results: bool = False
    mask: Any = None
    person_mask: PersonMask | None = None

    @property
    def made_mask(self) -> bool:
        """Whether this pass's mask comes from pose and parsing (not the user's)."""
        return self.garment.mask is None

    @property
    def prefix(self) -> str:
        """What this pass's pictures are named with in a job of several passes (`lower_mask.png`)."""
        return f"{self.name}_" if self.name else ""

    def request(self, inputs: JobInputs) -> TryOnRequest:
        """The try-on of this pass on the photo."""
        return inputs.request(self.garment)

    def request_on(self, image: Any, inputs: JobInputs) -> TryOnRequest:
        """The try-on of this pass on a result of the pass before, named after the photo."""
        garment = self.garment
        mask = self.mask if self.mask is not None else garment.mask
        return TryOnRequest(image, garment.image, garment.category, mask,
                            person_name=inputs.person_label(), garment_name=garment.label(),
                            mask_name=garment.mask_name if garment.mask is not None else AUTO_MASK,
                            category_p=garment.category_p)

    def config_for(self, sample: int) -> RunConfig:
        """The config of the try-on on result `sample` of the pass before: one sample, its own seed, the mask
        growth of a mask made from the parse already applied, no pictures of its own."""
        config = self.config
        seed = pass_seed(config.sampling.seed, f"{self.name} {sample}")
        sampling = replace(config.sampling, num_samples=1, seed=seed)
        grow = config.mask_grow if self.mask is None else 0
        return replace(config, model_type=self.model_type, sampling=sampling, mask_grow=grow,
                       save_intermediates=False, grid=False)


PASS_NAMES = ("lower", "upper")  # an outfit's passes in the order they run


def order_outfit(garments: Sequence[GarmentInput]) -> tuple[GarmentInput, GarmentInput]:
    """(lower, upper); a dress with a second garment, or two garments of one category, is refused."""
    if len(garments) != 2:
        raise UsageError(f"an outfit is two garments, got {len(garments)}")
    dress = next((g for g in garments if g.category is Category.DRESS), None)
    if dress is not None:
        raise UsageError.about("garment", "{dress} is a dress, a whole outfit: try it on alone (one {@garment}), or "
                               "pair an upper with a lower garment", dress=dress.label())
    if {g.category for g in garments} != {Category.LOWER, Category.UPPER}:
        raise UsageError(f"an outfit is one upper and one lower garment; {garments[0].label()} and "
                         f"{garments[1].label()} are both {Category.parse(garments[0].category).value}")
    lower, upper = sorted(garments, key=lambda g: g.category is Category.UPPER)
    return lower, upper


def pass_seed(seed: int, name: str) -> int:
    """The seed of one pass (`lower`, `upper 0`, `upper 1`, ...) derived from the run's seed: stable across
    versions and machines, and different per pass."""
    digest = hashlib.sha256(f"ootd outfit {seed} {name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 2**63


def _cached(cache: InputCache | None, key: tuple | None, compute: Callable[[], Any]) -> tuple[Any, bool]:
    if cache is None or key is None:
        return compute(), True
    return cache.get(key, compute)


def run_pass(pipe: TryOnPipeline, request: TryOnRequest, config: RunConfig, progress: Progress | None = None,
             callback: Callable[..., Any] | None = None, *, persons: InputCache | None = None,
             garments: InputCache | None = None, person_mask: PersonMask | None = None,
             photo_pixels: int = 0) -> TryOnOutcome:
    """One try-on on a loaded pipeline: prepare the person (no person found: its error, naming the file), prepare
    the garment, generate. `persons`/`garments` let a batch reuse prepared inputs; `person_mask`: the person's mask
    made before the pipeline loaded, encoded as it is; `callback` goes to the pipeline's per-step hook."""
    tick = progress or (lambda stage, done, total: None)
    category = request.category
    model_type = config.model_type_for(category)
    resolution = config.sampling.resolution

    def prepare_person() -> Any:
        tick("person", 0, 1)
        if person_mask is not None:
            prepared = pipe.encode_person(person_mask)
        else:
            check_mask_input(request, fit=config.fit)
            mask = request.pipeline_input("mask") if request.mask is not None else None
            try:
                prepared = pipe.prepare_person(request.pipeline_input("person"), category, mask=mask,
                                               resolution=resolution, fit=config.fit, mask_grow=config.mask_grow)
            except NoPersonError:
                raise no_person_error(request.label("person")) from None
        tick("person", 1, 1)
        return prepared

    def prepare_garment() -> Any:
        tick("garment", 0, 1)
        prepared = pipe.prepare_garment(request.pipeline_input("garment"), category, resolution=resolution,
                                        fit=config.fit, guidance=config.sampling.guidance)
        tick("garment", 1, 1)
        return prepared

    person_key = request.key("person"), request.key("mask")
    person, person_new = _cached(persons, None if None in person_key else (model_type, category, *person_key),
                                 prepare_person)
    garment_key = request.key("garment")
    garment, garment_new = _cached(garments, None if garment_key is None else
                                   (model_type, category, garment_key, config.sampling.guidance), prepare_garment)
    extra = {"callback": callback} if callback is not None else {}
    if photo_pixels:  # the results are then brought back to the photo: the memory plan counts that
        extra["photo_pixels"] = photo_pixels

    def staged(stage: str, done: int, total: int) -> None:  # the decode starts when the last step ends
        tick(stage, done, total)
        if stage == "denoise" and done == total:
            tick("decode", 0, config.sampling.num_samples)

    result = pipe.generate(person, garment, config.sampling, progress=staged if progress else None,
                           modes=config.speed, **extra)
    ran = result.ran if result.ran is not None else describe_pipeline(pipe, config)  # a stand-in's: its attributes
    return TryOnOutcome(request, model_type, result, ran, {"person": not person_new, "garment": not garment_new},
                        config, getattr(person, "parse", None))
