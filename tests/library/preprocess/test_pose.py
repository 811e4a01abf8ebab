"""OpenPose body: network layout and checkpoint loading, numpy decoding on synthetic maps, estimator."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from preprocess.errors import CheckpointError, NoPersonError
from preprocess.pose import (
    BodyPoseNet,
    PoseEstimator,
    draw_pose,
    expected_state_dict_shapes,
    load_body_pose,
    network_input,
)
from preprocess.pose_decode import decode_pose
from tests.helpers.synthetic import PERSON, render_maps

W, H = 384, 512

def transformed(points: np.ndarray, scale: float, dx: float, dy: float) -> np.ndarray:
    """The skeleton scaled about its neck and moved; rounded so blobs sit on pixel centres."""
    neck = points[1]
    out = np.round((points - neck) * scale + neck + (dx, dy))
    out[np.isnan(points).any(axis=1)] = np.nan
    return out


def without(points: np.ndarray, parts: list[int]) -> np.ndarray:
    out = points.copy()
    out[parts] = np.nan
    return out


def assert_keypoints(found: np.ndarray, expected: np.ndarray, tol: float = 1.0) -> None:
    assert found.shape == (18, 2) and found.dtype == np.float32
    for part in range(18):
        if np.isnan(expected[part]).any():
            assert tuple(found[part]) == (0.0, 0.0), f"part {part} should be missing, got {found[part]}"
        else:
            err = np.abs(found[part] - expected[part]).max()
            assert err <= tol, f"part {part}: {found[part]} vs {expected[part]}"


# ----------------------------------------------------------------------------- decoding


def test_decode_one_person() -> None:
    heat, pafs = render_maps([PERSON])
    assert_keypoints(decode_pose(heat, pafs), PERSON)


def test_decode_partial_person_missing_wrists() -> None:
    person = without(PERSON, [4, 7])
    heat, pafs = render_maps([person])
    kp = decode_pose(heat, pafs)
    assert_keypoints(kp, person)
    assert (kp[[4, 7]] == 0).all()


def test_decode_empty_maps_raise_no_person() -> None:
    heat = np.zeros((H, W, 19), np.float32)
    heat[:, :, 18] = 1.0
    with pytest.raises(NoPersonError, match="no person detected"):
        decode_pose(heat, np.zeros((H, W, 38), np.float32))


def test_decode_isolated_parts_without_limbs_raise_no_person() -> None:
    heat, _ = render_maps([PERSON])
    with pytest.raises(NoPersonError):
        decode_pose(heat, np.zeros((H, W, 38), np.float32))


def test_two_people_most_keypoints_wins_over_size(caplog: pytest.LogCaptureFixture) -> None:
    big_partial = without(transformed(PERSON, 1.0, -90, 0), [4, 7, 16])  # 15 keypoints, large
    small_full = transformed(PERSON, 0.6, 100, 20)  # 18 keypoints, small
    heat, pafs = render_maps([big_partial, small_full])
    with caplog.at_level(logging.DEBUG, logger="preprocess.pose_decode"):
        kp = decode_pose(heat, pafs)
    assert_keypoints(kp, small_full)
    assert "2 people found" in caplog.text


@pytest.mark.parametrize("big_first", [True, False])
def test_two_people_tie_broken_by_bounding_box(big_first: bool) -> None:
    big = transformed(PERSON, 1.0, -90, 0)
    small = transformed(PERSON, 0.7, 100, 0)
    # Move one of them down so the assembly meets it second: the choice must not depend on order.
    if big_first:
        small = transformed(small, 1.0, 0, 40)
    else:
        big = transformed(big, 1.0, 0, 40)
    heat, pafs = render_maps([big, small])
    assert_keypoints(decode_pose(heat, pafs), big)


def test_decode_rejects_mismatched_maps() -> None:
    with pytest.raises(ValueError):
        decode_pose(np.zeros((10, 10, 19)), np.zeros((10, 12, 38)))


# ----------------------------------------------------------------------------- network and checkpoint

# The released body_pose_model.pth (lllyasviel/Annotators, also in levihsu/OOTDiffusion) holds the
# Caffe layer names flat: the reference loader maps "model0.conv1_1.weight" -> "conv1_1.weight" etc.
FRONT_LAYERS = [
    "conv1_1", "conv1_2", "conv2_1", "conv2_2", "conv3_1", "conv3_2", "conv3_3", "conv3_4",
    "conv4_1", "conv4_2", "conv4_3_CPM", "conv4_4_CPM",
]  # fmt: skip
STAGE1_LAYERS = [f"conv5_{i}_CPM_L{b}" for b in (1, 2) for i in range(1, 6)]
LATER_LAYERS = [f"Mconv{i}_stage{s}_L{b}" for s in range(2, 7) for b in (1, 2) for i in range(1, 8)]
RELEASED_KEYS = {f"{n}.{p}" for n in FRONT_LAYERS + STAGE1_LAYERS + LATER_LAYERS for p in ("weight", "bias")}
RELEASED_PARAMETERS = 52_311_446  # x 4 bytes = the ~209 MB of the released file


@pytest.fixture(scope="module")
def random_net() -> BodyPoseNet:
    torch.manual_seed(0)
    return BodyPoseNet().eval()


@pytest.fixture(scope="module")
def net_state(random_net: BodyPoseNet) -> dict[str, torch.Tensor]:
    return random_net.state_dict()


@pytest.fixture(scope="module")
def checkpoint(
    tmp_path_factory: pytest.TempPathFactory, net_state: dict[str, torch.Tensor]
) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("openpose") / "body_pose_model.pth"
    torch.save(net_state, path)
    yield path
    path.unlink(missing_ok=True)  # ~209 MB: do not leave it in pytest's kept temp folders


def light_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Same keys and shapes, but each tensor is a broadcast scalar, so the saved file is tiny."""
    return {k: torch.zeros(1).expand(v.shape) for k, v in state.items()}


def test_state_dict_keys_match_released_checkpoint(net_state: dict[str, torch.Tensor]) -> None:
    assert len(RELEASED_KEYS) == 184
    assert set(net_state) == RELEASED_KEYS
    assert set(expected_state_dict_shapes()) == RELEASED_KEYS
    assert sum(v.numel() for v in net_state.values()) == RELEASED_PARAMETERS
    assert net_state["Mconv1_stage2_L1.weight"].shape == (128, 185, 7, 7)
    assert net_state["conv5_5_CPM_L1.weight"].shape == (38, 512, 1, 1)
    assert net_state["Mconv7_stage6_L2.weight"].shape == (19, 128, 1, 1)


def test_forward_shapes(random_net: BodyPoseNet) -> None:
    with torch.inference_mode():
        pafs, heatmaps = random_net(torch.randn(2, 3, 32, 24))
    assert pafs.shape == (2, 38, 4, 3)
    assert heatmaps.shape == (2, 19, 4, 3)


def test_load_round_trip(checkpoint: Path, net_state: dict[str, torch.Tensor]) -> None:
    net = load_body_pose(checkpoint, "cpu")
    assert isinstance(net, BodyPoseNet) and not net.training
    loaded = net.state_dict()
    assert all(torch.equal(loaded[k], net_state[k]) for k in net_state)
    assert not any(p.requires_grad for p in net.parameters())


def test_load_renamed_key(tmp_path: Path, net_state: dict[str, torch.Tensor]) -> None:
    state = light_copy(net_state)
    state["conv1_1.weights"] = state.pop("conv1_1.weight")
    path = tmp_path / "body_pose_model.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointError) as err:
        load_body_pose(path, "cpu")
    message = str(err.value)
    assert str(path) in message and "ootd download" in message and "\n" not in message
    assert "conv1_1.weight" in message and "conv1_1.weights" in message


def test_load_wrong_shape(tmp_path: Path, net_state: dict[str, torch.Tensor]) -> None:
    state = light_copy(net_state)
    state["conv5_5_CPM_L2.weight"] = torch.zeros(18, 512, 1, 1)
    path = tmp_path / "body_pose_model.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="conv5_5_CPM_L2.weight"):
        load_body_pose(path, "cpu")


def test_load_truncated(tmp_path: Path, checkpoint: Path) -> None:
    path = tmp_path / "body_pose_model.pth"
    with open(checkpoint, "rb") as src:
        path.write_bytes(src.read(1_000_000))
    with pytest.raises(CheckpointError) as err:
        load_body_pose(path, "cpu")
    assert str(path) in str(err.value) and "ootd download" in str(err.value)


def test_load_missing(tmp_path: Path) -> None:
    path = tmp_path / "openpose" / "ckpts" / "body_pose_model.pth"
    with pytest.raises(CheckpointError) as err:
        load_body_pose(path, "cpu")
    assert str(path) in str(err.value) and "ootd download" in str(err.value)


class _Booby:
    triggered = False

    def __reduce__(self):  # noqa: ANN204
        return (_Booby._trigger, ())

    @staticmethod
    def _trigger() -> None:
        _Booby.triggered = True


def test_load_never_fully_unpickles(tmp_path: Path) -> None:
    path = tmp_path / "body_pose_model.pth"
    torch.save({"conv1_1.weight": _Booby()}, path)
    with pytest.raises(CheckpointError, match="unreadable"):
        load_body_pose(path, "cpu")
    assert not _Booby.triggered


def test_load_not_a_state_dict(tmp_path: Path) -> None:
    path = tmp_path / "body_pose_model.pth"
    torch.save([torch.zeros(1)], path)
    with pytest.raises(CheckpointError, match="state dict"):
        load_body_pose(path, "cpu")


# ----------------------------------------------------------------------------- estimator


def person_image() -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (H, W, 3), dtype=np.uint8), "RGB")


def test_estimator_with_maps_fn_returns_image_keypoints() -> None:
    image = person_image()
    seen: list[np.ndarray] = []
    heat, pafs = render_maps([PERSON])

    def maps_fn(bgr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        seen.append(bgr)
        return heat, pafs

    kp = PoseEstimator(None, maps_fn=maps_fn)(image)
    assert_keypoints(kp, PERSON)
    (bgr,) = seen
    assert bgr.shape == (H, W, 3) and bgr.dtype == np.uint8
    assert np.array_equal(bgr, np.asarray(image)[:, :, ::-1])


def test_estimator_no_person() -> None:
    empty = (np.zeros((H, W, 19), np.float32), np.zeros((H, W, 38), np.float32))
    with pytest.raises(NoPersonError):
        PoseEstimator(None, maps_fn=lambda bgr: empty)(person_image())


def test_estimator_needs_net_or_maps_fn() -> None:
    with pytest.raises(ValueError):
        PoseEstimator(None)


def test_network_input_scaling_and_padding() -> None:
    bgr = np.zeros((H, W, 3), np.uint8)
    bgr[:, :, 0] = 255  # blue
    tensor, resized = network_input(bgr)
    # 0.5 * 368 / 512 = 0.359375: 512x384 -> 184x138, padded right to 184x144.
    assert resized == (184, 138)
    assert tensor.shape == (1, 3, 184, 144) and tensor.dtype == np.float32
    assert np.allclose(tensor[0, 0, :, :138], 255 / 256 - 0.5)  # channel 0 stays blue (BGR in)
    assert np.allclose(tensor[0, 1:, :, :138], -0.5)
    assert np.allclose(tensor[0, :, :, 138:], 0.0)  # pad value 128 -> 0


class _FakeNet(BodyPoseNet):
    """Returns a single-cell heatmap spike at a known output cell, to check the map geometry."""

    def __init__(self, cell: tuple[int, int]) -> None:
        torch.nn.Module.__init__(self)
        self.cell = cell
        self.inputs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.inputs.append(x)
        b, _, h, w = x.shape
        heat = torch.zeros(b, 19, h // 8, w // 8)
        heat[:, 0, self.cell[1], self.cell[0]] = 1.0
        return torch.zeros(b, 38, h // 8, w // 8), heat


def test_network_maps_geometry() -> None:
    gx, gy = 9, 11
    estimator = PoseEstimator(_FakeNet((gx, gy)))
    heat, pafs = estimator.network_maps(np.asarray(person_image())[:, :, ::-1].copy())
    assert heat.shape == (H, W, 19) and pafs.shape == (H, W, 38)
    (x,) = estimator.net.inputs
    assert tuple(x.shape) == (1, 3, 184, 144)
    y_img, x_img = np.unravel_index(np.argmax(heat[:, :, 0]), heat.shape[:2])
    # Output cell centre -> stride-8 map (8g + 3.5) -> image (scale 512/184 = 384/138).
    scale = H / 184
    assert abs(x_img - ((8 * gx + 4) * scale - 0.5)) <= 2
    assert abs(y_img - ((8 * gy + 4) * scale - 0.5)) <= 2


def test_from_checkpoint_timing_full_size_random_weights(checkpoint: Path) -> None:
    image = person_image()
    start = time.perf_counter()
    estimator = PoseEstimator.from_checkpoint(checkpoint, "cpu")
    loaded = time.perf_counter()
    try:
        kp = estimator(image)
        outcome = f"{int((kp != 0).any(axis=1).sum())} keypoints"
    except NoPersonError:
        outcome = "NoPersonError"
    done = time.perf_counter()
    print(
        f"\n[pose timing] from_checkpoint {loaded - start:.2f}s + one 384x512 call {done - loaded:.2f}s"
        f" = {done - start:.2f}s on CPU ({torch.get_num_threads()} threads; {outcome})"
    )


# ----------------------------------------------------------------------------- drawing


def test_draw_pose_same_size_and_changed() -> None:
    image = Image.new("RGB", (W, H), (40, 40, 40))
    drawn = draw_pose(image, PERSON.astype(np.float32))
    assert drawn.size == image.size and drawn.mode == "RGB"
    assert not np.array_equal(np.asarray(drawn), np.asarray(image))
    assert np.asarray(image).max() == 40  # the input is untouched
    # Far from the skeleton the photo is unchanged.
    assert np.array_equal(np.asarray(drawn)[:40, :40], np.asarray(image)[:40, :40])


def test_draw_pose_skips_missing_keypoints() -> None:
    image = Image.new("RGB", (W, H), (0, 0, 0))
    keypoints = np.zeros((18, 2), np.float32)
    assert np.array_equal(np.asarray(draw_pose(image, keypoints)), np.asarray(image))
