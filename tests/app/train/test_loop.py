"""`ootd train run`'s loop on a tiny prepared cache: learning lowers the loss, a resumed run ends with the weights of
an uninterrupted one, a run leaves its log, plot, sheets and checkpoints complete, a signal during the optimizer step
never labels a checkpoint with another step's weights, accumulation is a larger batch in passes."""

from __future__ import annotations

import json
import shutil
import signal
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from ootd.app.signals import sigterm_as_interrupt
from ootd.app.train.checkpoints import checkpoints, load_checkpoint
from ootd.app.train.loop import Trainer, TrainOptions, open_run, run_loop, train_local, training_models
from ootd.errors import OotdError, OutputError, UsageError
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


def _trainable(tiny_tree: Path, settings: TrainSettings):  # noqa: ANN202
    """A fine-tune's models from the model owner a run of these settings makes (on the CPU)."""
    options = TrainOptions(Path("unused"), Path("unused"), tiny_tree, settings, device="cpu")
    return training_models(options).trainable(ModelType.HD, settings)


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
    models = _trainable(tiny_tree, options.settings)
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


def _rates(run: Path) -> list[float]:
    return [json.loads(line)["lr"] for line in (run / "loss.jsonl").read_text().splitlines()]


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(cache: Path, tiny_tree: Path,
                                                                    tmp_path: Path) -> None:
    """Weights, log and learning rates: a run resumed from step 2 of 4 takes the rates the uninterrupted one took
    (a warm-up of 3 steps into a cosine decay, so one step off would show), without torch's warning about a
    schedule stepped before the optimizer."""
    whole = tmp_path / "whole"
    settings = _settings(warmup=3, schedule="cosine")
    train_local(TrainOptions(cache, whole, tiny_tree, settings))
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000004")
    (resumed / "lora.safetensors").unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = train_local(TrainOptions(cache, resumed, tiny_tree, settings, resume=True))
    assert not [w for w in caught if "lr_scheduler" in str(w.message)], [str(w.message) for w in caught]
    assert (report.first_step, report.steps) == (2, 4)
    # step k takes warm-up (k-1)/3 of the rate, then the cosine from there: 0, 1/3, 2/3, then cos(0) = 1
    expected = [0.0, 1e-2 / 3, 2e-2 / 3, 1e-2]
    assert _rates(whole) == pytest.approx(expected) and _rates(resumed) == pytest.approx(expected)
    a, b = load_file(str(whole / "lora.safetensors")), load_file(str(resumed / "lora.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = load_file(str(whole / "checkpoints" / "step-00000002" / "lora.safetensors"))
    assert any(not torch.equal(a[k], start[k]) for k in a)  # steps 3 and 4 did change the weights
    steps = [json.loads(line)["step"] for line in (resumed / "loss.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    with pytest.raises(UsageError, match="rank 8 \\(now 4\\)") as changed:
        train_local(TrainOptions(cache, resumed, tiny_tree, _settings(rank=4), resume=True))
    assert changed.value.setting == "resume"
    with pytest.raises(OutputError, match="already holds a training run"):
        train_local(TrainOptions(cache, resumed, tiny_tree, _settings()))


def test_two_runs_on_one_owner_each_start_from_the_adapter_as_made(cache: Path, tiny_tree: Path,
                                                                   tmp_path: Path) -> None:
    """A run trains the adapter the owner holds in place; the owner hands the next run of the same settings the
    adapter as it made it (not reloaded), so both runs end with the same weights, bit for bit, as a run alone."""
    settings = _settings(steps=2, checkpoint_every=100, train_garment=False)
    index = read_index(cache)
    owner = training_models(TrainOptions(cache, tmp_path / "unused", tiny_tree, settings))
    held = owner.trainable(ModelType.HD, settings)
    made = [p.detach().clone() for p in held.params]
    for name in ("first", "second"):
        options = TrainOptions(cache, tmp_path / name, tiny_tree, settings)
        train_local(options, models=options.load_models(index, owner), index=index)
        assert any(not torch.equal(p, p0) for p, p0 in zip(held.params, made, strict=True))  # trained in place
    a, b = (load_file(str(tmp_path / name / "lora.safetensors")) for name in ("first", "second"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert owner.trainable(ModelType.HD, settings) is held  # the same models, their adapters as made again
    assert all(torch.equal(p, p0) and p.grad is None for p, p0 in zip(held.params, made, strict=True))


def test_asking_the_owner_again_during_a_run_fails_and_keeps_what_the_run_trained(cache: Path, tiny_tree: Path,
                                                                                  tmp_path: Path) -> None:
    """The owner hands a fine-tune's models back with the adapter as made: during a run that would undo what the
    run has trained, so it is an error that names the run (the run's weights untouched), and so is a second run
    of the same models at once; once the run has ended, however, the next ask and the next run work."""
    settings = _settings(steps=2, checkpoint_every=100, train_garment=False)
    index = read_index(cache)
    owner = training_models(TrainOptions(cache, tmp_path / "unused", tiny_tree, settings))
    held = owner.trainable(ModelType.HD, settings)
    made = [p.detach().clone() for p in held.params]
    asked: list[bool] = []

    def ask_again(stage: str, done: int, total: int) -> None:
        if stage == "train" and done == 1:  # one step trained
            trained = [p.detach().clone() for p in held.params]
            with pytest.raises(OotdError, match=r"in use by the training run in .*first.*Models\.trainable"):
                owner.trainable(ModelType.HD, settings)
            with pytest.raises(OotdError, match=r"run in .*second cannot train them at the same time"):
                train_local(TrainOptions(cache, tmp_path / "second", tiny_tree, settings), models=held, index=index)
            asked.append(all(torch.equal(p, t) for p, t in zip(held.params, trained, strict=True)))

    options = TrainOptions(cache, tmp_path / "first", tiny_tree, settings)
    train_local(options, ask_again, models=options.load_models(index, owner), index=index)
    assert asked == [True]  # both refused, the run's weights as trained
    assert owner.trainable(ModelType.HD, settings) is held  # the run ended: the models are handed out again
    assert all(torch.equal(p, p0) for p, p0 in zip(held.params, made, strict=True))
    with pytest.raises(KeyboardInterrupt), held.in_run("stopped"):  # a run that ends with an error lets go too
        raise KeyboardInterrupt
    train_local(TrainOptions(cache, tmp_path / "third", tiny_tree, settings), models=held, index=index)


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


def test_a_signal_during_the_optimizer_step_labels_the_checkpoint_with_the_step_taken(cache: Path, tiny_tree: Path,
                                                                                     tmp_path: Path) -> None:
    """SIGTERM inside optimizer.step (the weights changed, the count not yet): the checkpoint's label, AdamW's own
    step count and the weights agree, and the loss log has the step."""
    run = tmp_path / "run"
    options = TrainOptions(cache, run, tiny_tree, _settings(steps=3, checkpoint_every=100, train_garment=False))
    index = read_index(cache)
    open_run(options, index)
    trainer = Trainer(options, _trainable(tiny_tree, options.settings), index)

    def signal_after_the_update(optimizer: Any, args: Any, kwargs: Any) -> None:
        if trainer.step == 1:  # the second step: the weights updated, the step not yet counted
            signal.raise_signal(signal.SIGTERM)

    trainer.optimizer.register_step_post_hook(signal_after_the_update)
    with sigterm_as_interrupt(), pytest.raises(KeyboardInterrupt):
        run_loop(trainer)
    (saved,) = checkpoints(run)
    restored = load_checkpoint(saved)
    adam_steps = {float(state["step"]) for state in restored.optimizer_state["state"].values()}
    assert (saved.step, trainer.step, adam_steps) == (2, 2, {2.0})
    from ootd.training.adapters import lora_state

    now = lora_state(trainer.models.unets["unet_vton"])
    assert all(torch.equal(restored.adapter["unet_vton"][k], now[k]) for k in now)
    assert [json.loads(line)["step"] for line in (run / "loss.jsonl").read_text().splitlines()] == [1, 2]


def test_accumulation_gives_the_gradients_and_weights_of_the_larger_batch(cache: Path, tiny_tree: Path,
                                                                          tmp_path: Path) -> None:
    """Batch 1 x accumulation 2 trains on the pairs and draws of batch 2 x 1 (ootd/training/data.py) and averages
    the passes' gradients as the batch's mean does: the same loss, gradients and weights after a step, within float
    tolerance. The gradients are compared too: AdamW's update hides a gradient's scale from the weights (one step
    keeps the test cheap; the draws of later steps follow the same positions)."""
    models = _trainable(tiny_tree, _settings(train_garment=False))
    index = read_index(cache)
    initial = [p.detach().clone() for p in models.params]
    runs = []
    for batch_size, accumulation in ((1, 2), (2, 1)):
        for param, value in zip(models.params, initial, strict=True):
            param.data.copy_(value)
        settings = _settings(batch_size=batch_size, accumulation=accumulation, train_garment=False)
        trainer = Trainer(TrainOptions(cache, tmp_path / f"{batch_size}x{accumulation}", tiny_tree, settings),
                          models, index)
        loss = trainer.train_step()
        grads = [p.grad.detach().clone() for p in models.params]
        runs.append((loss, grads, [p.detach().clone() for p in models.params]))
    (loss_a, grads_a, weights_a), (loss_b, grads_b, weights_b) = runs
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    scale = max(float(g.abs().max()) for g in grads_b)
    assert scale > 0
    for x, y in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-3, atol=1e-4 * scale)
    assert any(not torch.equal(w, w0) for w, w0 in zip(weights_b, initial, strict=True))  # the step moved them
    for x, y in zip(weights_a, weights_b, strict=True):  # float sums in another order: as the Ray test allows
        torch.testing.assert_close(x, y, rtol=1e-3, atol=5e-4)


def test_the_constant_schedule_warms_up_first(cache: Path, tiny_tree: Path, tmp_path: Path) -> None:
    """`--schedule constant` (the default) after `--warmup N` steps, as the docs say (diffusers' own "constant"
    would ignore the warm-up)."""
    run = tmp_path / "run"
    train_local(TrainOptions(cache, run, tiny_tree, _settings(steps=3, warmup=2, checkpoint_every=100)))
    assert _rates(run) == pytest.approx([0.0, 5e-3, 1e-2])
