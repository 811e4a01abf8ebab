"""One evaluation: match (or gather) the images, load the networks once, feed the scorer image by image, and
report. Each image is read once, a pair's photo framed once however many results share it; nothing but numbers
outlives a batch of images (ootd/evaluation/scoring.py).

All results of one evaluation have one size, the first readable result's: a result of another size is skipped
(mixed sizes mean mixed runs, and FID over them would mean nothing). Unreadable files are skipped, each with its
reason; an evaluation where nothing is left is one error.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from ootd.app.evaluate.matching import Match, Matching, match_results, unpaired_sets
from ootd.app.evaluate.report import EvalReport, PairResult
from ootd.errors import InputImageError, OotdError, UnsupportedError, UsageError, printable
from ootd.evaluation.framing import frame_to
from ootd.evaluation.scoring import Scorer
from ootd.evaluation.settings import DEFAULT_BATCH, MetricWeights, check_batch
from ootd.imaging.files import read_rgb
from ootd.pipeline_types import Progress

if TYPE_CHECKING:
    from ootd.models import Models

STAGE = "evaluate"
SMALLEST_RESULT = 11  # px a side: SSIM's Gaussian window (ootd/evaluation/scoring.py) must fit inside a result


@dataclass(frozen=True)
class EvalOptions:
    """How to evaluate, each value checked once (`from_words`)."""

    weights: MetricWeights = MetricWeights.STANDARD
    device: str | None = None
    batch: int = DEFAULT_BATCH
    unpaired: bool = False
    pairs_csv: Path | None = None

    @classmethod
    def from_words(cls, weights: str | MetricWeights = MetricWeights.STANDARD, device: str | None = None,
                   batch: int = DEFAULT_BATCH, unpaired: bool = False, pairs_csv: Path | None = None) -> EvalOptions:
        from ootd.hardware.spec import check_device_spec

        if unpaired and pairs_csv is not None:
            raise UsageError.about("unpaired", "{@pairs} matches results to photos and {@unpaired} matches none: "
                                   "give one of them")
        return cls(MetricWeights.parse(weights), check_device_spec(device), check_batch(batch), unpaired, pairs_csv)


def evaluation_models(options: EvalOptions) -> Models:
    """The model owner of an evaluation on its own (`ootd eval`): the metric networks on the chosen device."""
    from ootd.models import Models
    from ootd.runtime import RuntimeRequest

    return Models(None, RuntimeRequest(device=options.device))


def check_evaluation(truth: Path, options: EvalOptions, models: Models | None = None) -> None:
    """What an evaluation needs before any work (a batch's pre-flight): the truth folder and, where the networks
    are installed, the published weights' files; for an unpaired one the networks themselves (its FID and KID are
    all it computes). `models`: the owner that will load them."""
    from ootd.app.evaluate.matching import PhotoIndex

    PhotoIndex(truth)
    _require_for_unpaired(options, (models or evaluation_models(options)).check_metrics(options.weights))


def _require_for_unpaired(options: EvalOptions, missing: str | None) -> None:
    if options.unpaired and missing is not None:
        raise UnsupportedError.about("unpaired", "{@unpaired} computes FID and KID only, and {missing}",
                                     missing=missing)


def _read(path: Path, min_side: int = 1) -> Image.Image:
    def fail(problem: str) -> InputImageError:
        return InputImageError(f"{' '.join(problem.split())}")

    return read_rgb(path, fail, min_side)  # in sRGB: a photo's ICC profile applied, as the try-on applies it


class _Run:
    """The loop over the images: the set's size, the framing counts, the skipped."""

    def __init__(self, matching: Matching, scorer: Scorer, progress: Progress | None, total: int) -> None:
        self.matching, self.scorer, self.progress, self.total = matching, scorer, progress, total
        self.size: tuple[int, int] | None = None
        self.framing = {"cropped": 0, "resized": 0}
        self._framed: set[Path] = set()  # the photos counted in `framing`
        self.done = 0

    def tick(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(STAGE, self.done, self.total)

    def result(self, path: Path) -> np.ndarray | None:
        try:
            image = _read(path, SMALLEST_RESULT)
        except InputImageError as exc:
            self.matching.skip(path, f"result: {exc}")
            return None
        if self.size is None:
            self.size = image.size
        elif image.size != self.size:
            self.matching.skip(path, f"its size {image.size[0]}x{image.size[1]} differs from the set's "
                                     f"{self.size[0]}x{self.size[1]} (the first result's)")
            return None
        return np.asarray(image)

    def photo(self, path: Path) -> tuple[np.ndarray | None, str]:
        """A real photo framed to the set's size, or None and why it cannot be used (each photo counted once in
        the framing figures, however many results it is the truth of)."""
        try:
            image = _read(path)
        except InputImageError as exc:
            return None, f"photo {printable(path)}: {exc}"
        assert self.size is not None
        framed = frame_to(image, self.size)
        if path not in self._framed:
            self._framed.add(path)
            self.framing["cropped"] += framed.cropped
            self.framing["resized"] += framed.resized
        return np.asarray(framed.image), ""

    def paired(self) -> list[Match]:
        """Every match scored in order; returns the matches by the scorer's keys. A result whose photo cannot
        be used is skipped with the photo's reason, each of them (a photo is read again only when the truth
        changes: the matches come grouped by photo)."""
        seen: set[Path] = set()
        last: tuple[Path | None, np.ndarray | None, str] = (None, None, "")
        for key, match in enumerate(self.matching.matches):
            result = self.result(match.result)
            if result is not None:
                assert match.truth is not None
                if last[0] != match.truth:
                    last = (match.truth, *self.photo(match.truth))
                if last[1] is None:
                    self.matching.skip(match.result, last[2])
                else:
                    self.scorer.add_pair(key, result, last[1], new_truth=match.truth not in seen)
                    seen.add(match.truth)
            self.tick()
        return self.matching.matches

    def unpaired(self, photos: list[Path]) -> None:
        for match in self.matching.matches:
            result = self.result(match.result)
            if result is not None:
                self.scorer.add_image(result, real=False)
            self.tick()
        if self.size is None:
            return
        for path in photos:
            photo, problem = self.photo(path)
            if photo is None:
                self.matching.skip(path, problem)
            else:
                self.scorer.add_image(photo, real=True)
            self.tick()


def evaluate(results: Path, truth: Path, options: EvalOptions, progress: Progress | None = None,
             reports: list[Path] | None = None, models: Models | None = None) -> EvalReport:
    """Measure the results in `results` against the real photos in `truth` (`reports`: only these batch
    reports' pairs, e.g. one shard's); the networks come from `models` (None: an owner of the options' own)."""
    from ootd.evaluation.networks import stack_problem

    start = time.perf_counter()
    results, truth = Path(results), Path(truth)
    photos: list[Path] = []
    if options.unpaired:
        matching, photos = unpaired_sets(results, truth, reports)
    else:
        matching = match_results(results, truth, options.pairs_csv, reports)
    networks = (models or evaluation_models(options)).metrics(options.weights)
    missing = stack_problem() if networks is None else None
    _require_for_unpaired(options, missing)
    scorer = Scorer(networks, options.batch, missing)
    run = _Run(matching, scorer, progress, len(matching.matches) + len(photos))
    if options.unpaired:
        run.unpaired(photos)
    else:
        run.paired()
    scores, sets = scorer.finish()
    if run.size is None or (not options.unpaired and not scores):
        first = matching.skipped[-1] if matching.skipped else None
        why = f": {first.what}: {first.reason}" if first else ""
        raise OotdError(f"nothing to evaluate: every result in {printable(results)} was skipped{why}")
    pairs = [PairResult(printable(matching.matches[s.key].result), printable(matching.matches[s.key].truth or ""),
                        s.ssim, s.lpips) for s in scores]
    return EvalReport(results, truth, not options.unpaired, run.size, pairs, sets, matching.skipped, matching.by(),
                      run.framing, networks.stand_in if networks else None, networks.names if networks else None,
                      time.perf_counter() - start, missing)
