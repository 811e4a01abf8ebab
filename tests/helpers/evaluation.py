"""Stand-ins for the metric networks (declared as such in every output they reach), folders of images to
measure, and the check that the eval extra's real networks are here.

`stand_in_networks` is what `stand_ins` hands `ootd eval` (through the model owner's seam, `use_models`) in tests
of the matching, the report and the batch wiring: a small randomly initialised convolution for the features and
the mean squared difference for the perceptual distance, so the numbers move with the pixels. The real networks
(torch-fidelity's InceptionV3, lpips's AlexNet, randomly initialised) are tested where the eval extra is installed
(scripts/test_eval_stack.sh); `require_eval_stack` skips such a test elsewhere, or fails it when that script
runs (OOTD_EVAL_STACK=1), so it cannot pass there by skipping.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

STAND_IN = "test stand-in networks: a random convolution and the mean squared difference; not the metrics"
FEATURE_DIM = 8


def stand_in_networks(weights: Any, device: Any) -> Any:
    import torch

    from ootd.evaluation.networks import Networks

    generator = torch.Generator().manual_seed(0)
    kernel = torch.randn(FEATURE_DIM, 3, 3, 3, generator=generator)

    def features(images: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.conv2d(images.float() / 255.0, kernel, stride=2)
        return torch.relu(x).mean(dim=(2, 3))

    def distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ((a - b) ** 2).mean(dim=(1, 2, 3))

    return Networks(features, FEATURE_DIM, distance, device, STAND_IN, ("stand-in features", "stand-in distance"))


@contextmanager
def stand_ins() -> Iterator[None]:
    from ootd.models import use_models

    with use_models(metrics=stand_in_networks):
        yield


def noise_image(seed: int, size: tuple[int, int] = (48, 64)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def blurred(image: Image.Image, amount: int) -> Image.Image:
    """`image` moved towards grey by `amount` (0: unchanged): results that are worse the larger it is."""
    grey = Image.new("RGB", image.size, (128, 128, 128))
    return Image.blend(image, grey, amount / 10)


def write_photos(folder: Path, names: list[str], size: tuple[int, int] = (48, 64)) -> dict[str, Image.Image]:
    folder.mkdir(parents=True, exist_ok=True)
    images = {}
    for i, name in enumerate(names):
        images[name] = noise_image(i, size)
        images[name].save(folder / name)
    return images


def require_eval_stack() -> None:
    """Skip unless the eval extra's networks import (fail instead under scripts/test_eval_stack.sh)."""
    from ootd.errors import UnsupportedError
    from ootd.evaluation.networks import require_stack

    try:
        require_stack()
    except UnsupportedError as exc:
        if os.environ.get("OOTD_EVAL_STACK") == "1":
            pytest.fail(f"the eval stack is required here: {exc}")
        pytest.skip(f"the eval extra is not installed here (scripts/test_eval_stack.sh runs this): {exc}")


def our_result(path: Path, image: Image.Image, person: str, sample: int | None = 0) -> Path:
    """A PNG as ootd writes it: its record names the person photo (an intermediate's has no sample number)."""
    from ootd.app.tryon.record import software
    from ootd.imaging.atomic import save_png_atomic

    record = {**software(), "person": person, "garment": "shirt.png", "category": "upper"}
    if sample is not None:
        record["sample"] = str(sample)
    return save_png_atomic(image, path, record)


def write_report(folder: Path, entries: list[dict[str, Any]], name: str = "batch_report.jsonl") -> Path:
    """A batch report of finished (or failed) pairs: index, status, person, garment, outputs, error."""
    import json

    lines = []
    for index, entry in enumerate(entries):
        lines.append(json.dumps({"index": index, "source": f"pair {index + 1}", "person": entry["person"],
                                 "garment": "shirt.png", "category": "upper", "mask": None, "model_type": "hd",
                                 "status": entry.get("status", "ok"), "outputs": entry.get("outputs", []),
                                 "intermediates": {}, "error": entry.get("error"), "seed": 1, "timings": {},
                                 "reused": {}}))
    path = folder / name
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def batch_folder(root: Path) -> tuple[Path, Path]:
    """A batch's output folder (ROOT/out) of two results, each its person photo made worse, with the report that
    names their photos; and the folder of those photos (ROOT/photos)."""
    photos = write_photos(root / "photos", ["a.png", "b.png"])
    out = root / "out"
    out.mkdir()
    for i, (name, image) in enumerate(photos.items()):
        our_result(out / f"r{i}.png", blurred(image, 2 + i), name)
    write_report(out, [{"person": f"people/{n}", "outputs": [f"r{i}.png"]} for i, n in enumerate(photos)])
    return out, root / "photos"

def made_from(path: Path, image: Image.Image, person: str, *, mask: str | None = None, resolution: str = "384x512",
              keep_unmasked: bool = False) -> Path:
    """A PNG with the record a try-on of `person` writes (made by the record's own code: an upper garment on the hd
    model, fit pad, the `mask` file given or an automatic one), as if ootd had made `image` from that photo."""
    from ootd.app.tryon.config import RunConfig
    from ootd.app.tryon.record import AUTO_MASK, PassRecord, Record
    from ootd.imaging.atomic import save_png_atomic
    from ootd.settings import Category, ModelType, OutputSize, PhotoOutput, SamplingSettings, parse_resolution

    sampling = SamplingSettings(num_samples=1, steps=1, seed=1, resolution=parse_resolution(resolution))
    photo = PhotoOutput(OutputSize.PHOTO, True) if keep_unmasked else PhotoOutput()
    config = RunConfig(Path("checkpoints"), sampling=sampling, photo=photo)
    picture = PassRecord(ModelType.HD, Category.UPPER, config, person, "shirt.png", mask or AUTO_MASK)
    return save_png_atomic(image, path, Record(picture, sample=0).text())


def framed(photo: Path, size: tuple[int, int] = (384, 512)) -> Image.Image:
    """A 3:4 photo as a try-on frames it at the working size: resized with Pillow's default filter."""
    with Image.open(photo) as im:
        assert im.size[0] * 4 == im.size[1] * 3, "a 3:4 photo"
        return im.convert("RGB").resize(size)
