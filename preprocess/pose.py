"""OpenPose body keypoints (COCO-18) for the inpainting mask (docs/upstream.md §7).

The network is the CMU two-branch body model; its parameter names are those of the released
`body_pose_model.pth`, so that file loads as is. Pre- and post-processing reproduce the reference
single-scale inference (box 368, scale 0.5, stride 8, pad value 128), because the mask is tuned to
the keypoints that procedure gives. Decoding lives in `pose_decode` (pure numpy).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import Image
from torch import nn

from preprocess.errors import CheckpointError
from preprocess.pose_decode import (
    KEYPOINT_NAMES,
    LIMBS,
    NUM_HEATMAPS,
    NUM_KEYPOINTS,
    NUM_PAFS,
    decode_pose,
)

__all__ = [
    "KEYPOINT_NAMES",
    "BodyPoseNet",
    "MapsFn",
    "PoseEstimator",
    "decode_pose",
    "draw_pose",
    "expected_state_dict_shapes",
    "load_body_pose",
    "network_input",
    "maps_from_network_output",
]

logger = logging.getLogger(__name__)

BOX_SIZE = 368
SCALE = 0.5
STRIDE = 8
PAD_VALUE = 128

# (name, in, out, kernel) of the VGG-19 front (to conv4_2) and the two CPM adaptation layers.
# A 2x2 max-pool follows conv1_2, conv2_2 and conv3_4. Every layer here is followed by a ReLU.
_FRONT = (
    ("conv1_1", 3, 64, 3),
    ("conv1_2", 64, 64, 3),
    ("conv2_1", 64, 128, 3),
    ("conv2_2", 128, 128, 3),
    ("conv3_1", 128, 256, 3),
    ("conv3_2", 256, 256, 3),
    ("conv3_3", 256, 256, 3),
    ("conv3_4", 256, 256, 3),
    ("conv4_1", 256, 512, 3),
    ("conv4_2", 512, 512, 3),
    ("conv4_3_CPM", 512, 256, 3),
    ("conv4_4_CPM", 256, 128, 3),
)
_POOL_AFTER = frozenset({"conv1_2", "conv2_2", "conv3_4"})
_FEATURES = 128
_STAGES = 6
_BRANCH_OUT = {1: NUM_PAFS, 2: NUM_HEATMAPS}  # branch L1: PAFs, branch L2: part heatmaps


def _stage_layers(stage: int, branch: int) -> list[tuple[str, int, int, int]]:
    """(name, in, out, kernel) of one branch of one stage; the last layer has no ReLU."""
    out = _BRANCH_OUT[branch]
    if stage == 1:
        names = [f"conv5_{i}_CPM_L{branch}" for i in range(1, 6)]
        shapes = [(_FEATURES, 128, 3), (128, 128, 3), (128, 128, 3), (128, 512, 1), (512, out, 1)]
    else:
        names = [f"Mconv{i}_stage{stage}_L{branch}" for i in range(1, 8)]
        cat = NUM_PAFS + NUM_HEATMAPS + _FEATURES  # previous PAFs, previous heatmaps, features
        shapes = [(cat, 128, 7)] + [(128, 128, 7)] * 4 + [(128, 128, 1), (128, out, 1)]
    return [(n, i, o, k) for n, (i, o, k) in zip(names, shapes, strict=True)]


def expected_state_dict_shapes() -> dict[str, tuple[int, ...]]:
    """Every key of the released body_pose_model.pth and its tensor shape."""
    layers = list(_FRONT)
    for stage in range(1, _STAGES + 1):
        for branch in (1, 2):
            layers += _stage_layers(stage, branch)
    shapes: dict[str, tuple[int, ...]] = {}
    for name, cin, cout, k in layers:
        shapes[f"{name}.weight"] = (cout, cin, k, k)
        shapes[f"{name}.bias"] = (cout,)
    return shapes


class BodyPoseNet(nn.Module):
    """CMU OpenPose COCO body network: image (B,3,H,W) -> PAFs (B,38,H/8,W/8), heatmaps (B,19,H/8,W/8).

    Layers are registered directly on the module under their Caffe names, so `state_dict()` has
    exactly the flat keys of the released checkpoint (`conv1_1.weight`, `Mconv7_stage6_L2.bias`, ...).
    """

    def __init__(self) -> None:
        super().__init__()
        for name, cin, cout, k in _FRONT:
            self.add_module(name, nn.Conv2d(cin, cout, k, padding=k // 2))
        self._stages: list[tuple[list[str], list[str]]] = []
        for stage in range(1, _STAGES + 1):
            names: list[list[str]] = []
            for branch in (1, 2):
                layers = _stage_layers(stage, branch)
                for name, cin, cout, k in layers:
                    self.add_module(name, nn.Conv2d(cin, cout, k, padding=k // 2))
                names.append([n for n, *_ in layers])
            self._stages.append((names[0], names[1]))

    def _run(self, x: torch.Tensor, names: list[str]) -> torch.Tensor:
        for i, name in enumerate(names):
            x = getattr(self, name)(x)
            if i < len(names) - 1:
                x = torch.relu(x)
        return x

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for name, *_ in _FRONT:
            x = torch.relu(getattr(self, name)(x))
            if name in _POOL_AFTER:
                x = nn.functional.max_pool2d(x, kernel_size=2, stride=2)
        features = x
        pafs = heatmaps = x
        for i, (paf_names, heat_names) in enumerate(self._stages):
            inp = features if i == 0 else torch.cat([pafs, heatmaps, features], dim=1)
            pafs, heatmaps = self._run(inp, paf_names), self._run(inp, heat_names)
        return pafs, heatmaps


def _bad_checkpoint(path: Path, problem: str) -> CheckpointError:
    return CheckpointError(f"OpenPose body model {path} {problem}: re-download it with `ootd download`")


def _short_list(keys: list[str], limit: int = 3) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def load_body_pose(path: Path, device: torch.device | str = "cpu") -> BodyPoseNet:
    """Build the body network from the released state dict, in eval mode on `device`.

    Loads with `weights_only=True` (never full unpickling) and checks every key and shape first, so a
    wrong, truncated or partial file becomes one CheckpointError naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise _bad_checkpoint(path, "is missing")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated zip, foreign pickle, permission, ...: all mean "bad file"
        raise _bad_checkpoint(path, f"is unreadable or truncated ({type(exc).__name__})") from exc
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise _bad_checkpoint(path, "is not a plain state dict of tensors")
    expected = expected_state_dict_shapes()
    missing = [k for k in expected if k not in state]
    unexpected = [str(k) for k in state if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys {_short_list(missing)}")
        if unexpected:
            parts.append(f"unexpected keys {_short_list(unexpected)}")
        raise _bad_checkpoint(path, "does not match the OpenPose body model (" + "; ".join(parts) + ")")
    wrong = [k for k, shape in expected.items() if tuple(state[k].shape) != shape]
    if wrong:
        problem = f"does not match the OpenPose body model (wrong shapes: {_short_list(wrong)})"
        raise _bad_checkpoint(path, problem)
    net = BodyPoseNet()
    net.load_state_dict({k: v.float() for k, v in state.items()})
    net.requires_grad_(False)
    return net.eval().to(device)


def _resize(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize like the reference annotator: area filter when shrinking, Lanczos-4 when enlarging."""
    src_h, src_w = x.shape[:2]
    grow = (height + width) / (src_h + src_w)
    interp = cv2.INTER_AREA if grow < 1 else cv2.INTER_LANCZOS4
    out = cv2.resize(x, (width, height), interpolation=interp)
    return out[:, :, None] if out.ndim == 2 and x.ndim == 3 else out


def network_input(bgr: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
    """BGR uint8 image -> normalized (1,3,H',W') float32 network input, and (resized H, resized W).

    Scaled so its height is 0.5 x 368, padded bottom/right with 128 to a multiple of 8, then x/256 - 0.5.
    """
    h, w = bgr.shape[:2]
    scale = SCALE * BOX_SIZE / h
    rh, rw = int(h * scale), int(w * scale)
    resized = _resize(bgr, rh, rw)
    ph, pw = -(-rh // STRIDE) * STRIDE, -(-rw // STRIDE) * STRIDE
    padded = np.full((ph, pw, 3), PAD_VALUE, dtype=np.uint8)
    padded[:rh, :rw] = resized
    tensor = padded.astype(np.float32).transpose(2, 0, 1)[None] / 256.0 - 0.5
    return np.ascontiguousarray(tensor), (rh, rw)


def maps_from_network_output(
    out_map: np.ndarray, resized_hw: tuple[int, int], image_hw: tuple[int, int]
) -> np.ndarray:
    """(h/8, w/8, C) network map -> (H, W, C) map over the original image.

    Upsampled by the stride, cropped to the unpadded area, then resized to the image, as upstream does.
    """
    gh, gw = out_map.shape[:2]
    up = _resize(np.ascontiguousarray(out_map, dtype=np.float32), gh * STRIDE, gw * STRIDE)
    up = up[: resized_hw[0], : resized_hw[1]]
    return _resize(np.ascontiguousarray(up), image_hw[0], image_hw[1])


MapsFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def _to_bgr(image: Image.Image) -> np.ndarray:
    """PIL image -> BGR uint8; transparency is composited on white, as the reference annotator does."""
    if "A" in image.getbands() or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, rgba)
    rgb = np.asarray(image.convert("RGB"))
    return np.ascontiguousarray(rgb[:, :, ::-1])


class PoseEstimator:
    """Person image -> (18, 2) COCO-18 keypoints in that image's pixels (missing = (0, 0)).

    `maps_fn` replaces the network (a test seam): it receives the BGR uint8 image and returns
    image-sized (heatmaps HxWx19, pafs HxWx38).
    """

    def __init__(
        self,
        net: BodyPoseNet | None,
        device: torch.device | str = "cpu",
        maps_fn: MapsFn | None = None,
    ) -> None:
        if net is None and maps_fn is None:
            raise ValueError("PoseEstimator needs a network or a maps_fn")
        self.device = torch.device(device)
        self.net = net.to(self.device).eval() if net is not None else None
        self.maps_fn = maps_fn

    @classmethod
    def from_checkpoint(cls, path: Path, device: torch.device | str = "cpu") -> PoseEstimator:
        """Load body_pose_model.pth (see load_body_pose) and wrap it."""
        return cls(load_body_pose(path, device), device=device)

    def network_maps(self, bgr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Run the network on a BGR uint8 image; returns image-sized (heatmaps, pafs) float32."""
        if self.net is None:
            raise RuntimeError("this PoseEstimator has no network")
        tensor, resized_hw = network_input(bgr)
        param = next(self.net.parameters(), None)
        dtype = param.dtype if param is not None else torch.float32
        with torch.inference_mode():
            pafs, heatmaps = self.net(torch.from_numpy(tensor).to(self.device, dtype))
        image_hw = bgr.shape[:2]
        pafs_np = pafs[0].float().permute(1, 2, 0).cpu().numpy()
        heat_np = heatmaps[0].float().permute(1, 2, 0).cpu().numpy()
        return (
            maps_from_network_output(heat_np, resized_hw, image_hw),
            maps_from_network_output(pafs_np, resized_hw, image_hw),
        )

    def __call__(self, image: Image.Image) -> np.ndarray:
        """Keypoints of the main person; raises NoPersonError when nobody is found."""
        bgr = _to_bgr(image)
        heatmaps, pafs = self.maps_fn(bgr) if self.maps_fn is not None else self.network_maps(bgr)
        return decode_pose(np.asarray(heatmaps), np.asarray(pafs))


def _joint_colors() -> list[tuple[int, int, int]]:
    """The usual OpenPose palette: 18 hues 20 degrees apart, starting at red (RGB)."""
    colors = []
    for i in range(NUM_KEYPOINTS):
        hsv = np.uint8([[[i * 10, 255, 255]]])  # OpenCV hue unit is 2 degrees
        r, g, b = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)[0, 0]
        colors.append((int(r), int(g), int(b)))
    return colors


def draw_pose(image: Image.Image, keypoints: np.ndarray) -> Image.Image:
    """A copy of `image` with the skeleton drawn on it (for --save-intermediates)."""
    canvas = np.array(image.convert("RGB"))
    kp = np.asarray(keypoints, dtype=np.float64).reshape(NUM_KEYPOINTS, 2)
    present = ~np.all(kp == 0, axis=1)
    colors = _joint_colors()
    scale = max(1.0, min(canvas.shape[:2]) / 512)
    thickness, radius = max(2, round(4 * scale)), max(2, round(4 * scale))
    overlay = canvas.copy()
    for index, (a, b, _, _) in enumerate(LIMBS[:17]):  # the two ear-shoulder links are not drawn
        if present[a] and present[b]:
            pa = (round(kp[a, 0]), round(kp[a, 1]))
            pb = (round(kp[b, 0]), round(kp[b, 1]))
            cv2.line(overlay, pa, pb, colors[index], thickness, cv2.LINE_AA)
    # Limbs at 60% opacity so the photo shows through; untouched pixels stay exactly as they were.
    canvas = cv2.addWeighted(canvas, 0.4, overlay, 0.6, 0.0)
    for part in range(NUM_KEYPOINTS):
        if present[part]:
            center = (round(kp[part, 0]), round(kp[part, 1]))
            cv2.circle(canvas, center, radius, colors[part], -1, cv2.LINE_AA)
    return Image.fromarray(canvas)
