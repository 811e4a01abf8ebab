"""A few-step adapter carries its own sampling: the Python API samples with the adapter's steps, scheduler and
guidance unless a call sets them; an adapter distilled from other base weights is refused before loading; a plain
adapter takes nothing; the consistency schedulers run 1 to 8 steps (and refuse more than their grid) with the same
pictures for the same seed; at scale 0 a few-step adapter gives the base model's pictures bit for bit."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from ootd import TryOnPipeline
from ootd.errors import CheckpointError, UsageError
from ootd.models import Models
from ootd.settings import ModelType, SamplingSettings, SchedulerName
from ootd.weights.fewstep import FewStep, fill_sampling
from ootd.weights.lora import LoraChoice, read_adapter, read_choice
from tests.helpers.training import few_step, few_step_adapters

RES = "384x512"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, tiny_tree: Path) -> dict[str, Path]:
    return few_step_adapters(tiny_tree, tmp_path_factory.mktemp("few-step"))


def _call(pipe: TryOnPipeline, example_images: dict, **kwargs: object):  # noqa: ANN202
    return pipe(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"], seed=5,
                resolution=RES, **kwargs)


def test_the_file_records_its_sampling_and_base(adapters: dict, tiny_tree: Path) -> None:
    adapter = read_adapter(adapters["few"])
    assert adapter.few_step == few_step(tiny_tree)
    assert LoraChoice.parse(adapters["few"]).few_step == adapter.few_step  # known when the options are read
    assert read_adapter(adapters["plain"]).few_step is None and LoraChoice.parse(adapters["plain"]).few_step is None


@pytest.fixture(scope="module")
def few_pipe(adapters: dict, tiny_tree: Path) -> TryOnPipeline:
    return Models.from_pretrained(tiny_tree, device="cpu").pipeline("hd", lora=adapters["few"])


def test_the_api_samples_with_the_adapters_settings_unless_told(adapters: dict, tiny_tree: Path,
                                                                example_images: dict, few_pipe: TryOnPipeline,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ootd.weights.lora"):
        read_choice(LoraChoice.parse(adapters["few"]), tiny_tree, ModelType.HD)  # what a load says
    assert "few-step adapter few.safetensors: sampling with its own 4 steps, lcm scheduler, guidance off" in caplog.text
    own = _call(few_pipe, example_images).sampling
    assert (own.steps, own.scheduler, own.guidance_scale, own.guidance) == (4, SchedulerName.LCM, 0.0, False)
    told = _call(few_pipe, example_images, steps=1, scheduler="tcd").sampling
    assert (told.steps, told.scheduler, told.guidance_scale) == (1, SchedulerName.TCD, 0.0)
    plain = Models.from_pretrained(tiny_tree, device="cpu").pipeline("hd", lora=adapters["plain"])
    assert _call(plain, example_images, steps=1).sampling.scheduler is SchedulerName.UNIPC  # as before: no defaults


def test_an_adapter_from_other_base_weights_is_refused(adapters: dict, tiny_tree: Path) -> None:
    with pytest.raises(CheckpointError, match="other.safetensors was distilled from other base weights"):
        Models.from_pretrained(tiny_tree, device="cpu").pipeline("hd", lora=adapters["other"])


def test_consistency_schedulers_run_one_to_eight_steps(pipe_hd: TryOnPipeline, example_images: dict) -> None:
    """Their steps draw fresh noise: from the seed, so a call gives the same pixels twice."""
    for scheduler, steps in (("lcm", 1), ("tcd", 8)):
        assert len(_call(pipe_hd, example_images, steps=steps, scheduler=scheduler,
                         guidance_scale=0.0).timings.steps) == steps
    first, again = (_call(pipe_hd, example_images, steps=8, scheduler="lcm", guidance_scale=0.0) for _ in range(2))
    assert np.array_equal(np.asarray(first.images[0]), np.asarray(again.images[0]))
    with pytest.raises(UsageError, match="between 1 and 50 with the lcm scheduler"):
        SamplingSettings.from_words(steps=51, scheduler="lcm")


def test_scale_zero_gives_the_base_picture_bit_for_bit(adapters: dict, tiny_tree: Path, example_images: dict,
                                                       pipe_hd: TryOnPipeline, few_pipe: TryOnPipeline) -> None:
    pipe = Models.from_pretrained(tiny_tree, device="cpu").pipeline("hd", lora=adapters["few"], lora_scale=0.0)
    zero = _call(pipe, example_images)
    base = _call(pipe_hd, example_images, steps=4, scheduler="lcm", guidance_scale=0.0)
    assert np.array_equal(np.asarray(zero.images[0]), np.asarray(base.images[0]))
    one = _call(few_pipe, example_images)
    assert not np.array_equal(np.asarray(one.images[0]), np.asarray(base.images[0]))  # the adapter does something


def test_what_is_given_wins_over_the_adapter_and_the_adapter_over_the_defaults(tiny_tree: Path) -> None:
    few = FewStep(SchedulerName.TCD, 2, 0.0, 2.0, "a" * 64)
    assert fill_sampling(few, {"steps": None, "scale": None, "scheduler": None}) == (
        {"steps": 2, "scale": 0.0, "scheduler": "tcd"}, ("steps", "scale", "scheduler"))
    assert fill_sampling(few, {"steps": 6, "scale": None, "scheduler": "lcm"}) == (
        {"steps": 6, "scale": 0.0, "scheduler": "lcm"}, ("scale",))
    defaults = SamplingSettings()
    assert fill_sampling(None, {"steps": None, "scale": 3.0, "scheduler": None}) == (
        {"steps": defaults.steps, "scale": 3.0, "scheduler": defaults.scheduler}, ())
