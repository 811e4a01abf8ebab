"""An outfit: two garments on one person in one run, as two try-ons one after the other.

    job = prepare_outfit(config, person, [top, trousers], loader)   # every check, both masks; nothing heavy
    outcome = job.run(loader)                                        # lower (dc), then upper on that result
    images, intermediates = job.save(outcome)

Pose and parsing run once, on the original photo, and both garments' masks come from that one parse (or from
the user's mask per garment). The lower garment goes first, with the dc model (the only one that dresses legs);
the upper garment is then tried on each result of the first pass, with the model its category asks for (hd, or
dc with `--model-type dc`: then one model serves both passes; otherwise the loader swaps models between the
passes, holding one at a time). A dress is a whole outfit and is refused with a second garment. Each pass has
its own seed derived from the run's seed (`pass_seed`), so every pass can be rerun by hand with `ootd run`
(pass 2: `--model` the first pass's result, `--mask` its mask): the PNG record names both passes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ootd.app.tryon.budget import check_memory_budget
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.job import run_tryon
from ootd.app.tryon.loader import PipelineLoader, check_checkpoints_present
from ootd.app.tryon.masking import check_mask_input, no_person_error
from ootd.app.tryon.outcome import TryOnOutcome
from ootd.app.tryon.outputs import INTERMEDIATES, Targets, name_fields, prepare_output_dir, refuse_existing
from ootd.app.tryon.provenance import png_record
from ootd.app.tryon.request import TryOnRequest
from ootd.app.tryon.safety import check_outputs
from ootd.app.tryon.tempfiles import clean_stale_temps
from ootd.errors import NoPersonError, UsageError
from ootd.imaging.atomic import save_png_atomic
from ootd.imaging.files import sanitise_stem
from ootd.imaging.framing import restore_framing
from ootd.pipeline_types import Progress
from ootd.preprocessing import PersonMask, mask_person
from ootd.settings import Category, ModelType, default_model_type

PASSES = ("lower", "upper")  # the order of the passes, and the prefix of each one's record keys and pictures
PASS_RECORD = ("garment", "category", "category_p", "model_type", "seed", "mask")  # recorded per pass


@dataclass(frozen=True)
class Garment:
    """One garment of an outfit: its image (path, PIL image or bytes), category and optional user mask."""

    source: Any
    category: Category
    mask: Any = None
    category_p: float | None = None  # classified by `--category auto`
    name: str | None = None
    mask_name: str | None = None


def order_outfit(garments: Sequence[Garment]) -> tuple[Garment, Garment]:
    """(lower, upper); a dress with a second garment, or two garments of one category, is refused."""
    if len(garments) != 2:
        raise UsageError(f"an outfit is two garments, got {len(garments)}")

    def named(garment: Garment) -> str:
        return garment.name or (str(garment.source) if isinstance(garment.source, str | Path) else "a garment")

    dress = next((g for g in garments if g.category is Category.DRESS), None)
    if dress is not None:
        raise UsageError(f"{named(dress)} is a dress, a whole outfit: try it on alone (one --cloth), or pair an "
                         f"upper with a lower garment")
    if {g.category for g in garments} != {Category.LOWER, Category.UPPER}:
        raise UsageError(f"an outfit is one upper and one lower garment; {named(garments[0])} and "
                         f"{named(garments[1])} are both {garments[0].category.value}")
    lower, upper = sorted(garments, key=lambda g: g.category is Category.UPPER)
    return lower, upper


def pass_seed(seed: int, name: str) -> int:
    """The seed of one pass (`lower`, `upper 0`, `upper 1`, ...) derived from the run's seed: stable across
    versions and machines, and different per pass."""
    digest = hashlib.sha256(f"ootd outfit {seed} {name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 2**63


class ParseOnce:
    """A Preprocessor that parses a photo once however many masks are made from it (both garments' masks)."""

    def __init__(self, preprocessor: Any) -> None:
        self.preprocessor = preprocessor
        self.parses = 0
        self._last: tuple[bytes, Any] | None = None

    def __call__(self, person: Any, category: Category, model_type: ModelType, grow: int = 0) -> Any:
        key = person.convert("RGB").tobytes()
        if self._last is None or self._last[0] != key:
            self._last = (key, self.preprocessor.parse(person))
            self.parses += 1
        return self.preprocessor.mask_from(*self._last[1], category, model_type, grow)


@dataclass
class OutfitOutcome:
    """Both passes: the first's outcome (every sample) and the second's, one per first-pass sample."""

    first: TryOnOutcome
    second: list[TryOnOutcome]
    configs: list[RunConfig]  # the second pass's config per sample

    def timings(self) -> dict[str, float]:
        """Seconds per stage, both passes added up."""
        total: dict[str, float] = {}
        for outcome in (self.first, *self.second):
            for key, value in outcome.timings().items():
                if isinstance(value, float):
                    total[key] = total.get(key, 0.0) + value
        return total


@dataclass(frozen=True)
class OutfitJob:
    """A checked outfit: the first pass's request and config, the second's garment, model and mask."""

    config: RunConfig
    first: TryOnRequest  # the lower garment on the photo
    first_config: RunConfig
    upper: Garment
    upper_model: ModelType
    upper_mask: Any  # the upper garment's mask in the photo's framing (the user's, or from the one parse)
    upper_grow: int  # mask growth of the second pass (0 when its mask came from the parse, already grown)
    targets: Targets
    person_mask: PersonMask | None = None  # the first pass's mask from the parse
    parses: int = 0  # pose + parsing runs for the automatic masks (one, or none with the user's masks)

    def second_request(self, person: Any) -> TryOnRequest:
        """The second pass's request on a first-pass result (named after the original photo)."""
        return TryOnRequest(person, self.upper.source, Category.UPPER, self.upper_mask,
                            person_name=self.first.label("person"), garment_name=self.upper.name,
                            mask_name=self.upper.mask_name if self.upper.mask is not None else "auto",
                            category_p=self.upper.category_p)

    def second_config(self, sample: int) -> RunConfig:
        sampling = replace(self.config.sampling, num_samples=1,
                           seed=pass_seed(self.config.sampling.seed, f"upper {sample}"))
        return replace(self.config, model_type=self.upper_model, sampling=sampling, mask_grow=self.upper_grow,
                       save_intermediates=False, grid=False)

    def run(self, pipe_for: Callable[[ModelType], Any], progress: Progress | None = None,
            callback: Callable[..., Any] | None = None) -> OutfitOutcome:
        """The lower pass on the photo, then the upper pass on each of its results; `pipe_for(model_type)` gives
        each pass its pipeline (a PipelineLoader's `get`: one model held at a time)."""
        first = run_tryon(pipe_for(ModelType.DC), self.first, self.first_config, progress, callback,
                          person_mask=self.person_mask)
        pipe = pipe_for(self.upper_model)
        seconds, configs = [], []
        for sample, image in enumerate(first.result.images):
            config = self.second_config(sample)
            request = check_mask_input(self.second_request(image), fit=config.fit)
            seconds.append(run_tryon(pipe, request, config, progress, callback))
            configs.append(config)
        return OutfitOutcome(first, seconds, configs)

    def record(self, outcome: OutfitOutcome, sample: int | None) -> dict[str, str]:
        """The second pass's record (the final picture's settings) with both passes' `lower_*`/`upper_*` keys."""
        index = sample or 0
        second, config = outcome.second[index], outcome.configs[index]
        record = png_record(second, config, sample=sample)
        for name, outcome_, config_ in (("lower", outcome.first, self.first_config), ("upper", second, config)):
            own = png_record(outcome_, config_)
            own["category_p"] = own.get("category_p", "given")
            record.update({f"{name}_{key}": own.get(key, "") for key in PASS_RECORD})
        record["outfit"] = "lower+upper"
        return record

    def save(self, outcome: OutfitOutcome) -> tuple[list[Path], dict[str, Path]]:
        """The final pictures and (--save-intermediates) both passes' pictures, atomically, each recorded."""
        overwrite = self.config.overwrite
        for sample, (second, path) in enumerate(zip(outcome.second, self.targets.images, strict=True)):
            save_png_atomic(second.result.images[0], path, self.record(outcome, sample), overwrite=overwrite)
        written: dict[str, Path] = {}
        pictures = self._intermediates(outcome)
        for kind, path in self.targets.intermediates.items():
            if kind in pictures:
                save_png_atomic(pictures[kind], path, self.record(outcome, None), overwrite=overwrite)
                written[kind] = path
        return list(self.targets.images), written

    @staticmethod
    def _intermediates(outcome: OutfitOutcome) -> dict[str, Any]:
        pictures = {f"lower_{k}": v for k, v in (outcome.first.result.intermediates or {}).items()}
        pictures.update({f"lower_result_{i}": image for i, image in enumerate(outcome.first.result.images)})
        pictures.update({f"upper_{k}": v for k, v in (outcome.second[0].result.intermediates or {}).items()})
        return pictures


def upper_model_for(config: RunConfig) -> ModelType:
    """The second pass's model: `--model-type` when given (hd is for the top; the lower pass is always dc),
    else the upper garment's default."""
    return config.model_type or default_model_type(Category.UPPER)


def outfit_targets(config: RunConfig, first: TryOnRequest, upper: Garment, upper_model: ModelType) -> Targets:
    """The final pictures, named by the template with garment `<upper>-with-<lower>`, and the intermediates' names."""
    upper_name = upper.name or (str(upper.source) if isinstance(upper.source, str | Path) else "garment")
    stems = [sanitise_stem(Path(name).stem) for name in (upper_name, first.name("garment"))]
    fields = {**name_fields(replace(first, category=Category.UPPER), replace(config, model_type=upper_model)),
              "garment": "-with-".join(stems)}
    base = Targets([], folder=config.output, fields=fields, template=config.name_template)
    kinds: list[str] = []
    if config.save_intermediates:
        first_kinds = INTERMEDIATES if first.mask is None else ("mask", "masked_person")
        kinds = [f"lower_{k}" for k in first_kinds]
        kinds += [f"lower_result_{i}" for i in range(config.sampling.num_samples)]
        kinds += ["upper_mask", "upper_masked_person"]
    return Targets([base.path(i) for i in range(config.sampling.num_samples)], {k: base.path(k) for k in kinds},
                   None, base.folder, base.fields, base.template)


def prepare_outfit(config: RunConfig, person: Any, garments: Sequence[Garment], loader: PipelineLoader, *,
                   person_name: str | None = None, protect: Iterable[Path | None] = ()) -> OutfitJob:
    """Every pre-flight check of an outfit, in the order of a single try-on (ootd/app/tryon/job.py), and both
    masks: the users', or both from one pose + parsing of the photo."""
    if config.grid:
        raise UsageError("--grid shows one garment's try-on; an outfit has two passes: leave --grid out")
    lower, upper = order_outfit(garments)  # 1
    upper_model = upper_model_for(config)
    first_config = replace(config, model_type=ModelType.DC,
                           sampling=replace(config.sampling, seed=pass_seed(config.sampling.seed, "lower")))
    first = TryOnRequest(person, lower.source, Category.LOWER, lower.mask, person_name=person_name,
                         garment_name=lower.name, mask_name=lower.mask_name, category_p=lower.category_p)
    second = TryOnRequest(person, upper.source, Category.UPPER, upper.mask, person_name=person_name,
                          garment_name=upper.name, mask_name=upper.mask_name)
    inputs = [*first.paths(), *second.paths(), *protect]
    first = check_mask_input(first.decoded(), raw_mask=first.source("mask"), fit=config.fit)  # 2
    second = check_mask_input(second.decoded(), raw_mask=second.source("mask"), fit=config.fit)
    upper = replace(upper, source=second.garment, name=second.label("garment"), mask=second.mask,
                    mask_name=second.label("mask") if second.mask is not None else None)
    automatic = first.mask is None or second.mask is None
    check_checkpoints_present(config.checkpoints, [ModelType.DC, upper_model], need_preprocess=automatic)  # 3
    prepare_output_dir(config.output)  # 4
    clean_stale_temps(config.output)
    targets = outfit_targets(config, first, upper, upper_model)
    check_outputs(targets.all(), inputs, overwrite=config.overwrite)  # 5
    if not config.overwrite:
        refuse_existing(targets.all())
    check_memory_budget(config, [ModelType.DC, upper_model])  # 6
    job = OutfitJob(config, first, first_config, upper, upper_model, second.mask, config.mask_grow, targets)
    if not automatic:
        return job
    parse = ParseOnce(loader.preprocessor())  # 7: one parse, both masks
    photo = first.pipeline_input("person")
    sampling = config.sampling
    try:
        first_mask = None
        if first.mask is None:
            first_mask = mask_person(photo, Category.LOWER, ModelType.DC, sampling.resolution, config.fit,
                                     config.mask_grow, preprocessor=parse)
        upper_mask, grow = second.mask, config.mask_grow
        if upper_mask is None:
            made = mask_person(photo, Category.UPPER, upper_model, sampling.resolution, config.fit,
                               config.mask_grow, preprocessor=parse)
            upper_mask, grow = restore_framing(made.mask, made.fit, keep_scale=True), 0
    except NoPersonError:
        raise no_person_error(first.label("person")) from None
    return replace(job, upper_mask=upper_mask, upper_grow=grow, person_mask=first_mask, parses=parse.parses)
