"""Per-pair SSIM and LPIPS, and the features of both sets, computed a batch of images at a time.

A pair is a result and its real photo already in the result's frame (ootd/evaluation/framing.py), both 8-bit RGB.
The scorer holds at most `batch` pairs' pixels (and `batch` unpaired images per side); each full batch goes
through the networks at once and leaves only numbers behind: two floats a pair and the feature statistics
(ootd/evaluation/sets.py). So memory stays flat and time grows with the number of images, whatever their count.

SSIM is the project's own (ootd/imaging/similarity.py, as `ootd compare` and the training's validation sheets
compute it): Gaussian window sigma 1.5 (11x11), K1 0.01, K2 0.03, per RGB channel on 8-bit levels and averaged,
the window's 5-pixel border excluded (scikit-image's `gaussian_weights=True` form; 1 = identical); it needs no
network, so it is computed on any install. LPIPS is the lpips package's distance on RGB scaled to [-1, 1]
(0 = identical). Both are computed at the result's resolution. Without the networks (`networks` None: the eval
extra is not installed) the scorer computes SSIM alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ootd.evaluation.networks import Networks
from ootd.evaluation.sets import SetScores, SetStatistics
from ootd.evaluation.settings import DEFAULT_BATCH, NOT_COMPUTED, check_batch
from ootd.imaging.similarity import ssim as image_ssim


@dataclass(frozen=True)
class PairScore:
    """The scores of the pair the caller numbered `key`."""

    key: int
    ssim: float
    lpips: float | None  # None: no network to compute it with


def _tensor(images: list[np.ndarray], device: torch.device) -> torch.Tensor:
    """H x W x 3 uint8 arrays -> N x 3 x H x W uint8 on `device`."""
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous().to(device)


class Scorer:
    """Add pairs (or unpaired results and photos); `finish` gives every pair's scores and the sets' scores."""

    def __init__(self, networks: Networks | None, batch: int = DEFAULT_BATCH, missing: str | None = None) -> None:
        """`networks` None: SSIM alone; `missing` says why the rest is not computed."""
        self.networks = networks
        self.batch = check_batch(batch)
        self.stats = SetStatistics(networks.feature_dim) if networks is not None else None
        self.missing = missing
        self.counts = {True: 0, False: 0}  # photos (real) and results added
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
        self.counts[False] += 1
        self.counts[True] += new_truth
        self._held()
        if len(self._pending) >= self.batch:
            self._flush_pairs()

    def add_image(self, image: np.ndarray, real: bool) -> None:
        """An image of the result set (`real=False`) or of the real set, unpaired: features only."""
        self._unpaired[real].append(image)
        self.counts[real] += 1
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
        ssim = [image_ssim(result, truth) for _, result, truth, _ in pending]
        if self.networks is None or self.stats is None:
            self.pairs += [PairScore(key, s, None) for (key, *_), s in zip(pending, ssim, strict=True)]
            return
        device = self.networks.device
        results = _tensor([p[1] for p in pending], device)
        truths = _tensor([p[2] for p in pending], device)
        a, b = results.float() / 255.0, truths.float() / 255.0
        distance = self.networks.lpips(a * 2 - 1, b * 2 - 1)
        for (key, *_), s, d in zip(pending, ssim, distance.flatten().tolist(), strict=True):
            self.pairs.append(PairScore(key, s, d))
        self.stats.add(self.networks.features(results), real=False)
        new = [i for i, p in enumerate(pending) if p[3]]
        if new:
            self.stats.add(self.networks.features(truths[new]), real=True)

    @torch.inference_mode()
    def _flush_images(self, real: bool) -> None:
        images, self._unpaired[real] = self._unpaired[real], []
        if images and self.networks is not None and self.stats is not None:
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
        if self.stats is None:
            return self.pairs, SetScores(self.counts[False], self.counts[True], problem=NOT_COMPUTED)
        return self.pairs, self.stats.scores()
