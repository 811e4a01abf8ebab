"""FID and KID of a set of results against a set of real photos, from their features: torchmetrics' estimators
(the Frechet distance of the two Gaussians; the unbiased MMD^2 with the cubic polynomial kernel over random
subsets), fed features computed elsewhere (ootd/evaluation/scoring.py), so the math does not depend on which
network made them.

Memory is bounded whatever the sets' sizes. FID keeps running sums (a mean and a 2048x2048 sum of products a
side). KID is computed on random subsets, so it needs a uniform sample of each set, not the set: each side keeps
a seeded reservoir (Vitter's algorithm R) of at most `KID_RESERVOIR` feature vectors, in the dtype they arrive in
(at least float32; InceptionV3's float32: 8 KiB an image, so at most 80 MiB a side, and a float64 copy while KID
is computed at the end). A uniform subset of a uniform sample is a uniform subset of the set, so KID stays the
same unbiased estimate; up to `KID_RESERVOIR` images a side the reservoir is the whole set in order and the
numbers are exactly those of torchmetrics fed every feature.

KID's subsets: `KID_SUBSETS` of `min(KID_SUBSET_SIZE, both set sizes)` images each, drawn with a fixed seed, so
the same sets give the same numbers (with a set smaller than the subset size every subset is the whole set, and
the standard deviation is 0).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

KID_SUBSETS = 100
KID_SUBSET_SIZE = 1000
KID_SEED = 0
KID_RESERVOIR = 10_000  # feature vectors kept a side for KID: 10x its subset size, 80 MiB at 2048 float32s
MIN_SET = 2  # FID's covariance needs two images a side


class _Given(torch.nn.Module):
    """The features themselves: what torchmetrics' metrics call as their network."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.num_features = dim

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features


class Reservoir:
    """A uniform random sample of at most `capacity` of the rows added, whatever their number (algorithm R):
    the first `capacity` rows are kept in order; row i after them replaces a kept row with probability
    capacity / (i + 1). One uniform draw per row beyond the first `capacity`, from a generator seeded with `seed`,
    so the same rows give the same sample however they are split into batches."""

    def __init__(self, capacity: int, seed: int) -> None:
        if capacity < 1:
            raise ValueError(f"a reservoir holds at least one row, not {capacity}")
        self.capacity = capacity
        self.seen = 0
        self._rows: torch.Tensor | None = None  # grown by doubling up to `capacity` rows
        self._kept = 0
        self._rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self._kept

    def rows(self) -> torch.Tensor:
        """The kept rows (a view; empty before any row is added)."""
        return self._rows[:self._kept] if self._rows is not None else torch.empty(0)

    def add(self, rows: torch.Tensor) -> None:
        if not len(rows):
            return
        if self._rows is None:
            self._rows = torch.empty((min(self.capacity, max(64, len(rows))), *rows.shape[1:]), dtype=rows.dtype)
        rows = rows.to(self._rows.dtype)
        fill = min(len(rows), self.capacity - self._kept)
        if fill:
            self._grow(self._kept + fill)
            self._rows[self._kept:self._kept + fill] = rows[:fill]
            self._kept += fill
        rest = len(rows) - fill
        if rest:
            index = np.arange(self.seen + fill, self.seen + len(rows))  # each row's position among all rows
            slots = np.floor(self._rng.random(rest) * (index + 1)).astype(np.int64)
            for row, slot in zip(range(fill, len(rows)), slots.tolist(), strict=True):
                if slot < self.capacity:  # in order: a later row in the same batch wins a shared slot
                    self._rows[slot] = rows[row]
        self.seen += len(rows)

    def _grow(self, needed: int) -> None:
        assert self._rows is not None
        if needed <= len(self._rows):
            return
        bigger = torch.empty((min(self.capacity, max(needed, 2 * len(self._rows))), *self._rows.shape[1:]),
                             dtype=self._rows.dtype)
        bigger[:self._kept] = self._rows[:self._kept]
        self._rows = bigger


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
    """Features of results (`real=False`) and real photos (`real=True`) added a batch at a time: FID's running
    sums and KID's reservoirs (module docstring). `kid_subset_size` and `kid_reservoir` are for tests."""

    def __init__(self, dim: int, kid_subset_size: int = KID_SUBSET_SIZE, kid_reservoir: int = KID_RESERVOIR) -> None:
        from torchmetrics.image.fid import FrechetInceptionDistance

        if kid_reservoir < kid_subset_size:
            raise ValueError(f"KID's reservoir ({kid_reservoir}) must hold a subset ({kid_subset_size})")
        self.dim = dim
        self.kid_subset_size = kid_subset_size
        self._fid = FrechetInceptionDistance(feature=_Given(dim))
        self.reservoirs = {real: Reservoir(kid_reservoir, seed) for real, seed in ((True, KID_SEED),
                                                                                 (False, KID_SEED + 1))}
        self.counts = {True: 0, False: 0}

    def add(self, features: torch.Tensor, real: bool) -> None:
        if not len(features):
            return
        features = features.detach().cpu()
        self._fid.update(features.to(torch.float64), real=real)
        kept = torch.promote_types(features.dtype, torch.float32)  # InceptionV3's float32 as it is
        self.reservoirs[real].add(features.to(kept))
        self.counts[real] += len(features)

    def _kid(self, size: int) -> tuple[float, float]:
        """torchmetrics' KID fed the reservoirs (in float64, as it would be fed every feature), subsets seeded."""
        from torchmetrics.image.kid import KernelInceptionDistance

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # KID's notice that it keeps the features: here at most the reservoirs
            kid = KernelInceptionDistance(feature=_Given(self.dim), subsets=KID_SUBSETS, subset_size=size)
        for real in (True, False):
            kid.update(self.reservoirs[real].rows().to(torch.float64), real=real)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(KID_SEED)
            mean, std = kid.compute()
        return float(mean), float(std)

    def scores(self) -> SetScores:
        photos, results = self.counts[True], self.counts[False]
        if min(photos, results) < MIN_SET:
            return SetScores(results, photos, problem=f"FID and KID need at least {MIN_SET} results and {MIN_SET} "
                                                      f"photos ({results} and {photos} here)")
        fid = float(self._fid.compute())
        size = min(self.kid_subset_size, photos, results)
        kid, kid_std = self._kid(size)
        return SetScores(results, photos, fid, kid, kid_std, KID_SUBSETS, size)
