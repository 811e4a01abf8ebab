"""Per-pair SSIM and LPIPS, and the features of both sets, computed a batch of images at a time.

A pair is a result and its real photo already in the result's frame (ootd/evaluation/framing.py), both 8-bit RGB.
The scorer holds at most `batch` pairs' pixels (and `batch` unpaired images per side); each full batch goes
through the networks at once and leaves only numbers behind: two floats a pair and the feature statistics
(ootd/evaluation/sets.py). So memory stays flat and time grows with the number of images, whatever their count.

SSIM is the project's one (ootd/imaging/similarity.py, what `ootd compare` and the validation sheets report): the
Wang et al. form with an 11x11 Gaussian window (sigma 1.5), K1 0.01, K2 0.03, per RGB channel and averaged, the
5-pixel border left out (1 = identical). LPIPS is the lpips package's distance on RGB scaled to [-1, 1]
(0 = identical). Both are computed at the result's resolution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ootd.evaluation.networks import Networks
from ootd.evaluation.sets import SetScores, SetStatistics
from ootd.evaluation.settings import DEFAULT_BATCH, check_batch
from ootd.imaging.similarity import ssim


@dataclass(frozen=True)
class PairScore:
    """The scores of the pair the caller numbered `key`."""

    key: int
    ssim: float
    lpips: float


def _tensor(images: list[np.ndarray], device: torch.device) -> torch.Tensor:
    """H x W x 3 uint8 arrays -> N x 3 x H x W uint8 on `device`."""
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous().to(device)


class Scorer:
    """Add pairs (or unpaired results and photos); `finish` gives every pair's scores and the sets' scores."""

    def __init__(self, networks: Networks, batch: int = DEFAULT_BATCH) -> None:
        self.networks = networks
        self.batch = check_batch(batch)
        self.stats = SetStatistics(networks.feature_dim)
        self.pairs: list[PairScore] = []
        self._pending: list[tuple[int, np.ndarray, np.ndarray, bool]] = []
        self._unpaired: dict[bool, list[np.ndarray]] = {True: [], False: []}
        self.held_max = 0  # the most images held at once (tests: it never grows with the sets)

    def add_pair(self, key: int, result: np.ndarray, truth: np.ndarray, new_truth: bool = True) -> None:
        """A result and its photo in the result's frame; `new_truth`: the photo joins the real set (a photo
        shared by several results, e.g. samples of one person, counts once)."""
        if result.shape != truth.shape:
            raise ValueError(f"pair {key}: result {result.shape} and photo {truth.shape} differ in size")
        self._pending.append((key, result, truth, new_truth))
        self._held()
        if len(self._pending) >= self.batch:
            self._flush_pairs()

    def add_image(self, image: np.ndarray, real: bool) -> None:
        """An image of the result set (`real=False`) or of the real set, unpaired: features only."""
        self._unpaired[real].append(image)
        self._held()
        if len(self._unpaired[real]) >= self.batch:
            self._flush_images(real)

    def _held(self) -> None:
        held = 2 * len(self._pending) + len(self._unpaired[True]) + len(self._unpaired[False])
        self.held_max = max(self.held_max, held)

    @torch.inference_mode()
    def _flush_pairs(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        device = self.networks.device
        results = _tensor([p[1] for p in pending], device)
        truths = _tensor([p[2] for p in pending], device)
        a, b = results.float() / 255.0, truths.float() / 255.0
        distance = self.networks.lpips(a * 2 - 1, b * 2 - 1)
        for (key, result, truth, _), d in zip(pending, distance.flatten().tolist(), strict=True):
            self.pairs.append(PairScore(key, ssim(result, truth), d))
        self.stats.add(self.networks.features(results), real=False)
        new = [i for i, p in enumerate(pending) if p[3]]
        if new:
            self.stats.add(self.networks.features(truths[new]), real=True)

    @torch.inference_mode()
    def _flush_images(self, real: bool) -> None:
        images, self._unpaired[real] = self._unpaired[real], []
        if images:
            self.stats.add(self.networks.features(_tensor(images, self.networks.device)), real=real)

    def flush(self) -> None:
        """Score what is held now (a part-full batch)."""
        self._flush_pairs()
        self._flush_images(False)
        self._flush_images(True)

    def finish(self) -> tuple[list[PairScore], SetScores]:
        """Flush what is left; the pairs' scores (in the order they were added) and the sets' scores. The sets'
        scores cost the same at any size from `KID_SUBSET_SIZE` images up (FID's matrix square root, KID's
        fixed subsets); below that KID's subsets are the whole sets."""
        self.flush()
        return self.pairs, self.stats.scores()
