"""The single try-on without a front end: in-memory requests (PIL images, bytes), names, PNG bytes."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ootd.app.tryon.config import RunConfig, build_config
from ootd.app.tryon.inputs import JobInputs
from ootd.app.tryon.job import plan_job
from ootd.app.tryon.outputs import encode_png
from ootd.app.tryon.passes import run_pass as run_tryon
from ootd.app.tryon.request import TryOnRequest
from ootd.errors import InputImageError, NoPersonError, UsageError
from ootd.imaging.files import decode_image
from ootd.models import Models, ModelSource
from ootd.settings import Category, FitMode, SamplingSettings, parse_resolution
from tests.helpers.fakes import FakePipe


def config_for(tree: Path, out: Path, **kwargs) -> RunConfig:  # noqa: ANN003
    sampling = SamplingSettings(num_samples=1, steps=1, seed=11, resolution=parse_resolution("384x512"))
    return RunConfig(checkpoints=tree, output=out, sampling=sampling, **kwargs)


def test_in_memory_request_gives_the_images_of_the_same_files(pipe_hd, tiny_tree: Path, tmp_path: Path,  # noqa: ANN001
                                                              example_images: dict[str, Path]) -> None:
    """PIL person, bytes garment, PIL mask: the same pixels as the same inputs given as paths."""
    config = config_for(tiny_tree, tmp_path)
    by_path = run_tryon(pipe_hd, TryOnRequest(example_images["person"], example_images["tshirt"], Category.UPPER,
                                              example_images["mask"]), config)
    with Image.open(example_images["person"]) as im:
        person = im.convert("RGB")
    with Image.open(example_images["mask"]) as im:
        mask = im.convert("L")
    request = TryOnRequest(person, example_images["tshirt"].read_bytes(), Category.UPPER, mask,
                           person_name="alice.png", garment_name="upload/shirt.png")
    in_memory = run_tryon(pipe_hd, request, config)
    assert len(in_memory.result.images) == 1
    for ours, reference in zip(in_memory.result.images, by_path.result.images, strict=True):
        assert np.array_equal(np.asarray(ours), np.asarray(reference))
    job = plan_job(config, JobInputs.single(person, example_images["tshirt"].read_bytes(), Category.UPPER, mask,
                                            person_name="alice.png", garment_name="upload/shirt.png"))
    assert [p.name for p in job.targets.images] == ["alice__shirt__0.png"]
    meta = job.run(Models(tiny_tree, source=ModelSource(lambda model_type: pipe_hd))).record(0).text()
    assert (meta["person"], meta["garment"], meta["mask"], meta["seed"]) == ("alice.png", "shirt.png", "mask", "11")


def test_request_names_keys_and_bad_bytes(example_images: dict[str, Path]) -> None:
    data = example_images["tshirt"].read_bytes()
    unnamed = TryOnRequest(Image.new("RGB", (96, 128)), data, Category.UPPER)
    assert (unnamed.name("person"), unnamed.name("garment")) == ("person", "garment")
    assert unnamed.key("person") is None and unnamed.key("garment") is None  # in memory: never reused
    assert unnamed.key("mask") == ""
    assert TryOnRequest("a/b.png", "c.png", Category.UPPER).key("garment") == str(Path("c.png").resolve())
    assert TryOnRequest("a/b.png", "c.png", Category.UPPER).label("person") == "a/b.png"
    with pytest.raises(InputImageError, match="garment image upload.jpg: not an image file"):
        decode_image(b"not an image at all", "garment", "upload.jpg")
    with pytest.raises(InputImageError, match="empty upload"):
        decode_image(b"", "person", "p.png")
    decoded = replace(unnamed, person=data, person_name="me.png").decoded()
    assert isinstance(decoded.person, Image.Image) and decoded.name("person") == "me.png"


def test_no_person_names_the_upload_and_callback_reaches_generate(tmp_path: Path,
                                                                  example_images: dict[str, Path]) -> None:
    config = config_for(tmp_path, tmp_path)

    class Nobody(FakePipe):
        def prepare_person(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
            raise NoPersonError("nobody")

    request = TryOnRequest(example_images["person"].read_bytes(), example_images["tshirt"], Category.UPPER,
                           person_name="selfie.jpg")
    with pytest.raises(NoPersonError, match="no person detected in selfie.jpg"):
        run_tryon(Nobody(), request, config)

    seen: list[object] = []

    class WithCallback(FakePipe):
        def generate(self, person, garment, settings, progress=None, callback=None, modes=None):  # noqa: ANN001, ANN201
            seen.append((callback, modes))
            return super().generate(person, garment, settings, progress, modes=modes)

    hook = lambda *args: None  # noqa: E731
    outcome = run_tryon(WithCallback(), request, config, callback=hook)
    assert seen == [(hook, config.speed)] and outcome.reused == {"person": False, "garment": False}


def test_encode_png_round_trips_pixels_and_metadata() -> None:
    image = Image.fromarray(np.arange(64 * 48 * 3, dtype=np.uint8).reshape(64, 48, 3) % 251, mode="RGB")
    meta = {"seed": "42", "person": "alice.png", "note": "größe ✓"}
    data = encode_png(image, meta)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(io.BytesIO(data)) as back:
        assert back.format == "PNG" and dict(back.text) == meta
        assert np.array_equal(np.asarray(back), np.asarray(image))
    with pytest.raises(ValueError, match="PNG text keys"):
        encode_png(image, {"": "x"})


def test_build_config_defaults_are_run_config_defaults(tmp_path: Path) -> None:
    config = build_config(checkpoints=tmp_path, seed=1)
    unfixed = replace(config, sampling=replace(config.sampling, seed=None), threads=None)
    assert unfixed == RunConfig(checkpoints=tmp_path)
    assert build_config(checkpoints=tmp_path, fit="CROP").fit is FitMode.CROP


def test_threads_are_fixed_where_the_command_starts_and_applied_by_the_runtime(tmp_path: Path) -> None:
    """Every engine's processes apply the number build_config fixed, so a Ray worker (one CPU, one thread by
    Ray's default) sums floats as the local run does."""
    import torch

    from ootd.runtime import resolve_runtime

    before = torch.get_num_threads()
    assert build_config(checkpoints=tmp_path).threads == before
    for bad in (0, -1, 1025):
        with pytest.raises(UsageError, match="^threads must be 1 to 1024") as refused:
            build_config(checkpoints=tmp_path, threads=bad)
        assert (refused.value.setting, refused.value.value) == ("threads", bad)
    config = build_config(checkpoints=tmp_path, threads=before + 1, device="cpu")
    assert config.runtime_request.threads == before + 1
    try:
        assert resolve_runtime(config.runtime_request).threads == before + 1 == torch.get_num_threads()
        assert resolve_runtime(replace(config, threads=None).runtime_request).threads is None
        assert torch.get_num_threads() == before + 1  # None: the process as it is
    finally:
        torch.set_num_threads(before)
