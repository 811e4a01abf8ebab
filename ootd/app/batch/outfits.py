"""An outfit row of a batch (`person,top.png;trousers.png,upper;lower`): the outfit job of `ootd run` with two
`--cloth` (ootd/app/tryon/outfit.py), planned without models for the precheck and resume, run by the runner.

Its outputs are named and recorded as `ootd run` names and records them; it is done when all of them exist and
record this run's settings and both passes (garments, categories, models and, unless drawn, the lower pass's
seed), like any other pair.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ootd.app.batch.pairs import Pair
from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.loader import PipelineLoader
from ootd.app.tryon.outfit import (
    Garment,
    OutfitJob,
    OutfitOutcome,
    order_outfit,
    outfit_targets,
    pass_seed,
    prepare_outfit,
    upper_model_for,
)
from ootd.app.tryon.outputs import Targets
from ootd.app.tryon.provenance import PIXEL_SETTINGS, input_record, run_record
from ootd.app.tryon.request import TryOnRequest
from ootd.errors import UsageError
from ootd.pipeline_types import Progress
from ootd.settings import ModelType

# the settings of the final picture that do not belong to one pass (the passes' own are compared per pass)
SHARED_SETTINGS = tuple(k for k in PIXEL_SETTINGS if k not in ("model_type", "category", "samples", "seed",
                                                                 "garment", "mask", "mask_grow"))


def pair_garments(pair: Pair) -> list[Garment]:
    """The row's two garments, as `ootd run` makes them from two `--cloth`."""
    if pair.category is None or pair.category2 is None or pair.garment2 is None:
        raise UsageError(pair.problem or f"{pair.source}: an outfit needs both garments' categories")
    return [Garment(pair.garment, pair.category, pair.mask), Garment(pair.garment2, pair.category2, pair.mask2)]


@dataclass(frozen=True)
class OutfitPlan:
    """An outfit row checked without models: its passes' order, the second pass's model and the output names."""

    config: RunConfig
    pair: Pair
    upper_model: ModelType
    targets: Targets
    model_type: ModelType = ModelType.DC  # the first pass's: the runner orders, loads and reports by it

    @classmethod
    def planned(cls, config: RunConfig, pair: Pair) -> OutfitPlan:
        """The plan (a dress with a second garment, two of one category, --grid: this row's UsageError)."""
        if config.grid:
            raise UsageError("--grid shows one garment's try-on; an outfit has two passes: leave --grid out")
        lower, upper = order_outfit(pair_garments(pair))
        upper_model = upper_model_for(config)
        targets = outfit_targets(config, cls._request(pair, lower), upper, upper_model)
        return cls(config, pair, upper_model, targets)

    @staticmethod
    def _request(pair: Pair, garment: Garment) -> TryOnRequest:
        return TryOnRequest(pair.person, garment.source, garment.category, garment.mask)

    @property
    def models(self) -> set[ModelType]:
        return {ModelType.DC, self.upper_model}

    def describe_models(self) -> str:
        return f"{ModelType.DC.value}+{self.upper_model.value}"

    def expected(self) -> dict[str, str]:
        """What the final pictures record when made with this run's settings: the shared settings and each pass's
        garment, category and model (and the lower pass's seed unless the seed was drawn)."""
        lower, upper = order_outfit(pair_garments(self.pair))
        config = self.config
        expected = {"outfit": "lower+upper"}
        for name, garment, model in (("lower", lower, ModelType.DC), ("upper", upper, self.upper_model)):
            request = self._request(self.pair, garment)
            own = {**run_record(model, garment.category, config), **input_record(request, config)}
            expected.update({f"{name}_garment": own["garment"], f"{name}_category": own["category"],
                             f"{name}_model_type": own["model_type"]})
            if name == "lower":
                expected.update({key: own[key] for key in SHARED_SETTINGS})
        if not config.seed_random:
            expected["lower_seed"] = str(pass_seed(config.sampling.seed, "lower"))
        return expected

    def run(self, loader: PipelineLoader, progress: Progress | None = None
            ) -> tuple[OutfitJob, OutfitOutcome, list[Path], dict[str, Path]]:
        """Every check of the outfit job (both masks from one parse), both passes, and the saved pictures: (job,
        outcome, pictures, intermediates). Outputs the precheck found done with these settings are rewritten
        with the same pixels (a row resumed half-way)."""
        config = self.config
        if any(path.exists() for path in self.targets.all()):
            config = replace(config, overwrite=True)
        job = prepare_outfit(config, self.pair.person, pair_garments(self.pair), loader)
        outcome = job.run(loader.get, progress=progress)
        images, intermediates = job.save(outcome)
        return job, outcome, images, intermediates


def planned_outputs(pair: Pair, config: RunConfig) -> list[Path]:
    """An outfit row's outputs (none when the row is refused: the precheck reports it)."""
    try:
        return OutfitPlan.planned(config, pair).targets.all()
    except UsageError:
        return []


def is_outfit(job: Any) -> bool:
    return isinstance(job, OutfitPlan)

