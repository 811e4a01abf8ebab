"""Human parsing: geometry, post-processing, sessions and errors, with tiny hand-built ONNX models."""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from PIL import Image

from preprocess import parsing
from preprocess.errors import CheckpointError, DeviceError
from preprocess.parsing import (
    ATR_INPUT_SIZE,
    LIP_INPUT_SIZE,
    HumanParser,
    add_neck,
    affine_transform,
    center_and_box,
    colorize,
    fill_holes,
    resolve_providers,
)

W, H = 384, 512
CPU = "CPUExecutionProvider"


# ---------------------------------------------------------------------------------------------
# Tiny SCHP stand-ins: input.1 [1,3,S,S] -> 4x average pool -> 1x1 conv = logits [1,C,S/4,S/4].
# Output 0 is a decoy (favours label `decoy`), output 1 the real logits, output 2 an "edge" map.
# ---------------------------------------------------------------------------------------------


def make_model(
    path: Path, size: int, classes: int, weight: np.ndarray, bias: np.ndarray, decoy: int = 7
) -> Path:
    """Write an ONNX model whose logits are `weight @ pooled_bgr_input + bias` per cell."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [classes, 3, 1, 1], weight.astype(np.float32).ravel())
    b = helper.make_tensor("b", TensorProto.FLOAT, [classes], bias.astype(np.float32))
    decoy_bias = np.zeros(classes, np.float32)
    decoy_bias[decoy] = 100.0
    w0 = helper.make_tensor("w0", TensorProto.FLOAT, [classes, 3, 1, 1], np.zeros(classes * 3, np.float32))
    b0 = helper.make_tensor("b0", TensorProto.FLOAT, [classes], decoy_bias)
    we = helper.make_tensor("we", TensorProto.FLOAT, [2, 3, 1, 1], np.ones(6, np.float32))
    nodes = [
        helper.make_node("AveragePool", ["input.1"], ["pooled"], kernel_shape=[4, 4], strides=[4, 4]),
        helper.make_node("Conv", ["pooled", "w0", "b0"], ["decoy"]),
        helper.make_node("Conv", ["pooled", "w", "b"], ["logits"]),
        helper.make_node("Conv", ["pooled", "we"], ["edge"]),
    ]
    cells = size // 4
    graph = helper.make_graph(
        nodes,
        "schp_stub",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, size, size])],
        [
            helper.make_tensor_value_info("decoy", TensorProto.FLOAT, [1, classes, cells, cells]),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes, cells, cells]),
            helper.make_tensor_value_info("edge", TensorProto.FLOAT, [1, 2, cells, cells]),
        ],
        initializer=[w, b, w0, b0, we],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def constant_model(path: Path, size: int, classes: int, label: int) -> Path:
    """Logits favour `label` everywhere."""
    bias = np.zeros(classes)
    bias[label] = 10.0
    return make_model(path, size, classes, np.zeros((classes, 3)), bias)


def channel_model(path: Path, size: int, classes: int, label: int, bgr_channel: int) -> Path:
    """`label` where the normalised BGR channel is positive (bright), background (0) elsewhere."""
    weight = np.zeros((classes, 3))
    weight[label, bgr_channel] = 1.0
    return make_model(path, size, classes, weight, np.zeros(classes))


def random_model(path: Path, size: int, classes: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    return make_model(path, size, classes, rng.normal(size=(classes, 3)), rng.normal(size=classes))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("schp")
    return {
        "atr_const": constant_model(d / "atr_const.onnx", ATR_INPUT_SIZE, 18, 2),
        "lip_const": constant_model(d / "lip_const.onnx", LIP_INPUT_SIZE, 20, 2),
        # ATR: upper clothes (4) where blue is bright; face (11) where red is bright would clash,
        # so the neck test gets its own pair below.
        "atr_blue": channel_model(d / "atr_blue.onnx", ATR_INPUT_SIZE, 18, 4, 0),
        "lip_blue": channel_model(d / "lip_blue.onnx", LIP_INPUT_SIZE, 20, 5, 0),
        "atr_red_face": channel_model(d / "atr_red.onnx", ATR_INPUT_SIZE, 18, 11, 2),
        "lip_green_face": channel_model(d / "lip_green.onnx", LIP_INPUT_SIZE, 20, 13, 1),
        "atr_random": random_model(d / "atr_random.onnx", ATR_INPUT_SIZE, 18, 0),
        "lip_random": random_model(d / "lip_random.onnx", LIP_INPUT_SIZE, 20, 1),
    }


def boundary_band(labels: np.ndarray, radius: int) -> np.ndarray:
    """Pixels within `radius` of a label change (where resampling may legitimately differ)."""
    k = np.ones((2 * radius + 1, 2 * radius + 1), np.uint8)
    lab = labels.astype(np.uint8)
    return cv2.dilate(lab, k) != cv2.erode(lab, k)


def rect_image(rect: tuple[int, int, int, int], rgb: tuple[int, int, int]) -> np.ndarray:
    img = np.zeros((H, W, 3), np.uint8)
    x0, y0, x1, y1 = rect
    img[y0:y1, x0:x1] = rgb
    return img


# ---------------------------------------------------------------------------------------------
# Geometry
# ---------------------------------------------------------------------------------------------


def test_center_and_box_widen_to_square() -> None:
    center, box = center_and_box(W, H, 1.0)
    np.testing.assert_allclose(center, [191.5, 255.5])
    np.testing.assert_allclose(box, [511, 511])


def test_affine_atr_is_a_translation_and_inverse_round_trips() -> None:
    center, box = center_and_box(W, H)
    fwd = affine_transform(center, box, (ATR_INPUT_SIZE, ATR_INPUT_SIZE))
    np.testing.assert_allclose(fwd, [[1, 0, 64], [0, 1, 0]], atol=1e-9)
    for size in (ATR_INPUT_SIZE, LIP_INPUT_SIZE):
        fwd = np.vstack([affine_transform(center, box, (size, size)), [0, 0, 1]])
        inv = np.vstack([affine_transform(center, box, (size, size), inverse=True), [0, 0, 1]])
        np.testing.assert_allclose(fwd @ inv, np.eye(3), atol=1e-12)
        # The image center lands on the network-input center; the box spans the full input.
        np.testing.assert_allclose(fwd @ [191.5, 255.5, 1], [(size - 1) / 2, (size - 1) / 2, 1])
        np.testing.assert_allclose(fwd @ [191.5, 0, 1], [(size - 1) / 2, 0, 1], atol=1e-9)


# ---------------------------------------------------------------------------------------------
# Post-processing on hand-made maps
# ---------------------------------------------------------------------------------------------


def _shirt() -> np.ndarray:
    labels = np.zeros((H, W), np.uint8)
    labels[100:400, 80:300] = 4
    return labels


def test_fill_holes_small_hole_becomes_upper_clothes() -> None:
    labels = _shirt()
    labels[200:210, 150:160] = 0
    labels[250:255, 200:230] = 16
    out = fill_holes(labels)
    assert (out[100:400, 80:300] == 4).all()
    assert out.dtype == np.uint8 and out.shape == labels.shape


def test_fill_holes_large_hole_keeps_label() -> None:
    labels = _shirt()
    labels[150:210, 120:180] = 16  # 60x60 bag: contour area 59*59 > 2000
    out = fill_holes(labels)
    assert (out[150:210, 120:180] == 16).all()


def test_fill_holes_threshold_is_contour_area() -> None:
    labels = _shirt()
    labels[150:195, 120:165] = 0  # 45x45 = 2025 px, but contour area 44*44 = 1936 <= 2000: filled
    labels[250:301, 120:171] = 0  # 51x51: contour area 2500: kept
    out = fill_holes(labels)
    assert (out[150:195, 120:165] == 4).all()
    assert (out[250:301, 120:171] == 0).all()


def test_fill_holes_keeps_arms_and_fills_holes_bounded_by_arms() -> None:
    labels = _shirt()
    labels[150:250, 80:120] = 14  # arm along the shirt's edge
    labels[180:190, 110:130] = 0  # hole bounded by arm and shirt
    labels[300:320, 290:300] = 15
    out = fill_holes(labels)
    assert (out[labels == 14] == 14).all() and (out[labels == 15] == 15).all()
    hole = (labels == 0) & (np.arange(W)[None, :] >= 110) & (np.arange(H)[:, None] >= 180)
    hole[190:, :] = False
    hole[:, 130:] = False
    assert (out[hole] == 4).all()


def test_fill_holes_leaves_gaps_open_to_the_outside() -> None:
    labels = _shirt()
    labels[200:210, 80:150] = 0  # notch reaching the shirt's edge: not a hole
    labels[0:20, 0:10] = 4
    labels[5:10, 0:5] = 0  # a "hole" touching the image border is open via the padding
    out = fill_holes(labels)
    assert (out[200:210, 80:150] == 0).all()
    assert (out[5:10, 0:5] == 0).all()


def test_fill_holes_does_not_touch_other_labels() -> None:
    labels = _shirt()
    labels[400:450, 100:200] = 6
    labels[40:90, 150:230] = 11
    out = fill_holes(labels)
    np.testing.assert_array_equal(out[labels != 4], labels[labels != 4])


def test_add_neck() -> None:
    atr = np.zeros((H, W), np.uint8)
    atr[50:150, 150:230] = 11
    atr[300:400, 100:200] = 4
    lip = np.zeros((H, W), np.uint8)
    lip[50:120, 150:230] = 13
    lip[300:310, 100:110] = 13  # LIP face where ATR does not see one: ignored
    out = add_neck(atr, lip)
    assert (out[50:120, 150:230] == 11).all()
    assert (out[120:150, 150:230] == 18).all()
    assert (out[300:400, 100:200] == 4).all()
    assert set(np.unique(out)) == {0, 4, 11, 18}


def test_add_neck_shape_mismatch() -> None:
    with pytest.raises(ValueError):
        add_neck(np.zeros((4, 4), np.uint8), np.zeros((4, 5), np.uint8))


def test_colorize_has_legend_and_distinct_colours() -> None:
    labels = np.zeros((H, W), np.uint8)
    labels[100:200, :] = 4
    labels[300:400, :] = 18
    img = colorize(labels)
    assert img.mode == "RGB" and img.height == H and img.width > W
    arr = np.asarray(img)
    colours = {tuple(arr[50, 10]), tuple(arr[150, 10]), tuple(arr[350, 10])}
    assert len(colours) == 3
    assert colorize(labels, legend=False).size == (W, H)
    assert len({tuple(c) for c in parsing.palette()}) == len(parsing.LABEL_NAMES)


# ---------------------------------------------------------------------------------------------
# End-to-end through ONNX Runtime
# ---------------------------------------------------------------------------------------------


def test_constant_logits_give_constant_map_and_use_output_1(models: dict[str, Path]) -> None:
    parser = HumanParser(models["atr_const"], models["lip_const"], "cpu")
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (H, W, 3), dtype=np.uint8))
    atr, lip = parser.parse_raw(img)
    assert atr.shape == (H, W) and lip.shape == (H, W)
    assert (atr == 2).all() and (lip == 2).all()  # output 0 would have said 7
    out = parser(img)
    assert out.dtype == np.uint8 and out.shape == (H, W) and (out == 2).all()


def test_brightness_regions_survive_affine_round_trip(models: dict[str, Path]) -> None:
    parser = HumanParser(models["atr_blue"], models["lip_blue"], "cpu")
    rect = (97, 71, 291, 413)  # not aligned to the 4-px cells on purpose
    img = Image.fromarray(rect_image(rect, (0, 0, 255)))  # blue in RGB
    atr, lip = parser.parse_raw(img)
    x0, y0, x1, y1 = rect
    for got, label in ((atr, 4), (lip, 5)):
        expected = np.zeros((H, W), np.uint8)
        expected[y0:y1, x0:x1] = label
        band = boundary_band(expected, 3)
        np.testing.assert_array_equal(got[~band], expected[~band])
        assert set(np.unique(got)) == {0, label}


def test_neck_end_to_end(models: dict[str, Path]) -> None:
    parser = HumanParser(models["atr_red_face"], models["lip_green_face"], "cpu")
    img = np.zeros((H, W, 3), np.uint8)
    img[60:200, 140:250, 0] = 255  # red: ATR face (head + neck)
    img[60:150, 140:250, 1] = 255  # green: LIP face (head only)
    out = parser(Image.fromarray(img))
    expected = np.zeros((H, W), np.uint8)
    expected[60:200, 140:250] = 18
    expected[60:150, 140:250] = 11
    band = boundary_band(expected, 3)
    np.testing.assert_array_equal(out[~band], expected[~band])


def test_accepts_non_rgb_input(models: dict[str, Path]) -> None:
    parser = HumanParser(models["atr_const"], models["lip_const"], "cpu")
    out = parser(Image.new("L", (W, H), 128))
    assert out.shape == (H, W)


# ---------------------------------------------------------------------------------------------
# Providers
# ---------------------------------------------------------------------------------------------


def test_auto_gives_cpu_here(models: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="preprocess.parsing"):
        parser = HumanParser(models["atr_const"], models["lip_const"], "auto")
    assert parser.providers == [CPU]
    assert CPU in caplog.text


def test_unavailable_provider_is_device_error(models: dict[str, Path]) -> None:
    with pytest.raises(DeviceError, match="onnxruntime-migraphx"):
        HumanParser(models["atr_const"], models["lip_const"], "migraphx")
    with pytest.raises(DeviceError, match="onnxruntime-gpu"):
        resolve_providers("cuda", [CPU])
    with pytest.raises(DeviceError, match="unknown"):
        resolve_providers("tpu", [CPU])


def test_resolve_providers_order() -> None:
    all_gpu = ["MIGraphXExecutionProvider", "ROCMExecutionProvider", "CUDAExecutionProvider", CPU]
    assert resolve_providers("auto", all_gpu) == ["MIGraphXExecutionProvider", CPU]
    assert resolve_providers("auto", all_gpu[1:]) == ["ROCMExecutionProvider", CPU]
    assert resolve_providers("auto", all_gpu[2:]) == ["CUDAExecutionProvider", CPU]
    assert resolve_providers("AUTO", [CPU]) == [CPU]
    assert resolve_providers("cuda", all_gpu) == ["CUDAExecutionProvider", CPU]
    assert resolve_providers("cpu", all_gpu) == [CPU]


def test_silent_fallback_is_reported(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider ORT lists but cannot start: explicit request -> DeviceError, auto -> warning + CPU."""
    monkeypatch.setattr(parsing, "_available_providers", lambda: ["CUDAExecutionProvider", CPU])
    import onnxruntime as ort

    real = ort.InferenceSession

    def fake_session(path: str, sess_options: object = None, providers: list[str] | None = None) -> object:
        return real(path, sess_options=sess_options, providers=[CPU])

    monkeypatch.setattr(ort, "InferenceSession", fake_session)
    with pytest.raises(DeviceError, match="fell back"):
        HumanParser(models["atr_const"], models["lip_const"], "cuda")
    parser = HumanParser(models["atr_const"], models["lip_const"], "auto")
    assert parser.providers == [CPU]


# ---------------------------------------------------------------------------------------------
# Broken checkpoints
# ---------------------------------------------------------------------------------------------


def test_missing_file(models: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "parsing_lip.onnx"
    with pytest.raises(CheckpointError, match="parsing_lip.onnx") as err:
        HumanParser(models["atr_const"], missing, "cpu")
    assert "ootd download" in str(err.value)


def test_lfs_pointer(models: dict[str, Path], tmp_path: Path) -> None:
    pointer = tmp_path / "parsing_atr.onnx"
    pointer.write_text(
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:0000000000000000000000000000000000000000000000000000000000000000\nsize 266859305\n"
    )
    with pytest.raises(CheckpointError, match="LFS pointer") as err:
        HumanParser(pointer, models["lip_const"], "cpu")
    assert "parsing_atr.onnx" in str(err.value) and "ootd download" in str(err.value)


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.6])
def test_truncated_file(models: dict[str, Path], tmp_path: Path, fraction: float) -> None:
    data = models["atr_random"].read_bytes()
    cut = tmp_path / "parsing_atr.onnx"
    cut.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(CheckpointError, match="parsing_atr.onnx") as err:
        HumanParser(cut, models["lip_const"], "cpu")
    assert "ootd download" in str(err.value)


def test_swapped_files(models: dict[str, Path]) -> None:
    with pytest.raises(CheckpointError, match="swapped"):
        HumanParser(models["lip_const"], models["atr_const"], "cpu")


def test_random_weights_smoke(models: dict[str, Path]) -> None:
    parser = HumanParser(models["atr_random"], models["lip_random"], "cpu", threads=2)
    img = Image.fromarray(np.random.default_rng(3).integers(0, 255, (H, W, 3), dtype=np.uint8))
    out = parser(img)
    assert out.shape == (H, W) and out.dtype == np.uint8 and out.max() <= 18
