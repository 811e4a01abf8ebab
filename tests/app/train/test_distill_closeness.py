"""A few dozen distillation steps on the example pairs bring the student's 4-step pictures (the lcm scheduler, no
guidance pass) closer to the teacher's 20-step pictures (UniPC with its image guidance), on those pairs with the
seed fixed, than the undistilled model's 4-step pictures with the same scheduler: by latent MSE and image SSIM.
The same run with the target network wired to the student's own point (no teacher in the loss) gives no such
gain: the test sees an objective wired wrongly.

On the tiny random-weight checkpoints the gain is small (measured with these settings on a 2-core AMD EPYC:
latent MSE to the teacher 9.910 before, 9.844 after, 0.67% lower; mean SSIM 0.9562 -> 0.9569; the control: exactly
the same pictures as before, the ratio 1.0, as with an untrained adapter) and the pictures are noise: the model's
noise prediction barely depends on its input, so most of the distance to the teacher is the fresh noise the lcm
scheduler draws between steps (the same for the student and the undistilled model: one seed), which no student
removes; and the consistency targets pass from one grid point to the next over many more steps than a test can
run. GAIN lies halfway between the two. What a few dozen steps can learn is the teacher's guidance, hence its
scale here (SETTINGS). Slow: two distillations and 20-step pictures, a few minutes on a 2-core CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ootd.app.train.distill import DistillOptions
from ootd.app.train.loop import open_run, run_loop
from ootd.imaging.similarity import ssim
from ootd.settings import SamplingSettings, SchedulerName, parse_resolution
from ootd.training import distill
from ootd.training.cache import read_index
from ootd.training.distill import adapters_off
from ootd.training.settings import DistillSettings
from tests.helpers.training import RESOLUTION, entry_inputs, prepared_cache

pytestmark = pytest.mark.slow

# The teacher's guidance is 8, not the released 2: on random weights the garment moves the noise prediction little
# (its two halves differ by about 8%), so at 2 the guided solution is hardly apart from the unguided one and a few
# dozen steps have nothing to learn; at 8 they have.
SETTINGS = {"steps": 48, "learning_rate": 3e-3, "rank": 16, "alpha": 16, "warmup": 0, "ema_decay": 0.95,
            "guidance": 8.0, "validation_pairs": 0, "checkpoint_every": 1000}
GAIN = 0.997  # the student's latent MSE to the teacher at most this fraction of the undistilled model's

Baseline = tuple[dict[str, Any], tuple[float, float]]  # the teacher's pictures by pair; the undistilled distance


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory, tiny_tree: Path, example_images: dict) -> Path:
    return prepared_cache(tmp_path_factory.mktemp("closeness"), tiny_tree, example_images, split=0.0)


def _picture(pipe: Any, key: str, cache: Path, sampling: SamplingSettings) -> tuple[torch.Tensor, np.ndarray]:
    """The final latents and the picture of a cached pair."""
    person, garment = entry_inputs(pipe, cache, key)
    kept: dict[str, torch.Tensor] = {}
    result = pipe.generate(person, garment, sampling, callback=lambda i, t, latents: kept.update(last=latents.clone()))
    return kept["last"], np.asarray(result.images[0].convert("RGB"))


def _distance(models: Any, cache: Path, teacher: dict[str, Any]) -> tuple[float, float]:
    """Mean latent MSE and image SSIM of the 4-step pictures (the models as they are) to the teacher's 20-step ones,
    over the training pairs; the teacher's made once (the LoRA switched off) and kept in `teacher`."""
    res = parse_resolution(RESOLUTION)
    mses, scores = [], []
    for entry in read_index(cache).split("train"):
        if entry.key not in teacher:
            with adapters_off(*models.unets.values()):
                teacher[entry.key] = _picture(models.pipe, entry.key, cache, SamplingSettings(
                    steps=20, guidance_scale=SETTINGS["guidance"], seed=0, resolution=res))
        latents, picture = _picture(models.pipe, entry.key, cache, SamplingSettings(
            steps=4, guidance_scale=0.0, seed=0, resolution=res, scheduler=SchedulerName.LCM))
        mses.append(float(((latents - teacher[entry.key][0]) ** 2).mean()))
        scores.append(ssim(teacher[entry.key][1], picture))
    return float(np.mean(mses)), float(np.mean(scores))


def _options(cache: Path, tiny_tree: Path, run: Path) -> DistillOptions:
    return DistillOptions(cache, run, tiny_tree, DistillSettings.from_words(**SETTINGS))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def baseline(cache: Path, tiny_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    """The teacher's 20-step pictures and the undistilled model's distance to them (a fresh LoRA changes nothing:
    the model as loaded), made once for both runs."""
    options = _options(cache, tiny_tree, tmp_path_factory.mktemp("baseline") / "run")
    teacher: dict[str, Any] = {}
    return teacher, _distance(options.load_models(read_index(cache)), cache, teacher)


def _distil(cache: Path, tiny_tree: Path, run: Path, baseline: Baseline) -> tuple[float, float]:
    """The distance of the distilled student to the teacher."""
    options = _options(cache, tiny_tree, run)
    index = read_index(cache)
    open_run(options, index)
    models = options.load_models(index)
    run_loop(options.make_trainer(models, index))
    return _distance(models, cache, dict(baseline[0]))


def test_a_few_dozen_steps_bring_the_4_step_student_closer_to_the_teacher(cache: Path, tiny_tree: Path,
                                                                          tmp_path: Path, baseline: Baseline) -> None:
    mse_before, ssim_before = baseline[1]
    mse_after, ssim_after = _distil(cache, tiny_tree, tmp_path / "run", baseline)
    assert mse_after < GAIN * mse_before, (mse_before, mse_after)
    assert ssim_after > ssim_before, (ssim_before, ssim_after)


def test_a_target_wired_to_the_students_own_point_brings_no_gain(cache: Path, tiny_tree: Path, tmp_path: Path,
                                                                 baseline: Baseline,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the target network evaluated at (x_t, t), where the student is, instead of at the teacher's
    step: the loss no longer holds the teacher, and the same run does not come closer by the test's margin."""
    wired = distill.ConsistencyObjective.target_value
    points: dict[str, torch.Tensor] = {}
    noised = distill.ConsistencyGrid.noised

    def remember(self: Any, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        points["x"], points["t"] = noised(self, x0, noise, t), t
        return points["x"]

    def at_the_student(self: Any, x_s: torch.Tensor, s: torch.Tensor, *rest: Any) -> torch.Tensor:
        return wired(self, points["x"], points["t"], *rest)

    monkeypatch.setattr(distill.ConsistencyGrid, "noised", remember)
    monkeypatch.setattr(distill.ConsistencyObjective, "target_value", at_the_student)
    mse_after, _ = _distil(cache, tiny_tree, tmp_path / "run", baseline)
    assert not mse_after < GAIN * baseline[1][0], (baseline[1][0], mse_after)
