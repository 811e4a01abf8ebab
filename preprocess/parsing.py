"""Human parsing with the two SCHP networks (ATR and LIP) on ONNX Runtime.

The released try-on weights were trained on masks built from this exact parsing procedure
(docs/upstream.md §6), so the pre- and post-processing below reproduce it step for step: the
affine warp into the square network input, the BGR normalisation, the align-corners upsampling,
the inverse warp of the logits, the hole filling of the upper-body clothes and the neck label.

The pure steps are module-level functions so each can be tested without a model.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from preprocess.errors import CheckpointError, DeviceError, UnsupportedError

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------------

ATR_LABELS: tuple[str, ...] = (
    "background", "hat", "hair", "sunglasses", "upper_clothes", "skirt", "pants", "dress", "belt",
    "left_shoe", "right_shoe", "face", "left_leg", "right_leg", "left_arm", "right_arm", "bag", "scarf",
)
# The ATR label set plus the label this port (like the original) adds for the neck.
LABEL_NAMES: tuple[str, ...] = (*ATR_LABELS, "neck")

UPPER_CLOTHES = 4
FACE = 11
LEFT_ARM = 14
RIGHT_ARM = 15
NECK = 18
LIP_FACE = 13

ATR_INPUT_SIZE = 512
LIP_INPUT_SIZE = 473
ATR_CLASSES = 18
LIP_CLASSES = 20

# Holes in the clothes larger than this (contour area, px) are real objects (a bag, crossed
# hands...) and keep their own label instead of becoming upper clothes.
MAX_FILLED_HOLE_AREA = 2000.0

# BGR order, as the networks were trained.
_MEAN_BGR = np.array([0.406, 0.456, 0.485], dtype=np.float32)
_STD_BGR = np.array([0.225, 0.224, 0.229], dtype=np.float32)

ONNX_INPUT_NAME = "input.1"
_LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec"


# ---------------------------------------------------------------------------------------------
# Geometry
# ---------------------------------------------------------------------------------------------


def center_and_box(width: int, height: int, aspect_ratio: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Center and box size (w, h) of the whole image, widened to the network's aspect ratio.

    Uses the box [0, 0, width - 1, height - 1], as the reference does, so the center of a
    384x512 image is (191.5, 255.5) and its box 511x511.
    """
    box_w = float(width - 1)
    box_h = float(height - 1)
    center = np.array([box_w * 0.5, box_h * 0.5], dtype=np.float64)
    if box_w > aspect_ratio * box_h:
        box_h = box_w / aspect_ratio
    elif box_w < aspect_ratio * box_h:
        box_w = box_h * aspect_ratio
    return center, np.array([box_w, box_h], dtype=np.float64)


def affine_transform(
    center: Sequence[float], scale: Sequence[float], out_size: tuple[int, int], inverse: bool = False
) -> np.ndarray:
    """2x3 matrix mapping the box around `center` onto a network input of `out_size` (width, height).

    The box width `scale[0]` is mapped onto `out_width - 1` pixels and the center onto the
    center of the output; the same factor applies to both axes (no rotation). With
    `inverse=True` the matrix maps network-input pixels back to image pixels.
    """
    out_w, out_h = out_size
    k = (out_w - 1) / float(scale[0])
    cx, cy = float(center[0]), float(center[1])
    ox, oy = (out_w - 1) * 0.5, (out_h - 1) * 0.5
    if not inverse:
        return np.array([[k, 0.0, ox - k * cx], [0.0, k, oy - k * cy]], dtype=np.float64)
    inv = 1.0 / k
    return np.array([[inv, 0.0, cx - inv * ox], [0.0, inv, cy - inv * oy]], dtype=np.float64)


def preprocess(image_bgr: np.ndarray, net_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Warp a BGR uint8 image into the square network input and normalise it.

    Returns (NCHW float32 tensor, center, box). The warp happens on the uint8 image (values are
    rounded back to uint8 before normalising), as in the reference.
    """
    h, w = image_bgr.shape[:2]
    center, box = center_and_box(w, h, 1.0)
    matrix = affine_transform(center, box, (net_size, net_size))
    warped = cv2.warpAffine(
        image_bgr, matrix, (net_size, net_size), flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0),
    )
    x = (warped.astype(np.float32) / 255.0 - _MEAN_BGR) / _STD_BGR
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None]), center, box


def logits_to_image(
    logits: np.ndarray, net_size: int, center: np.ndarray, box: np.ndarray, width: int, height: int
) -> np.ndarray:
    """Reduced-resolution logits (C, h, w) -> logits at image size (H, W, C).

    Upsampled bilinearly with align_corners=True to the network input size, then warped back
    with the inverse affine (bilinear, zeros outside).
    """
    t = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32))[None]
    up = torch.nn.functional.interpolate(t, size=(net_size, net_size), mode="bilinear", align_corners=True)
    up_np = up[0].numpy()
    matrix = affine_transform(center, box, (net_size, net_size), inverse=True)
    out = np.empty((height, width, up_np.shape[0]), dtype=np.float32)
    for c in range(up_np.shape[0]):
        out[:, :, c] = cv2.warpAffine(
            up_np[c], matrix, (width, height), flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_CONSTANT, borderValue=0,
        )
    return out


# ---------------------------------------------------------------------------------------------
# Post-processing
# ---------------------------------------------------------------------------------------------


def _holes(region: np.ndarray) -> np.ndarray:
    """Pixels outside `region` that the outside (4-connected from the corner) cannot reach.

    `region` must have a free border (the caller pads), so the corner is outside.
    """
    canvas = np.where(region, 255, 0).astype(np.uint8)
    flood = np.zeros((canvas.shape[0] + 2, canvas.shape[1] + 2), dtype=np.uint8)
    cv2.floodFill(canvas, flood, (0, 0), 255)
    return canvas == 0


def fill_holes(labels: np.ndarray) -> np.ndarray:
    """Relabel small holes inside the upper clothes + arms as upper clothes (docs/upstream.md §6).

    The map is padded by one background pixel, the region upper clothes (4) + arms (14, 15) is
    flood-filled from the corner, and every enclosed pixel that is neither upper clothes nor arm
    becomes upper clothes, except for enclosed areas whose contour area exceeds 2000 px (those
    keep their label). Arms always keep their label. Returns a new uint8 map.
    """
    padded = np.pad(np.asarray(labels), 1, mode="constant", constant_values=0)
    arms = (padded == LEFT_ARM) | (padded == RIGHT_ARM)
    region = (padded == UPPER_CLOTHES) | arms
    filled = region | _holes(region)
    # Enclosed non-clothes pixels; large ones are kept as they were.
    hole = filled & (padded != UPPER_CLOTHES) & ~arms
    keep = np.zeros(padded.shape, dtype=np.uint8)
    contours, _ = cv2.findContours(hole.astype(np.uint8) * 255, cv2.RETR_CCOMP, cv2.CHAIN_APPROX_TC89_L1)
    for i, contour in enumerate(contours):
        if abs(cv2.contourArea(contour, True)) > MAX_FILLED_HOLE_AREA:
            cv2.drawContours(keep, contours, i, color=255, thickness=-1)
    keep_original = (keep > 0) | arms
    out = np.where(filled & ~keep_original, UPPER_CLOTHES, padded)
    return out[1:-1, 1:-1].astype(np.uint8)


def add_neck(atr: np.ndarray, lip: np.ndarray) -> np.ndarray:
    """Label 18 (neck) where ATR says face (11) but LIP does not (LIP face = 13).

    ATR's "face" covers the neck too; LIP's face stops at the chin, so the difference is the neck
    that the upper-body mask has to include.
    """
    if atr.shape != lip.shape:
        raise ValueError(f"ATR and LIP maps differ in shape: {atr.shape} vs {lip.shape}")
    return np.where((atr == FACE) & (lip != LIP_FACE), NECK, atr).astype(np.uint8)


def palette(n: int = len(LABEL_NAMES)) -> np.ndarray:
    """(n, 3) uint8 colours: label 0 black, the others spread over hue at two brightness levels."""
    colours = np.zeros((n, 3), dtype=np.uint8)
    for i in range(1, n):
        hue = int((i * 180 * 7 / max(n - 1, 1)) % 180)  # OpenCV hue range is 0..179
        value = 255 if i % 2 else 180
        hsv = np.array([[[hue, 220, value]]], dtype=np.uint8)
        colours[i] = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)[0, 0]
    return colours


def colorize(labels: np.ndarray, legend: bool = True) -> Image.Image:
    """Colour picture of a label map, with a legend of the labels present (for --save-intermediates)."""
    labels = np.asarray(labels)
    colours = palette(max(len(LABEL_NAMES), int(labels.max(initial=0)) + 1))
    picture = Image.fromarray(colours[labels])
    if not legend:
        return picture
    present = [int(v) for v in np.unique(labels)]
    font = ImageFont.load_default()
    row = 14
    panel_w = 120
    height = max(picture.height, row * len(present) + 8)
    canvas = Image.new("RGB", (picture.width + panel_w, height), (255, 255, 255))
    canvas.paste(picture, (0, 0))
    draw = ImageDraw.Draw(canvas)
    for i, value in enumerate(present):
        y = 4 + i * row
        x = picture.width + 4
        draw.rectangle([x, y, x + 10, y + 10], fill=tuple(int(c) for c in colours[value]), outline=(0, 0, 0))
        name = LABEL_NAMES[value] if value < len(LABEL_NAMES) else f"label {value}"
        draw.text((x + 14, y - 1), f"{value} {name}", fill=(0, 0, 0), font=font)
    return canvas


# ---------------------------------------------------------------------------------------------
# ONNX Runtime sessions
# ---------------------------------------------------------------------------------------------

PROVIDER_NAMES: dict[str, str] = {
    "cpu": "CPUExecutionProvider",
    "migraphx": "MIGraphXExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "cuda": "CUDAExecutionProvider",
}
_PROVIDER_PACKAGES: dict[str, str] = {
    "cpu": "onnxruntime",
    "migraphx": "onnxruntime-migraphx (AMD GPUs; the successor of the ROCm provider)",
    "rocm": "onnxruntime-rocm (stops at 1.22.x and needs a system ROCm install; "
    "the provider was removed in ONNX Runtime 1.23, use migraphx instead)",
    "cuda": "onnxruntime-gpu (NVIDIA GPUs)",
}
_AUTO_ORDER = ("migraphx", "rocm", "cuda", "cpu")


def _available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def resolve_providers(provider: str, available: Sequence[str] | None = None) -> list[str]:
    """ONNX Runtime provider list for a user choice (auto|cpu|migraphx|rocm|cuda).

    `auto` picks the first of MIGraphX, ROCm, CUDA available and falls back to CPU; an explicit
    choice that this onnxruntime build lacks is an UnsupportedError saying which package provides it.
    A GPU provider is always followed by CPU for the operators it does not cover.
    """
    key = provider.lower()
    if available is None:
        available = _available_providers()
    if key == "auto":
        for name in _AUTO_ORDER:
            if PROVIDER_NAMES[name] in available:
                return _with_cpu(PROVIDER_NAMES[name])
        raise DeviceError(f"no usable ONNX Runtime execution provider; available: {', '.join(available)}")
    if key not in PROVIDER_NAMES:
        raise DeviceError(
            f"unknown parsing provider {provider!r}: use one of auto, {', '.join(PROVIDER_NAMES)}"
        )
    wanted = PROVIDER_NAMES[key]
    if wanted not in available:
        raise UnsupportedError(
            f"ONNX Runtime provider {wanted} was requested for human parsing but this onnxruntime "
            f"install only has {', '.join(available) or 'none'}. It comes with the package "
            f"{_PROVIDER_PACKAGES[key]}; install exactly one onnxruntime package (they all provide the "
            f"same module), or choose the cpu provider."
        )
    return _with_cpu(wanted)


def _with_cpu(name: str) -> list[str]:
    return [name] if name == PROVIDER_NAMES["cpu"] else [name, PROVIDER_NAMES["cpu"]]


def check_model_file(path: Path) -> None:
    """Raise CheckpointError for a missing, empty or Git LFS pointer file, before ORT sees it."""
    hint = "re-download the checkpoints with `ootd download`"
    if not path.exists():
        raise CheckpointError(f"parsing model {path} is missing; {hint}")
    if not path.is_file():
        raise CheckpointError(f"parsing model {path} is not a file; {hint}")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"parsing model {path} is empty (truncated download?); {hint}")
    with path.open("rb") as fh:
        head = fh.read(len(_LFS_POINTER_PREFIX))
    if head == _LFS_POINTER_PREFIX:
        raise CheckpointError(
            f"parsing model {path} is a Git LFS pointer ({size} bytes), not the model itself "
            f"(cloned without git-lfs?); {hint}"
        )


def _default_threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 16))


_LOAD_ERROR_TYPES = ("InvalidProtobuf", "NoSuchFile", "InvalidGraph", "NoModel", "ModelLoadCanceled")
_DEVICE_ERROR_TYPES = ("EPFail", "EngineError", "DeviceReset")


def _session_error(path: Path, providers: list[str], exc: Exception) -> Exception:
    """Turn an ORT session-creation failure into a CheckpointError or DeviceError."""
    kind = type(exc).__name__
    text = str(exc)
    hint = "re-download the checkpoints with `ootd download`"
    looks_like_load = (
        kind in _LOAD_ERROR_TYPES
        or "INVALID_PROTOBUF" in text
        or "Protobuf parsing failed" in text
        or "Load model" in text
    )
    if looks_like_load or (kind not in _DEVICE_ERROR_TYPES and providers == [PROVIDER_NAMES["cpu"]]):
        return CheckpointError(
            f"parsing model {path} cannot be loaded (truncated or corrupt?): {text.strip()}; {hint}"
        )
    return DeviceError(
        f"ONNX Runtime could not create a session on {providers[0]} for {path}: {text.strip()}"
    )


def _network_input_size(session: Any) -> int | None:
    """Static spatial size of the model input when it declares one."""
    shape = session.get_inputs()[0].shape
    if len(shape) == 4 and isinstance(shape[2], int) and isinstance(shape[3], int) and shape[2] == shape[3]:
        return int(shape[2])
    return None


def create_session(
    path: Path, providers: list[str], expected_size: int, *, explicit: bool, verbose: bool = False,
    threads: int | None = None,
) -> tuple[Any, list[str]]:
    """Create and validate one SCHP session; return it with the providers it really uses."""
    import onnxruntime as ort

    check_model_file(path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or _default_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 2 if verbose else 3  # 2 = warnings (fallback reasons), 3 = errors
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:  # ORT raises its own exception types, none shared with Python's
        raise _session_error(path, providers, exc) from exc

    used = list(session.get_providers())
    if providers[0] not in used:
        message = (
            f"ONNX Runtime fell back from {providers[0]} to {', '.join(used)} for {path.name} "
            f"(the provider is installed but could not start; verbose logging shows ONNX Runtime's reason)"
        )
        if explicit:
            raise DeviceError(message)
        logger.warning(message)

    names = [i.name for i in session.get_inputs()]
    if names != [ONNX_INPUT_NAME] or len(session.get_outputs()) < 2:
        raise CheckpointError(
            f"{path} is not an SCHP parsing model (inputs {names}, {len(session.get_outputs())} outputs; "
            f"expected input {ONNX_INPUT_NAME!r} and at least 2 outputs); re-download with `ootd download`"
        )
    size = _network_input_size(session)
    if size is not None and size != expected_size:
        raise CheckpointError(
            f"{path} takes {size}x{size} inputs, expected {expected_size}x{expected_size}: "
            f"are the ATR and LIP files swapped?"
        )
    return session, used


class HumanParser:
    """SCHP ATR + LIP parsing of a person image into ATR labels plus neck (18)."""

    def __init__(
        self,
        atr_path: Path,
        lip_path: Path,
        provider: str = "cpu",
        *,
        verbose: bool = False,
        threads: int | None = None,
    ) -> None:
        requested = resolve_providers(provider)
        explicit = provider.lower() != "auto"
        self.atr_path = Path(atr_path)
        self.lip_path = Path(lip_path)
        self._atr, atr_used = create_session(
            self.atr_path, requested, ATR_INPUT_SIZE, explicit=explicit, verbose=verbose, threads=threads
        )
        self._lip, lip_used = create_session(
            self.lip_path, requested, LIP_INPUT_SIZE, explicit=explicit, verbose=verbose, threads=threads
        )
        # What ORT really runs on (it can silently fall back to CPU): the ATR session's list,
        # plus anything extra the LIP session got.
        self.providers: list[str] = atr_used + [p for p in lip_used if p not in atr_used]
        logger.info("human parsing on ONNX Runtime providers: %s", ", ".join(self.providers))

    def _run(self, session: Any, image_bgr: np.ndarray, net_size: int) -> np.ndarray:
        h, w = image_bgr.shape[:2]
        x, center, box = preprocess(image_bgr, net_size)
        outputs = session.run(None, {ONNX_INPUT_NAME: x})
        logits = np.asarray(outputs[1])[0]
        return np.argmax(logits_to_image(logits, net_size, center, box, w, h), axis=2).astype(np.uint8)

    def parse_raw(self, image: Image.Image) -> tuple[np.ndarray, np.ndarray]:
        """Raw (ATR, LIP) label maps at the image size, before hole filling and neck."""
        rgb = np.asarray(image.convert("RGB"))
        bgr = np.ascontiguousarray(rgb[:, :, ::-1])
        return self._run(self._atr, bgr, ATR_INPUT_SIZE), self._run(self._lip, bgr, LIP_INPUT_SIZE)

    def __call__(self, image: Image.Image) -> np.ndarray:
        """(H, W) uint8 map of ATR labels 0..17 plus 18 = neck for a person image (384x512 expected)."""
        atr, lip = self.parse_raw(image)
        return add_neck(fill_holes(atr), lip)
