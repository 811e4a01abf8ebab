"""OpenPose body decoding in pure numpy: heatmaps + part affinity fields -> one person's COCO-18 keypoints.

Kept apart from the network so it can be tested with synthetic maps and reasoned about on its own.
The procedure and its constants follow the reference OpenPose body decoder (docs/upstream.md §7): peaks on
Gaussian-smoothed heatmaps, limb candidates scored by PAF line integrals, greedy assembly of people.
The one deliberate difference: upstream keeps the first person found, this module keeps the person
with the most keypoints (ties: the larger keypoint bounding box), which is what a try-on photo needs.
"""

from __future__ import annotations

import logging

import numpy as np
from scipy.ndimage import gaussian_filter

from preprocess.errors import NoPersonError

logger = logging.getLogger(__name__)

NUM_KEYPOINTS = 18
NUM_HEATMAPS = 19  # 18 parts + background
NUM_PAFS = 38  # 19 limbs x (x, y)

KEYPOINT_NAMES: tuple[str, ...] = (
    "nose",
    "neck",
    "right_shoulder",
    "right_elbow",
    "right_wrist",
    "left_shoulder",
    "left_elbow",
    "left_wrist",
    "right_hip",
    "right_knee",
    "right_ankle",
    "left_hip",
    "left_knee",
    "left_ankle",
    "right_eye",
    "left_eye",
    "right_ear",
    "left_ear",
)

# (part A, part B, PAF channel of the x component, PAF channel of the y component), 0-based, in the
# order the assembly visits them (the order matters: it decides which limbs may start a new person).
LIMBS: tuple[tuple[int, int, int, int], ...] = (
    (1, 2, 12, 13),  # neck -> right shoulder
    (1, 5, 20, 21),  # neck -> left shoulder
    (2, 3, 14, 15),  # right shoulder -> right elbow
    (3, 4, 16, 17),  # right elbow -> right wrist
    (5, 6, 22, 23),  # left shoulder -> left elbow
    (6, 7, 24, 25),  # left elbow -> left wrist
    (1, 8, 0, 1),  # neck -> right hip
    (8, 9, 2, 3),  # right hip -> right knee
    (9, 10, 4, 5),  # right knee -> right ankle
    (1, 11, 6, 7),  # neck -> left hip
    (11, 12, 8, 9),  # left hip -> left knee
    (12, 13, 10, 11),  # left knee -> left ankle
    (1, 0, 28, 29),  # neck -> nose
    (0, 14, 30, 31),  # nose -> right eye
    (14, 16, 34, 35),  # right eye -> right ear
    (0, 15, 32, 33),  # nose -> left eye
    (15, 17, 36, 37),  # left eye -> left ear
    (2, 16, 18, 19),  # right shoulder -> right ear (redundant; cannot start a person)
    (5, 17, 26, 27),  # left shoulder -> left ear (redundant; cannot start a person)
)
# Limbs from this index on only extend people that already exist.
FIRST_REDUNDANT_LIMB = 17

PEAK_SIGMA = 3.0
PEAK_THRESHOLD = 0.1
PAF_THRESHOLD = 0.05
PAF_SAMPLES = 10
PAF_MIN_HIT_RATIO = 0.8
MIN_PARTS = 4
MIN_MEAN_SCORE = 0.4
MAX_PEAKS_PER_PART = 100  # not in the reference decoder: a guard against flat maps (see find_peaks)


def find_peaks(heatmaps: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Local maxima of each smoothed part heatmap.

    Returns (candidates, ids_per_part): candidates is (N, 3) float64 rows of (x, y, score) with score
    read from the unsmoothed map; ids_per_part[p] holds the candidate rows that belong to part p,
    in row-major (y, then x) order.
    """
    if heatmaps.ndim != 3 or heatmaps.shape[2] < NUM_KEYPOINTS:
        raise ValueError(f"heatmaps must be (H, W, >={NUM_KEYPOINTS}), got {heatmaps.shape}")
    rows: list[np.ndarray] = []
    ids_per_part: list[np.ndarray] = []
    count = 0
    for part in range(NUM_KEYPOINTS):
        raw = np.asarray(heatmaps[:, :, part], dtype=np.float64)
        smooth = gaussian_filter(raw, sigma=PEAK_SIGMA)
        # Compare with the 4-neighbours; outside the map counts as 0, as in the reference decoder.
        padded = np.pad(smooth, 1, mode="constant", constant_values=0.0)
        is_peak = (
            (smooth >= padded[:-2, 1:-1])
            & (smooth >= padded[2:, 1:-1])
            & (smooth >= padded[1:-1, :-2])
            & (smooth >= padded[1:-1, 2:])
            & (smooth > PEAK_THRESHOLD)
        )
        ys, xs = np.nonzero(is_peak)
        if len(xs) > MAX_PEAKS_PER_PART:
            # Only flat or noisy maps get here (a real photo has a few peaks per part); keep the
            # strongest, in their original order, so that assembly stays bounded.
            keep = np.sort(np.argsort(-raw[ys, xs], kind="stable")[:MAX_PEAKS_PER_PART])
            ys, xs = ys[keep], xs[keep]
        found = np.stack([xs, ys, raw[ys, xs]], axis=1).astype(np.float64) if len(xs) else np.zeros((0, 3))
        rows.append(found)
        ids_per_part.append(np.arange(count, count + len(found)))
        count += len(found)
    return np.concatenate(rows, axis=0), ids_per_part


def _score_pairs(
    pts_a: np.ndarray, pts_b: np.ndarray, paf_x: np.ndarray, paf_y: np.ndarray, image_height: int
) -> tuple[np.ndarray, np.ndarray]:
    """PAF line-integral score of every (A, B) pair and whether the pair qualifies as a limb."""
    start = np.broadcast_to(pts_a[:, None, :], (len(pts_a), len(pts_b), 2))
    end = np.broadcast_to(pts_b[None, :, :], (len(pts_a), len(pts_b), 2))
    delta = end - start
    length = np.maximum(np.hypot(delta[..., 0], delta[..., 1]), 0.001)
    unit = delta / length[..., None]
    # Sample points on each segment, rounded half-to-even like Python's round().
    samples = np.linspace(start, end, num=PAF_SAMPLES, axis=-2)  # (nA, nB, S, 2)
    sx = np.rint(samples[..., 0]).astype(np.intp)
    sy = np.rint(samples[..., 1]).astype(np.intp)
    along = paf_x[sy, sx] * unit[..., 0:1] + paf_y[sy, sx] * unit[..., 1:2]  # (nA, nB, S)
    # Limbs longer than half the image height are penalised.
    prior = np.minimum(0.5 * image_height / length - 1.0, 0.0)
    score = along.mean(axis=-1) + prior
    hits = (along > PAF_THRESHOLD).sum(axis=-1)
    return score, (hits > PAF_MIN_HIT_RATIO * PAF_SAMPLES) & (score > 0)


def _limb_connections(
    cand_a: np.ndarray, cand_b: np.ndarray, paf_x: np.ndarray, paf_y: np.ndarray, image_height: int
) -> list[tuple[int, int, float]]:
    """Greedy one-to-one matching of part-A to part-B candidates by PAF line integral.

    Returns (index into cand_a, index into cand_b, connection score), best score first.
    """
    n_a, n_b = len(cand_a), len(cand_b)
    score = np.empty((n_a, n_b))
    ok = np.empty((n_a, n_b), dtype=bool)
    rows_per_chunk = max(1, 8192 // n_b)  # bounds memory when the maps are noisy
    for lo in range(0, n_a, rows_per_chunk):
        hi = min(n_a, lo + rows_per_chunk)
        score[lo:hi], ok[lo:hi] = _score_pairs(cand_a[lo:hi, :2], cand_b[:, :2], paf_x, paf_y, image_height)

    ia, ib = np.nonzero(ok)  # row-major, the order ties are kept in
    order = np.argsort(-score[ia, ib], kind="stable")
    used_a: set[int] = set()
    used_b: set[int] = set()
    chosen: list[tuple[int, int, float]] = []
    limit = min(n_a, n_b)
    for k in order:
        i, j = int(ia[k]), int(ib[k])
        if i in used_a or j in used_b:
            continue
        used_a.add(i)
        used_b.add(j)
        chosen.append((i, j, float(score[i, j])))
        if len(chosen) >= limit:
            break
    return chosen


def assemble_people(candidates: np.ndarray, ids_per_part: list[np.ndarray], pafs: np.ndarray) -> np.ndarray:
    """Group part candidates into people.

    Returns (P, 20) float64: columns 0-17 hold the candidate row of each part (-1 when missing),
    column 18 the total score, column 19 the number of parts. People with fewer than 4 parts or a
    mean score under 0.4 are dropped, as in the reference decoder.
    """
    if pafs.ndim != 3 or pafs.shape[2] < NUM_PAFS:
        raise ValueError(f"pafs must be (H, W, {NUM_PAFS}), got {pafs.shape}")
    image_height = pafs.shape[0]
    people = np.zeros((0, NUM_KEYPOINTS + 2))
    for limb_index, (part_a, part_b, ch_x, ch_y) in enumerate(LIMBS):
        ids_a, ids_b = ids_per_part[part_a], ids_per_part[part_b]
        if len(ids_a) == 0 or len(ids_b) == 0:
            continue
        pairs = _limb_connections(
            candidates[ids_a], candidates[ids_b], pafs[:, :, ch_x], pafs[:, :, ch_y], image_height
        )
        for i, j, limb_score in pairs:
            id_a, id_b = float(ids_a[i]), float(ids_b[j])
            owners = [r for r in range(len(people)) if people[r, part_a] == id_a or people[r, part_b] == id_b]
            if len(owners) == 1 or (len(owners) >= 2 and _overlap(people[owners[0]], people[owners[1]])):
                row = people[owners[0]]
                if len(owners) >= 2 or row[part_b] != id_b:
                    row[part_b] = id_b
                    row[-1] += 1
                    row[-2] += candidates[int(id_b), 2] + limb_score
            elif len(owners) >= 2:
                # Two partial people joined by this limb: merge the second into the first.
                first, second = owners[0], owners[1]
                people[first, :NUM_KEYPOINTS] += people[second, :NUM_KEYPOINTS] + 1
                people[first, NUM_KEYPOINTS:] += people[second, NUM_KEYPOINTS:]
                people[first, -2] += limb_score
                people = np.delete(people, second, axis=0)
            elif limb_index < FIRST_REDUNDANT_LIMB:
                row = np.full(NUM_KEYPOINTS + 2, -1.0)
                row[part_a], row[part_b] = id_a, id_b
                row[-1] = 2
                row[-2] = candidates[int(id_a), 2] + candidates[int(id_b), 2] + limb_score
                people = np.vstack([people, row])
    keep = (people[:, -1] >= MIN_PARTS) & (people[:, -2] / np.maximum(people[:, -1], 1) >= MIN_MEAN_SCORE)
    return people[keep]


def _overlap(row_a: np.ndarray, row_b: np.ndarray) -> bool:
    """Whether two partial people claim the same part (then they must not be merged)."""
    both = (row_a[:NUM_KEYPOINTS] >= 0) & (row_b[:NUM_KEYPOINTS] >= 0)
    return bool(both.any())


def person_keypoints(candidates: np.ndarray, person: np.ndarray) -> np.ndarray:
    """(18, 2) float32 (x, y) of one assembled person; missing parts are (0, 0)."""
    out = np.zeros((NUM_KEYPOINTS, 2), dtype=np.float32)
    for part in range(NUM_KEYPOINTS):
        cid = int(person[part])
        if cid >= 0:
            out[part] = candidates[cid, :2]
    return out


def _box_area(candidates: np.ndarray, person: np.ndarray) -> float:
    ids = person[:NUM_KEYPOINTS]
    pts = candidates[ids[ids >= 0].astype(np.intp), :2]
    span = pts.max(axis=0) - pts.min(axis=0)
    return float(span[0] * span[1])


def select_person(candidates: np.ndarray, people: np.ndarray) -> int:
    """Index of the person to keep: most detected keypoints, then the larger keypoint bounding box."""
    if len(people) == 0:
        raise NoPersonError("no person detected in the person image")
    counts = (people[:, :NUM_KEYPOINTS] >= 0).sum(axis=1)
    areas = [_box_area(candidates, p) for p in people]
    # max() keeps the first of equal keys, so a full tie goes to the first person found (as upstream).
    return max(range(len(people)), key=lambda r: (int(counts[r]), areas[r]))


def decode_pose(heatmaps: np.ndarray, pafs: np.ndarray) -> np.ndarray:
    """Keypoints of the chosen person from image-sized maps.

    heatmaps: (H, W, 19) (or at least the 18 part channels), pafs: (H, W, 38), both already resized
    to the image. Returns (18, 2) float32 (x, y) in that image's pixels, COCO-18 order, missing = (0, 0).
    Raises NoPersonError when nobody is found.
    """
    if heatmaps.shape[:2] != pafs.shape[:2]:
        raise ValueError(f"heatmaps {heatmaps.shape} and pafs {pafs.shape} differ in size")
    candidates, ids_per_part = find_peaks(heatmaps)
    people = assemble_people(candidates, ids_per_part, np.asarray(pafs, dtype=np.float64))
    chosen = select_person(candidates, people)
    keypoints = person_keypoints(candidates, people[chosen])
    n_found = int((people[chosen, :NUM_KEYPOINTS] >= 0).sum())
    if len(people) > 1:
        logger.info(
            "pose: %d people found; keeping person %d (%d keypoints, the most / largest)",
            len(people),
            chosen,
            n_found,
        )
    else:
        logger.debug("pose: 1 person found with %d keypoints", n_found)
    return keypoints
