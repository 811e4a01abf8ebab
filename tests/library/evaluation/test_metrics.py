"""The metric math (SSIM, FID, KID) against small references written here in numpy, KID's bounded reservoir, the
framing rule, and the scorer's flat memory and time per image. The networks are the stand-ins of
tests/helpers/evaluation.py (random convolution features, mean squared difference): what is checked here does not
depend on them."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
import scipy.linalg
import torch
from PIL import Image

from ootd.evaluation.framing import frame_to
from ootd.evaluation.scoring import Scorer
from ootd.evaluation.sets import KID_SEED, KID_SUBSETS, Reservoir, SetStatistics
from tests.helpers.evaluation import blurred, noise_image, stand_in_networks

# ---------------------------------------------------------------------------------------------- references


def ssim_reference(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM as Wang et al. 2004 define it: an 11x11 Gaussian window (sigma 1.5), K1 0.01, K2 0.03, data range 1,
    the map averaged over the pixels whose whole window lies inside the image (the 5-pixel border excluded, as
    scikit-image does), then over the channels. The window is applied here by shifting a padded copy."""
    radius, sigma = 5, 1.5
    g = np.exp(-(np.arange(-radius, radius + 1) ** 2) / (2 * sigma**2))
    g /= g.sum()
    kernel = np.outer(g, g)

    def window(v: np.ndarray) -> np.ndarray:
        padded = np.pad(v, radius, mode="reflect")
        out = np.zeros_like(v)
        h, w = v.shape
        for i in range(2 * radius + 1):
            for j in range(2 * radius + 1):
                out += kernel[i, j] * padded[i:i + h, j:j + w]
        return out

    c1, c2 = 0.01**2, 0.03**2
    maps = []
    for c in range(3):
        x, y = a[..., c].astype(np.float64) / 255, b[..., c].astype(np.float64) / 255
        mx, my = window(x), window(y)
        vx = np.maximum(window(x * x) - mx * mx, 0)
        vy = np.maximum(window(y * y) - my * my, 0)
        cxy = window(x * y) - mx * my
        full = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
        maps.append(full[radius:-radius, radius:-radius])
    return float(np.mean(maps))


def fid_reference(x: np.ndarray, y: np.ndarray) -> float:
    """The Frechet distance of two Gaussians fitted to the feature sets."""
    mx, my = x.mean(0), y.mean(0)
    sx, sy = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    root = scipy.linalg.sqrtm(sx @ sy).real
    return float(((mx - my) ** 2).sum() + np.trace(sx + sy - 2 * root))


def kid_reference(x: np.ndarray, y: np.ndarray) -> float:
    """The unbiased MMD^2 of two equal-sized sets with the kernel (x.y / d + 1)^3."""
    m, d = x.shape
    kxx, kyy, kxy = ((x @ x.T / d + 1) ** 3, (y @ y.T / d + 1) ** 3, (x @ y.T / d + 1) ** 3)
    return float((kxx.sum() - np.trace(kxx)) / (m * (m - 1)) + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
                 - 2 * kxy.mean())


def features(seed: int, n: int, shift: float = 0.0, dim: int = 16) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(shift, 1.0, (n, dim)) @ rng.normal(0, 0.5, (dim, dim)) + shift


# ---------------------------------------------------------------------------------------------- SSIM


def scored(pairs: list[tuple[Image.Image, Image.Image]], batch: int = 3) -> Scorer:
    scorer = Scorer(stand_in_networks(None, torch.device("cpu")), batch)
    for key, (a, b) in enumerate(pairs):
        scorer.add_pair(key, np.asarray(a), np.asarray(b))
    scorer.finish()
    return scorer


def test_ssim_matches_the_reference_and_is_one_for_identical_images() -> None:
    photo = noise_image(1, (40, 56))
    pairs = [(blurred(photo, 3), photo), (noise_image(2, (40, 56)), photo), (photo, photo)]
    scores = scored(pairs).pairs
    for (a, b), score in zip(pairs, scores, strict=True):
        assert score.ssim == pytest.approx(ssim_reference(np.asarray(a), np.asarray(b)), abs=1e-5)
    assert scores[2].ssim == pytest.approx(1.0, abs=1e-6) and scores[2].lpips == pytest.approx(0.0, abs=1e-7)
    assert scores[0].ssim > scores[1].ssim  # a blurred copy is closer than another picture


def test_scores_keep_their_pairs_order_across_batches() -> None:
    photo = noise_image(3)
    pairs = [(blurred(photo, k), photo) for k in range(7)]
    scores = scored(pairs, batch=3).pairs
    assert [s.key for s in scores] == list(range(7))
    assert [s.ssim for s in scores] == sorted((s.ssim for s in scores), reverse=True)  # blurrier is worse


# ---------------------------------------------------------------------------------------------- FID, KID


def sets_of(real: np.ndarray, fake: np.ndarray, chunk: int = 7, **kid: int) -> SetStatistics:
    stats = SetStatistics(real.shape[1], **kid)
    for start in range(0, len(real), chunk):  # in batches, as the scorer adds them
        stats.add(torch.from_numpy(real[start:start + chunk]).float(), real=True)
    for start in range(0, len(fake), chunk):
        stats.add(torch.from_numpy(fake[start:start + chunk]).float(), real=False)
    return stats


def test_fid_and_kid_match_the_numpy_references_on_given_features() -> None:
    real, fake = features(0, 40), features(1, 40, shift=0.3)
    real32, fake32 = real.astype(np.float32).astype(np.float64), fake.astype(np.float32).astype(np.float64)
    scores = sets_of(real, fake).scores()
    assert scores.fid == pytest.approx(fid_reference(real32, fake32), rel=1e-6, abs=1e-8)
    # every subset is the whole set (40 < 1000): the estimate is the reference's, the spread nil
    assert scores.kid == pytest.approx(kid_reference(real32, fake32), rel=1e-9, abs=1e-12)
    assert scores.kid_std == pytest.approx(0.0, abs=1e-12)
    assert (scores.results, scores.photos, scores.kid_subsets, scores.kid_subset_size) == (40, 40, KID_SUBSETS, 40)


def test_same_sets_and_unequal_sets_are_repeatable() -> None:
    twice = features(2, 30).astype(np.float32).astype(np.float64)
    same = sets_of(twice, twice).scores()
    # the unbiased estimate of a set against itself is below 0 (the pairs of an image with itself count in k_xy)
    assert same.fid == pytest.approx(0.0, abs=1e-6)
    assert same.kid == pytest.approx(kid_reference(twice, twice), rel=1e-9) and same.kid < 0
    first = sets_of(features(3, 30), features(4, 50, shift=0.5)).scores()
    again = sets_of(features(3, 30), features(4, 50, shift=0.5)).scores()
    assert first.kid_subset_size == 30 and first.kid_std > 0  # random subsets of the larger set
    assert (first.fid, first.kid, first.kid_std) == (again.fid, again.kid, again.kid_std)  # the seed is fixed
    assert first.fid > 0.1 and first.kid > 0


def subsetted_kid_reference(x: np.ndarray, y: np.ndarray, size: int) -> tuple[float, float]:
    """`kid_reference` over KID_SUBSETS subsets of `size` a side, drawn as the estimator draws them (per subset a
    permutation of x's rows, then one of y's, from torch's generator seeded with KID_SEED); their mean and
    population standard deviation."""
    generator = torch.Generator().manual_seed(KID_SEED)
    values = []
    for _ in range(KID_SUBSETS):
        pick_x = torch.randperm(len(x), generator=generator)[:size].numpy()
        pick_y = torch.randperm(len(y), generator=generator)[:size].numpy()
        values.append(kid_reference(x[pick_x], y[pick_y]))
    return float(np.mean(values)), float(np.std(values))


def test_subsetted_kid_matches_the_numpy_reference() -> None:
    real = features(10, 40).astype(np.float32).astype(np.float64)
    fake = features(11, 60, shift=0.4).astype(np.float32).astype(np.float64)
    scores = sets_of(real, fake, kid_subset_size=10, kid_reservoir=100).scores()
    mean, std = subsetted_kid_reference(real, fake, 10)
    assert scores.kid_subset_size == 10 and std > 0
    assert scores.kid == pytest.approx(mean, rel=1e-9, abs=1e-12)
    assert scores.kid_std == pytest.approx(std, rel=1e-9, abs=1e-12)


def test_up_to_the_reservoir_kid_is_torchmetrics_fed_every_feature() -> None:
    """What KID was before the reservoir: torchmetrics' estimator fed every feature (in float64), same seed."""
    from torchmetrics.image.kid import KernelInceptionDistance

    from ootd.evaluation.sets import _Given

    real, fake = features(12, 45), features(13, 50, shift=0.2)
    scores = sets_of(real, fake, kid_subset_size=20, kid_reservoir=50).scores()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its notice that it keeps every feature
        every = KernelInceptionDistance(feature=_Given(real.shape[1]), subsets=KID_SUBSETS, subset_size=20)
    every.update(torch.from_numpy(real).float().double(), real=True)
    every.update(torch.from_numpy(fake).float().double(), real=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(KID_SEED)
        kid, kid_std = every.compute()
    assert (scores.kid, scores.kid_std) == (float(kid), float(kid_std))  # exactly


def test_the_reservoir_is_bounded_seeded_and_uniform() -> None:
    rows = torch.arange(1000, dtype=torch.float32)[:, None]
    small = Reservoir(50, seed=3)
    small.add(rows[:30])
    small.add(rows[30:45])
    assert torch.equal(small.rows(), rows[:45])  # below the capacity: every row, in order
    one, other = Reservoir(50, seed=3), Reservoir(50, seed=3)
    for start in range(0, 1000, 7):
        one.add(rows[start:start + 7])
    for start in range(0, 1000, 64):  # other batches, the same rows: the same sample
        other.add(rows[start:start + 64])
    assert len(one) == 50 and one.seen == 1000 and torch.equal(one.rows(), other.rows())
    assert len(set(one.rows().flatten().tolist())) == 50  # each row at most once
    reseeded = Reservoir(50, seed=4)
    reseeded.add(rows)
    assert not torch.equal(reseeded.rows(), one.rows())
    # uniform: over many seeds each of 50 rows is kept with probability 5/50 (400 of 4000 expected, sd 19)
    kept = np.zeros(50)
    for seed in range(4000):
        sample = Reservoir(5, seed)
        sample.add(rows[:50])
        kept[sample.rows().flatten().long().numpy()] += 1
    assert kept.sum() == 5 * 4000 and kept.min() > 300 and kept.max() < 500, kept


def test_kid_past_the_reservoir_keeps_a_bounded_sample() -> None:
    real, fake = features(14, 300), features(15, 240, shift=0.5)
    stats = sets_of(real, fake, kid_subset_size=20, kid_reservoir=60)
    assert [len(stats.reservoirs[side]) for side in (True, False)] == [60, 60]
    scores, again = stats.scores(), sets_of(real, fake, kid_subset_size=20, kid_reservoir=60).scores()
    assert (scores.photos, scores.results, scores.kid_subset_size) == (300, 240, 20)
    assert scores.fid == pytest.approx(fid_reference(real.astype(np.float32).astype(np.float64),
                                                     fake.astype(np.float32).astype(np.float64)), rel=1e-6)
    assert scores.kid > 0 and (scores.kid, scores.kid_std) == (again.kid, again.kid_std)


def test_too_few_images_for_fid_say_so() -> None:
    scores = sets_of(features(5, 1), features(6, 9)).scores()
    assert scores.fid is None and scores.kid is None and "at least 2" in scores.problem


# ---------------------------------------------------------------------------------------------- framing


def test_photos_are_centre_cropped_to_the_aspect_then_resized() -> None:
    wide = Image.new("RGB", (200, 120), (0, 0, 0))
    wide.paste((255, 255, 255), (55, 0, 145, 120))  # a white band 90 px wide in the middle
    framed = frame_to(wide, (45, 60))  # 3:4: the middle 90x120 is kept, then halved
    assert framed.cropped and framed.resized and framed.image.size == (45, 60)
    assert np.asarray(framed.image).min() > 240  # only the white band is left
    same = noise_image(7, (45, 60))
    unchanged = frame_to(same, (45, 60))
    assert unchanged.image is same and not unchanged.cropped and not unchanged.resized
    tall = frame_to(noise_image(8, (45, 70)), (45, 60))
    assert tall.cropped and not tall.resized and tall.image.size == (45, 60)


# ---------------------------------------------------------------------------------------------- growth


def _stream(count: int, batch: int) -> tuple[float, int]:
    """CPU seconds per image (the process's, one torch thread: what the work costs, not what the machine's other
    jobs take from it) and the most images held."""
    scorer = Scorer(stand_in_networks(None, torch.device("cpu")), batch)
    photo = np.asarray(noise_image(9, (48, 64)))
    start = time.process_time()
    for key in range(count):
        scorer.add_pair(key, photo, photo, new_truth=True)
    scorer.flush()
    return (time.process_time() - start) / count, scorer.held_max


def test_memory_and_time_per_image_stay_flat() -> None:
    """The work per image (reading aside): scores and features a batch at a time. The sets' scores at the end
    are one computation per evaluation, of a size bounded by KID's subsets (docs/benchmarks.md measures it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared machine, spinning threads would count the neighbours' load as ours
    try:
        runs = [(_stream(12, 4), _stream(48, 4)) for _ in range(3)]  # interleaved: both see the same load
    finally:
        torch.set_num_threads(threads)
    small, large = min(r[0] for r in runs), min(r[1] for r in runs)
    assert small[1] == large[1] == 8  # never more than a batch of pairs (result and photo) held
    assert large[0] < 2 * small[0], (small, large)  # 4x the images: the same per image (4x if it grew with them)
