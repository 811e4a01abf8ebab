"""FID and KID of a set of results against a set of real photos, from their features: torchmetrics' estimators
(the Frechet distance of the two Gaussians; the unbiased MMD^2 with the cubic polynomial kernel over random
subsets), fed features computed elsewhere (ootd/evaluation/scoring.py), so the math does not depend on which
network made them.

FID keeps running sums (its memory does not grow with the sets); KID keeps the features themselves (8 KiB an image
at 2048 float32s). KID's subsets: `KID_SUBSETS` of `min(KID_SUBSET_SIZE, both set sizes)` images each, drawn
with a fixed seed, so the same sets give the same numbers (with a set smaller than the subset size every subset is
the whole set, and the standard deviation is 0).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

KID_SUBSETS = 100
KID_SUBSET_SIZE = 1000
KID_SEED = 0
MIN_SET = 2  # FID's covariance needs two images a side


class _Given(torch.nn.Module):
    """The features themselves: what torchmetrics' metrics call as their network."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.num_features = dim

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features


@dataclass(frozen=True)
class SetScores:
    """FID, KID (mean and standard deviation over the subsets) and the set sizes; `problem` says why the numbers
    are missing (too few images)."""

    results: int
    photos: int
    fid: float | None = None
    kid: float | None = None
    kid_std: float | None = None
    kid_subsets: int | None = None
    kid_subset_size: int | None = None
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"results": self.results, "photos": self.photos, "fid": self.fid, "kid": self.kid,
                "kid_std": self.kid_std, "kid_subsets": self.kid_subsets, "kid_subset_size": self.kid_subset_size,
                "problem": self.problem}


class SetStatistics:
    """Features of results (`real=False`) and real photos (`real=True`) added a batch at a time."""

    def __init__(self, dim: int) -> None:
        from torchmetrics.image.fid import FrechetInceptionDistance
        from torchmetrics.image.kid import KernelInceptionDistance

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # KID's notice that it keeps the features: 8 KiB an image
            self._fid = FrechetInceptionDistance(feature=_Given(dim))
            self._kid = KernelInceptionDistance(feature=_Given(dim), subsets=KID_SUBSETS, subset_size=KID_SUBSET_SIZE)
        self.counts = {True: 0, False: 0}

    def add(self, features: torch.Tensor, real: bool) -> None:
        if not len(features):
            return
        features = features.detach().to("cpu", torch.float64)
        self._fid.update(features, real=real)
        self._kid.update(features, real=real)
        self.counts[real] += len(features)

    def scores(self) -> SetScores:
        photos, results = self.counts[True], self.counts[False]
        if min(photos, results) < MIN_SET:
            return SetScores(results, photos, problem=f"FID and KID need at least {MIN_SET} results and {MIN_SET} "
                                                      f"photos ({results} and {photos} here)")
        fid = float(self._fid.compute())
        size = min(KID_SUBSET_SIZE, photos, results)
        self._kid.subset_size = size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(KID_SEED)
            kid, kid_std = self._kid.compute()
        return SetScores(results, photos, fid, float(kid), float(kid_std), KID_SUBSETS, size)
