"""`ootd train run`'s loop on a tiny prepared cache: learning lowers the loss, a resumed run ends with the weights of
an uninterrupted one, and a run leaves its log, plot, sheets and checkpoints complete."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ootd.app.train.loop import Trainer, TrainOptions, open_run, run_loop, train_local
from ootd.app.train.models import load_training_models
from ootd.errors import OutputError, UsageError
from ootd.settings import ModelType
from ootd.training.cache import read_index
from ootd.training.data import load_batch
from ootd.training.objective import draw
from ootd.training.settings import TrainSettings
from ootd.weights.lora import read_adapter
from tests.helpers.training import prepared_cache


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory, tiny_tree: Path, example_images: dict) -> Path:
    return prepared_cache(tmp_path_factory.mktemp("train"), tiny_tree, example_images, split=0.0)


def _settings(**kw: object) -> TrainSettings:
    base = {"steps": 4, "batch_size": 1, "learning_rate": 1e-2, "warmup": 0, "validation_pairs": 0,
            "train_garment": True, "checkpoint_every": 2}
    return TrainSettings.from_words(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.slow
def test_learning_lowers_the_loss(cache: Path, tiny_tree: Path, tmp_path: Path) -> None:
    options = TrainOptions(cache, tmp_path / "run", tiny_tree, _settings(steps=10, batch_size=2, learning_rate=3e-2,
                                                                         checkpoint_every=100, train_garment=False))
    index = read_index(cache)
    open_run(options, index)
    models = load_training_models(tiny_tree, ModelType.HD, options.settings, "cpu")
    trainer = Trainer(options, models, index)
    fixed = load_batch(cache, trainer.train_keys, models.device)

    def held_loss() -> float:  # the loss on the same pairs and draws before and after: no draw noise in it
        total = 0.0
        with torch.no_grad():
            for k in range(3):
                d = draw(range(len(trainer.train_keys)), fixed["target"].shape[1:], 1000, 0.0, 99, k)
                total += float(models.objective(fixed["target"], fixed["masked"], fixed["garment"], fixed["prompt"],
                                                d.noise, d.timesteps, d.drop))
                models.objective.release()
        return total / 3

    before = held_loss()
    report = run_loop(trainer)
    after = held_loss()
    assert after / before < 0.97, (before, after)
    assert sum(report.losses[-3:]) < sum(report.losses[:3])


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(cache: Path, tiny_tree: Path,
                                                                    tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    train_local(TrainOptions(cache, whole, tiny_tree, _settings()))
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000004")
    (resumed / "lora.safetensors").unlink()
    report = train_local(TrainOptions(cache, resumed, tiny_tree, _settings(), resume=True))
    assert (report.first_step, report.steps) == (2, 4)
    a, b = load_file(str(whole / "lora.safetensors")), load_file(str(resumed / "lora.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = load_file(str(whole / "checkpoints" / "step-00000002" / "lora.safetensors"))
    assert any(not torch.equal(a[k], start[k]) for k in a)  # steps 3 and 4 did change the weights
    steps = [json.loads(line)["step"] for line in (resumed / "loss.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    with pytest.raises(UsageError, match="--rank 8 \\(now 4\\)"):
        train_local(TrainOptions(cache, resumed, tiny_tree, _settings(rank=4), resume=True))
    with pytest.raises(OutputError, match="already holds a training run"):
        train_local(TrainOptions(cache, resumed, tiny_tree, _settings()))


def test_a_run_writes_its_adapter_log_plot_and_sheets(tiny_tree: Path, example_images: dict, tmp_path: Path) -> None:
    cache = prepared_cache(tmp_path / "data", tiny_tree, example_images, split=0.5)
    run = tmp_path / "run"
    report = train_local(TrainOptions(cache, run, tiny_tree, _settings(steps=2, validate_every=1, validation_pairs=1,
                                                                       validation_steps=1, train_garment=False)))
    adapter = read_adapter(run / "lora.safetensors")
    assert adapter.model_type is ModelType.HD and set(adapter.tensors) == {"unet_vton"}
    assert [v["step"] for v in report.validation] == [1, 2]
    assert all(0.0 < v["ssim_mean"] <= 1.0 for v in report.validation)
    assert (run / "validation" / "step-00000002.png").is_file() and (run / "loss.png").is_file()
    assert not list(run.rglob(".*"))  # no temporary file or folder left
