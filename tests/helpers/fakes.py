"""An instant stand-in for the pipeline, and the one seam through which tests hand models to ootd.

`FakePipe` has the pipeline's try-on methods and records what it was asked, making tiny images at once, so the
batch, resume and front-end logic runs without models. `ModelSeam` (the `models` fixture of conftest.py) installs
models for every model owner (`ootd.models.Models`) made during a test, through `ootd.models.use_models`: `fake()`
FakePipes, `use()` given pipelines (the session's tiny ones), `forbid()` none at all.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from PIL import Image

from ootd.app.tryon.config import RunConfig
from ootd.imaging.files import load_image
from ootd.models import use_models
from ootd.pipeline_types import Timings, TryOnResult
from ootd.settings import Category, ModelType, SamplingSettings, parse_resolution
from ootd.speedups.modes import SpeedModes


class FakePipe:
    """Stands in for TryOnPipeline: the same try-on methods, counts calls, makes tiny images instantly."""

    def __init__(self, model_type: str | ModelType = "hd", fail_generate: BaseException | None = None,
                 fail_on_call: int = 1) -> None:
        self.model_type = ModelType(str(getattr(model_type, "value", model_type)))
        self.device = SimpleNamespace(type="cpu", torch_device="cpu", name="cpu", arch="cpu")
        self.precision = SimpleNamespace(unet="torch.float32")
        self.modes = SpeedModes()
        self.calls: Counter[str] = Counter()
        self.persons: list[object] = []
        self.garments: list[object] = []
        self.fail_generate = fail_generate
        self.fail_on_call = fail_on_call

    def prepare_person(self, person, category, *, mask=None, resolution=None, fit="pad", mask_grow=0):  # noqa: ANN001, ANN201
        self.calls["person"] += 1
        image = person if isinstance(person, Image.Image) else load_image(person, "person")
        if mask is not None and not isinstance(mask, Image.Image):
            load_image(mask, "mask")
        self.persons.append(person)
        return SimpleNamespace(category=Category.parse(category), image=image, name=str(person), auto=mask is None)

    def encode_person(self, masked):  # noqa: ANN001, ANN201
        self.calls["person"] += 1
        self.persons.append(masked.person)
        return SimpleNamespace(category=masked.category, image=masked.person, name="masked", auto=True)

    def prepare_garment(self, garment, category, *, resolution=None, fit="pad", guidance=True):  # noqa: ANN001, ANN201
        self.calls["garment"] += 1
        image = garment if isinstance(garment, Image.Image) else load_image(garment, "garment")
        self.garments.append(garment)
        return SimpleNamespace(category=Category.parse(category), image=image, name=str(garment))

    def generate(self, person, garment, settings, progress=None, callback=None, modes=None):  # noqa: ANN001, ANN201
        self.calls["generate"] += 1
        if self.fail_generate is not None and self.calls["generate"] >= self.fail_on_call:
            raise self.fail_generate
        if progress is not None:
            progress("denoise", 1, 1)
        shade = settings.seed % 256
        images = [Image.new("RGB", (48, 64), (shade, 40 * i % 256, 7)) for i in range(settings.num_samples)]
        timings = Timings({"preprocess": 0.01, "encode_person": 0.01, "conditioning": 0.01, "garment_unet": 0.01,
                           "denoise": 0.02, "decode": 0.01}, [0.02])
        return TryOnResult(
            images=images, seed=settings.seed, masked_person=Image.new("RGB", (48, 64), (127, 127, 127)),
            mask=Image.new("L", (48, 64), 255), timings=timings,
            intermediates={"mask": Image.new("L", (48, 64), 255),
                           "masked_person": Image.new("RGB", (48, 64), (127, 127, 127)),
                           **({"pose": Image.new("RGB", (36, 48)), "parsing": Image.new("RGB", (36, 48))}
                              if getattr(person, "auto", False) else {})},
            model_type=self.model_type, category=person.category, sampling=settings,  # as the real one
            modes=modes or self.modes,
        )


class ModelSeam:
    """Models for every loader made during one test (the `models` fixture); undone when the test ends."""

    def __init__(self, stack: ExitStack) -> None:
        self._stack = stack

    def use(self, pipeline: Callable[[ModelType], Any] | Any, preprocessor: Any = None) -> None:
        """These pipelines (a callable of the model type, or one pipeline for every type), and these pose +
        parsing models when given."""
        factory = callable(pipeline) and (isinstance(pipeline, type) or not hasattr(pipeline, "generate"))
        source = pipeline if factory else (lambda _: pipeline)
        self._stack.enter_context(use_models(source, (lambda: preprocessor) if preprocessor is not None else None))

    def fake(self, preprocessor: Any = None, **kwargs: Any) -> dict[str, list[FakePipe]]:
        """A new FakePipe(model_type, **kwargs) per load; returns the pipes made, per model type."""
        made: dict[str, list[FakePipe]] = {}

        def load(model_type: ModelType) -> FakePipe:
            pipe = FakePipe(model_type, **kwargs)
            made.setdefault(model_type.value, []).append(pipe)
            return pipe

        self.use(load, preprocessor)
        return made

    def forbid(self) -> None:
        """Loading a diffusion model fails the test (everything must be decided before they load; pose and
        parsing still load from the checkpoints)."""
        self.use(lambda model_type: pytest.fail(f"the {model_type.value} model was loaded"))


def images_tree(root: Path, example_images: dict[str, Path], people: int, garments: int) -> tuple[Path, Path]:
    """Folders `people/p<i>.png` and `garments/g<i>.png` of the example photos."""
    (root / "people").mkdir(parents=True)
    (root / "garments").mkdir()
    for i in range(people):
        shutil.copy(example_images["person"], root / "people" / f"p{i}.png")
    for i in range(garments):
        shutil.copy(example_images["tshirt"], root / "garments" / f"g{i}.png")
    return root / "people", root / "garments"


def read_report(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def small_config(tree: Path, out: Path, **kwargs: Any) -> RunConfig:
    """A one-sample, one-step 384x512 config with seed 5."""
    sampling = SamplingSettings(num_samples=1, steps=1, seed=5, resolution=parse_resolution("384x512"))
    return RunConfig(checkpoints=tree, output=out, sampling=sampling, **kwargs)
