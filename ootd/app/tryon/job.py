"""One try-on job, as every front end runs it (`ootd run`, `ootd mask`, `run/run_ootd.py`, both batch engines,
the local server and the Ray Serve replicas): one garment or an outfit of two, planned as passes, checked once,
run, saved.

    job = prepare_job(config, inputs, models)       # every check (ootd/app/tryon/preflight.py); nothing heavy
    outcome = job.run(models)                       # the passes, in order, each on its model (ootd/models/)
    images, intermediates = job.save(outcome)       # complete files or none, each with its record

`plan_job` makes the job of some inputs without any I/O: its passes (one garment: one pass on the photo; two: the
lower garment on the photo, then the upper garment on each of its results, ootd/app/tryon/passes.py), the models
they need and the output names. This module is where one garment and an outfit differ; everything else asks the
job (its passes, models and records).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.grid import grid_image
from ootd.app.tryon.inputs import JobInputs
from ootd.app.tryon.masking import check_mask_input, no_person_error
from ootd.app.tryon.outcome import InputCache, TryOnOutcome
from ootd.app.tryon.outputs import INTERMEDIATES, WITH_MASK_INTERMEDIATES, Targets, job_targets, save_pictures
from ootd.app.tryon.passes import PASS_NAMES, Pass, order_outfit, pass_seed, run_pass
from ootd.app.tryon.record import PassRecord, Record, comparable
from ootd.errors import NoPersonError, UsageError
from ootd.imaging.files import image_size, load_photo
from ootd.imaging.framing import frame_of
from ootd.imaging.photo import photo_pictures
from ootd.pipeline_types import Progress, RunInfo, Timings
from ootd.preprocessing import ParseOnce, PhotoParse, frame_like_results, mask_person
from ootd.settings import Category, ModelType, default_model_type

if TYPE_CHECKING:
    from ootd.models import Models

PHOTO_MASK = "photo_mask"  # --keep-unmasked --save-intermediates: the blend weight at the photo's size


def plan_passes(config: RunConfig, inputs: JobInputs) -> tuple[Pass, ...]:
    """The passes of a job: its one decision between one garment and an outfit (a refused combination is a
    UsageError: hd with a lower garment, a dress with a second garment, two garments of one category, --grid with
    an outfit)."""
    garments = inputs.garments
    if len(garments) == 1:
        (garment,) = garments
        return (Pass("", garment, config.model_type_for(garment.category), config),)
    if config.grid:
        raise UsageError.about("grid", "{@grid} shows one garment's try-on; an outfit has two passes: leave "
                               "{@grid} out")
    lower, upper = order_outfit(garments)
    first = replace(config, model_type=ModelType.DC,
                    sampling=replace(config.sampling, seed=pass_seed(config.sampling.seed, PASS_NAMES[0])))
    # the lower pass is always dc (the only model that dresses legs); --model-type chooses the upper pass's model
    upper_model = config.model_type or default_model_type(Category.UPPER)
    return (Pass(PASS_NAMES[0], lower, ModelType.DC, first),
            Pass(PASS_NAMES[1], upper, upper_model, config, on_results=True))


def plan_job(config: RunConfig, inputs: JobInputs) -> TryOnJob:
    """The job of `inputs` (categories resolved), without I/O: its passes and output names."""
    passes = plan_passes(config, inputs)
    kinds: list[str] = []
    if config.save_intermediates:
        for number, one in enumerate(passes):
            made = one.made_mask and not one.on_results
            kinds += [one.prefix + kind for kind in (INTERMEDIATES if made else WITH_MASK_INTERMEDIATES)]
            if number < len(passes) - 1:  # a pass whose results the next one is tried on
                kinds += [f"{one.prefix}result_{i}" for i in range(config.sampling.num_samples)]
        if config.photo.keep_unmasked:
            kinds.append(PHOTO_MASK)
    requests = [one.request(inputs) for one in passes]
    first, last = requests[0], requests[-1]
    targets = job_targets(config, replace(first, category=last.category), passes[-1].model_type,
                          [r.name("garment") for r in reversed(requests)], kinds)
    return TryOnJob(config, inputs, passes, targets)


@dataclass(frozen=True)
class TryOnJob:
    """A planned try-on: its inputs, its passes, its output files; `run` it on loaded pipelines and `save` what
    it gives."""

    config: RunConfig
    inputs: JobInputs
    passes: tuple[Pass, ...]
    targets: Targets
    parses: int = 0  # pose + parsing runs made for its automatic masks (one for every mask of the photo)

    @property
    def model_type(self) -> ModelType:
        """The first pass's model: what a batch orders and loads by."""
        return self.passes[0].model_type

    @property
    def models(self) -> tuple[ModelType, ...]:
        """Every model the passes need, once each, in the order they run."""
        return tuple(dict.fromkeys(one.model_type for one in self.passes))

    def describe_models(self) -> str:
        """`hd`, or an outfit's `dc+hd` (each pass's model)."""
        return "+".join(one.model_type.value for one in self.passes)

    @property
    def made_masks(self) -> bool:
        """Whether any mask is to come from pose and parsing (their files are then needed)."""
        return any(one.made_mask for one in self.passes)

    @property
    def records_run_seed(self) -> bool:
        """Whether the pictures record the run's seed (an outfit's record each pass's own seed)."""
        return len(self.passes) == 1

    def relocated(self, output: Path) -> TryOnJob:
        """The same job writing into another folder (a replica's own): the same passes and names, not planned
        again."""
        passes = tuple(replace(one, config=replace(one.config, output=output)) for one in self.passes)
        return replace(self, config=replace(self.config, output=output), passes=passes,
                       targets=self.targets.moved(output))

    def decoded(self) -> TryOnJob:
        """The job with every image decoded and checked (step 2 of the pre-flight, in the order the passes use
        them); its passes and output names stay (the inputs keep their names), so it is not planned again."""
        inputs = self.inputs.decoded(self.config.fit, [one.garment for one in self.passes])
        if inputs is self.inputs:
            return self
        given = self.inputs.garments
        passes = tuple(replace(one, garment=inputs.garments[given.index(one.garment)]) for one in self.passes)
        return replace(self, inputs=inputs, passes=passes)

    def with_masks(self, preprocessor: Any) -> TryOnJob:
        """Every mask that is not the user's, made now from one pose + parsing of the photo (step 7 of the
        pre-flight; a batch makes them when the pair runs): the photo's own for a pass on the photo, one in the
        photo's framing for a pass on another pass's results. No person found: its one-line error."""
        made = sum(one.made_mask for one in self.passes)
        if not made:
            return self
        parse = ParseOnce(preprocessor) if made > 1 else preprocessor  # one mask: the preprocessor as it is
        photo = self.passes[0].request(self.inputs).pipeline_input("person")
        config, passes = self.config, []
        try:
            for one in self.passes:
                if not one.made_mask:
                    passes.append(one)
                    continue
                made = mask_person(photo, one.garment.category, one.model_type, config.sampling.resolution,
                                   config.fit, config.mask_grow, preprocessor=parse)
                if one.on_results:
                    passes.append(replace(one, mask=frame_like_results({"mask": made.mask}, made.fit)["mask"]))
                else:
                    passes.append(replace(one, person_mask=made))
        except NoPersonError:
            raise no_person_error(self.inputs.person_label()) from None
        return replace(self, passes=tuple(passes), parses=getattr(parse, "parses", 1))

    def run(self, models: Models, progress: Progress | None = None, callback: Callable[..., Any] | None = None,
            *, persons: InputCache | None = None, garments: InputCache | None = None) -> JobOutcome:
        """Every pass in order, each on its pipeline from the model owner (`models.pipeline`: it decides what
        stays loaded; `progress` hears a load). `persons`/`garments`: a batch's caches of prepared inputs, for the
        passes on the photo. Pose + parsing, for masks a later pass needs and the checks did not make (a batch),
        come from the owner too."""
        from ootd.app.console import quiet_libraries

        job = self
        if any(one.on_results and one.made_mask and one.mask is None for one in self.passes):
            # a mask for another pass's results comes from the photo's one parse: made now (steps 2 and 7)
            job = self.decoded().with_masks(models.preprocessor())
        done: list[list[TryOnOutcome]] = []
        pixels = job.photo_pixels()
        for number, one in enumerate(job.passes):
            pipe = models.pipeline(one.model_type, one.config.lora, progress=progress)
            quiet_libraries()  # importing the libraries to load a pipeline may have reset their loggers' levels
            last = pixels if number == len(job.passes) - 1 else 0
            if not one.on_results:
                done.append([run_pass(pipe, one.request(job.inputs), one.config, progress, callback, persons=persons,
                                      garments=garments, person_mask=one.person_mask, photo_pixels=last)])
                continue
            outcomes = []
            for sample, image in enumerate(done[-1][0].result.images):
                config = one.config_for(sample)
                request = check_mask_input(one.request_on(image, job.inputs), fit=config.fit)
                outcomes.append(run_pass(pipe, request, config, progress, callback, photo_pixels=last))
            done.append(outcomes)
        return JobOutcome(job, done)

    def save(self, outcome: JobOutcome, keep_existing: bool = False) -> tuple[list[Path], dict[str, Path]]:
        """Every picture of the job, written atomically with its record (`keep_existing`: a resumed batch leaves
        the files it already has)."""
        grid = grid_image(outcome.final[0]) if self.targets.grid is not None else None
        images, intermediates = outcome.pictures()
        return save_pictures(self.targets, images, outcome.record, intermediates, grid,
                             overwrite=self.config.overwrite, keep_existing=keep_existing)

    def photo_pixels(self) -> int:
        """The person photo's pixels when the pictures are brought back to it (--keep-unmasked, --output-size
        photo), else 0: what the memory plan counts for that work."""
        if not self.config.photo.at_photo_size:
            return 0
        width, height = image_size(self.inputs.person)
        return width * height

    def planned_record(self) -> Record:
        """What its pictures will record of the settings and inputs (before anything runs)."""
        passes = [PassRecord.of(one.request(self.inputs), one.config, one.name) for one in self.passes]
        return Record(passes[-1], tuple(passes) if len(passes) > 1 else (), **self.record_facts())

    def record_facts(self) -> dict[str, Any]:
        """What every record of the job holds besides its passes: the run's seed and the order the garments were
        given (an outfit's passes by name; its passes run lower first whatever the order)."""
        listed = tuple(one.name for garment in self.inputs.garments for one in self.passes
                       if len(self.passes) > 1 and one.garment.category == garment.category)
        return {"run_seed": self.config.sampling.seed, "listed": listed}

    def expected(self) -> dict[str, str]:
        """What its pictures record when they were made with this job's settings (resume)."""
        return self.planned_record().expected(self.config.seed_random)

    @staticmethod
    def comparable(text: dict[str, str]) -> dict[str, str]:
        """A picture's record as `expected` compares it."""
        return comparable(text)


@dataclass
class JobOutcome:
    """A finished job: each pass's outcomes (one on the photo, or one per result of the pass before)."""

    job: TryOnJob
    passes: list[list[TryOnOutcome]]

    @property
    def final(self) -> list[TryOnOutcome]:
        """The outcomes that made the pictures (the last pass's)."""
        return self.passes[-1]

    @property
    def images(self) -> list[Any]:
        return [image for outcome in self.final for image in outcome.result.images]

    @property
    def ran(self) -> RunInfo:
        """How the last pass ran (device, precision, attention, the memory plan)."""
        return self.final[0].ran

    @property
    def parse(self) -> PhotoParse | None:
        """The pose + parsing of the photo that the automatic mask of the pass on the photo came from (None: a
        user's mask), which the preservation measure uses instead of parsing the photo again."""
        return self.passes[0][0].parse

    @property
    def reused(self) -> dict[str, bool]:
        """Which prepared inputs of the first pass came from a batch's caches."""
        return self.passes[0][0].reused

    def _outcome(self, number: int, sample: int | None) -> tuple[TryOnOutcome, int | None]:
        """The outcome of pass `number` behind picture `sample` (None: the first), and the sample within it."""
        outcomes = self.passes[number]
        if len(outcomes) > 1 or self.job.passes[number].on_results:
            return outcomes[sample or 0], None if sample is None else 0
        return outcomes[0], sample

    def record(self, sample: int | None) -> Record:
        """The record of picture `sample` (None: of the job's other pictures: masks, intermediates, grid)."""
        job = self.job
        records = []
        for number, one in enumerate(job.passes):
            outcome, _ = self._outcome(number, sample)
            records.append(PassRecord.of(outcome.request, outcome.config or one.config, one.name))
        outcome, _ = self._outcome(len(job.passes) - 1, sample)
        ran = outcome.ran
        passes = tuple(records) if len(records) > 1 else ()
        return Record(records[-1], passes, sample=sample, **job.record_facts(), device=ran.device,
                      precision=ran.precision, attention=ran.attention,
                      threads=str(ran.threads) if ran.threads is not None else "")

    def describe(self) -> dict[str, Any]:
        """What the job tried on, as its answers report it (`--json`): one garment's inputs, category and
        settings, or an outfit's passes as its pictures record them."""
        job, record = self.job, self.record(0)
        if record.passes:
            return {"person": job.inputs.person_label(), "passes": record.pass_summary(),
                    "pose_parsing_runs": job.parses}
        request = self.final[0].request
        return {"person": request.label("person"), "garment": request.label("garment"),
                "mask": request.label("mask") if request.mask is not None else None,
                "category": request.category.value, "model_type": record.picture.model_type.value,
                "category_source": "auto" if request.category_p is not None else "given",
                "category_p": request.category_p, "settings": record.settings()}

    def garment_masks(self) -> list[tuple[str, Any]]:
        """Each garment's mask as its pass made it (working size), in the order the garments were given, with the
        prefix of its pass's pictures (`lower_`; none for one garment): what a mask editor starts from, however
        many garments the job has."""
        given = self.job.inputs.garments
        made = {given.index(one.garment): (one.prefix, outcomes[0].result.mask)
                for one, outcomes in zip(self.job.passes, self.passes, strict=True)}
        return [made[number] for number in sorted(made)]

    def intermediates(self) -> dict[str, Any]:
        """The pictures besides the results, by kind: each pass's mask and masked person (and pose and parsing
        for a mask made from them), and the results of a pass the next one was tried on."""
        pictures: dict[str, Any] = {}
        for number, (one, outcomes) in enumerate(zip(self.job.passes, self.passes, strict=True)):
            pictures.update({one.prefix + k: v for k, v in (outcomes[0].result.intermediates or {}).items()})
            if number < len(self.passes) - 1:
                pictures.update({f"{one.prefix}result_{i}": image for i, image in enumerate(outcomes[0].result.images)})
        return pictures

    def pictures(self) -> tuple[Sequence[Any], dict[str, Any]]:
        """The pictures to write, and the other pictures by kind: at the working size as the passes made them, or
        brought back to the person photo (ootd/imaging/photo.py `photo_pictures`): the generated picture at the
        photo's size and framing, or the photo with only the region the passes repainted replaced (its blend
        weight: PHOTO_MASK). Those are made one at a time as they are read (`PhotoPictures`: iterating closes each
        picture when the next is asked for), so a job holds one photo-size picture however many samples it has:
        the memory plan's "photo" stage counts one, not one per sample."""
        images, others = self.images, self.intermediates()
        config = self.job.config
        if not config.photo.at_photo_size:
            return images, others
        inputs = self.job.inputs
        photo = load_photo(inputs.photo_source, inputs.person_label())
        info = frame_of(photo.size, config.sampling.resolution.size, config.fit)
        keep = config.photo.keep_unmasked
        repainted = self.repainted(images[0].size) if keep else None
        pictures, weight = photo_pictures(photo, images, info, repainted, keep, config.photo.feather)
        return pictures, others if weight is None else {**others, PHOTO_MASK: weight}

    def repainted(self, size: tuple[int, int]) -> Any:
        """Every pass's mask together, at the pictures' `size`: the region the job repainted."""
        from PIL import Image, ImageChops

        union = None
        for outcomes in self.passes:
            result = outcomes[0].result
            mask = (result.intermediates or {}).get("mask") or result.mask
            mask = mask.convert("L").resize(size, Image.NEAREST)
            union = mask if union is None else ImageChops.lighter(union, mask)
        return union

    def timings(self) -> Timings:
        """Seconds per stage, every pass's added up (stages of inputs reused from an earlier pair left out)."""
        total = Timings()
        for outcomes in self.passes:
            for outcome in outcomes:
                total.extend(outcome.timings())
        return total
