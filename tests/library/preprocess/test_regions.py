"""The body regions of a parse (preprocess/regions.py): each ATR label in its region, the hands as the mask rules
keep them (the parsed arm beyond the arm drawn from the pose), garments and accessories in none."""

from __future__ import annotations

import numpy as np

from preprocess.masking import hand_pixels
from preprocess.regions import NO_REGION, REGIONS, body_regions
from tests.helpers.synthetic import PERSON, person_labels

R_WRIST, L_WRIST = 4, 7


def test_each_label_is_in_its_region_and_garments_in_none() -> None:
    labels = person_labels()
    regions = body_regions(labels, PERSON, "hd")
    index = {name: i for i, name in enumerate(REGIONS)}
    assert (regions[labels == 11] == index["face"]).all()
    assert (regions[labels == 2] == index["hair"]).all()
    assert (regions[labels == 18] == index["neck"]).all()
    assert (regions[np.isin(labels, (9, 10))] == index["shoes"]).all()
    assert (regions[labels == 0] == index["background"]).all()
    assert (regions[np.isin(labels, (4, 6))] == NO_REGION).all()  # upper clothes, pants
    arms = np.isin(labels, (14, 15))
    assert set(np.unique(regions[arms])) == {index["arms"], index["hands"]}
    # below the wrists pushed out 1.2x from the elbows (y 262 + 0.2 * 62 = 274) the parsed arm is hand
    assert (regions[300:325][arms[300:325]] == index["hands"]).all()
    assert arms[regions == index["arms"]].all() and arms[regions == index["hands"]].all()
    assert (regions[150:280][arms[150:280]] == index["arms"]).sum() > 3000  # within the drawn arms
    assert (regions[labels == 12] != index["legs"]).all()  # no legs in this parse: nothing is labelled legs


def test_an_arm_whose_wrist_was_not_found_has_no_hand() -> None:
    labels = person_labels()
    keypoints = PERSON.copy()
    keypoints[[R_WRIST, L_WRIST]] = 0  # OpenPose's "not found"
    assert not hand_pixels(labels, keypoints, "hd").any()
    regions = body_regions(labels, keypoints, "hd")
    assert REGIONS.index("hands") not in regions
    assert (regions[np.isin(labels, (14, 15))] == REGIONS.index("arms")).all()
