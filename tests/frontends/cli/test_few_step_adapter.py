"""`--lora` with a few-step adapter at the command line: its own steps, scheduler and guidance apply unless given,
one line says so, the PNG records what was used and what the adapter carries, `--explain` counts the try-on UNet
evaluations; an adapter distilled from other base weights is one line and exit 1; a plain adapter behaves as
before (the defaults, no notice, no few-step keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ootd.app.tryon.config import build_config
from ootd.settings import SamplingSettings
from tests.helpers.cli import assert_one_line_error, invoke
from tests.helpers.images import text
from tests.helpers.training import few_step_adapters


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, tiny_tree: Path) -> dict[str, Path]:
    return few_step_adapters(tiny_tree, tmp_path_factory.mktemp("few-step-cli"))


def _run(tiny_tree: Path, example_images: dict, out: Path, *extra: object):  # noqa: ANN202
    return invoke("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper", "--mask",
                  example_images["mask"], "--checkpoints", tiny_tree, "--resolution", "384x512", "--seed", "1",
                  "--device", "cpu", "-o", out, *extra)


def test_its_own_sampling_applies_is_said_and_recorded(adapters: dict, tiny_tree: Path, example_images: dict,
                                                       tmp_path: Path) -> None:
    result = _run(tiny_tree, example_images, tmp_path / "own", "--lora", adapters["few"], "--explain")
    assert result.exit_code == 0, result.output
    notices = [line for line in result.stderr.splitlines() if "few-step adapter" in line]
    assert notices == ["few-step adapter few.safetensors: sampling with its own 4 steps, lcm scheduler, guidance off"]
    assert "denoising: 4 lcm steps x 1 (no guidance) = 4 try-on UNet evaluations a picture" in result.stdout
    (png,) = (tmp_path / "own").glob("*__0.png")
    record = text(png)
    assert (record["steps"], record["scheduler"], record["scale"]) == ("4", "lcm", "0.0")
    assert (record["lora_steps"], record["lora_scheduler"], record["lora_guidance"]) == ("4", "lcm", "0.0")

    told = _run(tiny_tree, example_images, tmp_path / "told", "--lora", adapters["few"], "--steps", "2",
                "--scheduler", "tcd")
    assert told.exit_code == 0, told.output
    assert "guidance off; --steps, --scheduler as given" in told.stderr
    (png,) = (tmp_path / "told").glob("*__0.png")
    record = text(png)
    assert (record["steps"], record["scheduler"], record["scale"], record["lora_steps"]) == ("2", "tcd", "0.0", "4")


def test_an_adapter_from_other_base_weights_is_one_line(adapters: dict, tiny_tree: Path, example_images: dict,
                                                        tmp_path: Path) -> None:
    assert_one_line_error(_run(tiny_tree, example_images, tmp_path / "bad", "--lora", adapters["other"]), 1,
                          "other.safetensors was distilled from other base weights")
    assert not (tmp_path / "bad").exists() or not list((tmp_path / "bad").glob("*.png"))


def test_a_plain_adapter_behaves_as_before(adapters: dict, tiny_tree: Path) -> None:
    from ootd.app.tryon.record import PassRecord
    from ootd.settings import Category, ModelType

    config = build_config(checkpoints=tiny_tree, lora=str(adapters["plain"]), seed=1)
    defaults = SamplingSettings()
    assert (config.sampling.steps, config.sampling.guidance_scale, config.sampling.scheduler) == (
        defaults.steps, defaults.guidance_scale, defaults.scheduler)
    assert config.lora_notice() is None and config.lora_sampling == ()
    words = PassRecord(ModelType.HD, Category.UPPER, config, "p.png", "g.png", "m.png").text()
    assert "lora_sha256" in words and not {"lora_steps", "lora_scheduler", "lora_guidance"} & set(words)
    few = build_config(checkpoints=tiny_tree, lora=str(adapters["few"]), scale=1.5, seed=1)
    assert (few.sampling.steps, few.sampling.guidance_scale, few.lora_sampling) == (4, 1.5, ("steps", "scheduler"))
