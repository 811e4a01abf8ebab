"""`ootd train distill`'s run on a tiny prepared cache: a resumed run ends with the uninterrupted run's student and
target network bit for bit; a signal during the optimizer step checkpoints the step taken with its target network;
the adapter it writes is a few-step adapter of these base weights; with a teacher adapter, RUN/lora.safetensors
holds both (the released weights plus it are the whole distilled model), the checkpoint's own adapter does not fit
the released weights alone and is refused there; the sheets show the student beside the teacher."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from ootd.app.signals import sigterm_as_interrupt
from ootd.app.train.checkpoints import checkpoints
from ootd.app.train.distill import TARGET_FILE, DistillOptions
from ootd.app.train.loop import open_run, run_loop, train_local
from ootd.errors import CheckpointError, UsageError
from ootd.settings import ModelType, SchedulerName
from ootd.training.cache import read_index
from ootd.training.settings import DistillSettings
from ootd.weights.fewstep import weights_sha256
from ootd.weights.lora import LoraChoice, read_adapter, read_choice
from tests.helpers.training import prepared_cache, write_adapter


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory, tiny_tree: Path, example_images: dict) -> Path:
    return prepared_cache(tmp_path_factory.mktemp("distill"), tiny_tree, example_images, split=0.0)


def _settings(**kw: object) -> DistillSettings:
    base = {"steps": 4, "learning_rate": 1e-2, "warmup": 0, "rank": 4, "alpha": 4, "validation_pairs": 0,
            "checkpoint_every": 2, "ema_decay": 0.5}
    return DistillSettings.from_words(**{**base, **kw})  # type: ignore[arg-type]


def _files(run: Path, step: int) -> dict[str, torch.Tensor]:
    folder = run / "checkpoints" / f"step-{step:08d}"
    return {**load_file(str(folder / "lora.safetensors")),
            **{f"target:{k}": v for k, v in load_file(str(folder / TARGET_FILE)).items()}}


def test_a_resumed_distillation_ends_with_the_uninterrupted_weights(cache: Path, tiny_tree: Path,
                                                                    tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    train_local(DistillOptions(cache, whole, tiny_tree, _settings()))
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000004")
    (resumed / "lora.safetensors").unlink()
    report = train_local(DistillOptions(cache, resumed, tiny_tree, _settings(), resume=True))
    assert (report.first_step, report.steps) == (2, 4)
    a, b = _files(whole, 4), _files(resumed, 4)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    start = _files(whole, 2)
    moved = [k for k in a if not torch.equal(a[k], start[k])]
    assert any(k.startswith("target:") for k in moved) and any(not k.startswith("target:") for k in moved)
    adapter = read_adapter(whole / "lora.safetensors")
    assert adapter.few_step is not None and adapter.few_step.base_sha256 == weights_sha256(tiny_tree, ModelType.HD)
    assert (adapter.few_step.steps, adapter.few_step.scheduler, adapter.few_step.teacher_guidance) == (
        4, SchedulerName.LCM, 2.0)
    with pytest.raises(UsageError, match="ema_decay 0.5 \\(now 0.9\\)"):
        train_local(DistillOptions(cache, resumed, tiny_tree, _settings(ema_decay=0.9), resume=True))


def test_two_distillations_on_one_owner_end_with_the_student_and_target_of_each_alone(cache: Path, tiny_tree: Path,
                                                                                      tmp_path: Path) -> None:
    """The first distillation trains the student's adapter the owner holds in place; the second, of the same
    settings on the same owner, starts from the adapter as made (its target network too) and ends where the
    first did, bit for bit."""
    from ootd.app.train.loop import training_models

    settings = _settings(steps=2, checkpoint_every=2)
    index = read_index(cache)
    owner = training_models(DistillOptions(cache, tmp_path / "unused", tiny_tree, settings))
    for name in ("first", "second"):
        options = DistillOptions(cache, tmp_path / name, tiny_tree, settings)
        train_local(options, models=options.load_models(index, owner), index=index)
    a, b = _files(tmp_path / "first", 2), _files(tmp_path / "second", 2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_signal_during_the_optimizer_step_checkpoints_the_step_and_its_target(cache: Path, tiny_tree: Path,
                                                                               tmp_path: Path) -> None:
    """SIGTERM inside optimizer.step: the checkpoint is labelled with the step taken, and its target network has
    followed that step (the EMA update is in the same unit as the optimizer's)."""
    run = tmp_path / "run"
    options = DistillOptions(cache, run, tiny_tree, _settings(steps=3, checkpoint_every=100))
    index = read_index(cache)
    open_run(options, index)
    trainer = options.make_trainer(options.load_models(index), index)
    objective = trainer.models.objective

    def signal_after_the_update(optimizer: Any, args: Any, kwargs: Any) -> None:
        if trainer.step == 1:
            signal.raise_signal(signal.SIGTERM)

    trainer.optimizer.register_step_post_hook(signal_after_the_update)
    with sigterm_as_interrupt(), pytest.raises(KeyboardInterrupt):
        run_loop(trainer)
    (saved,) = checkpoints(run)
    assert saved.step == trainer.step == 2
    target = load_file(str(saved.folder / TARGET_FILE))
    assert all(torch.equal(target[f"target.{i}"], t) for i, t in enumerate(objective.target))
    assert any(not torch.equal(t, p) for t, p in zip(objective.target, objective.student, strict=True))  # an EMA
    assert [json.loads(line)["step"] for line in (run / "loss.jsonl").read_text().splitlines()] == [1, 2]


def test_a_resume_publishes_the_teacher_and_the_student_folded_together(cache: Path, tiny_tree: Path,
                                                                        tmp_path: Path) -> None:
    """--resume makes RUN/lora.safetensors what its checkpoint published (a kill or a full device may have stopped
    that write): with a teacher adapter, the teacher and the student folded together, not the student alone."""
    teacher = LoraChoice.parse(write_adapter(tiny_tree, tmp_path / "shop.safetensors", trained=True, rank=4), 0.5)
    run = tmp_path / "run"
    train_local(DistillOptions(cache, run, tiny_tree, _settings(steps=2), teacher=teacher))
    published = (run / "lora.safetensors").read_bytes()
    (run / "lora.safetensors").write_bytes(published[: len(published) // 2])  # its write stopped half-way
    report = train_local(DistillOptions(cache, run, tiny_tree, _settings(steps=2), resume=True, teacher=teacher))
    assert (report.first_step, report.steps) == (2, 2)
    assert (run / "lora.safetensors").read_bytes() == published
    assert read_adapter(run / "lora.safetensors").rank == 8  # rank 4 + 4: the teacher's and the student's


@pytest.mark.slow
def test_a_teacher_adapter_is_folded_into_the_published_adapter(cache: Path, tiny_tree: Path, tmp_path: Path) -> None:
    """The student learns on top of base + teacher adapter: RUN/lora.safetensors (rank 4 + 4) changes the released
    weights by both, so it fits them; the checkpoint's own adapter (the student's alone) fits base + teacher only."""
    from diffusers import UNet2DConditionModel

    from ootd.weights.lora import merge_adapter

    teacher = write_adapter(tiny_tree, tmp_path / "shop.safetensors", trained=True, rank=4)
    run = tmp_path / "run"
    train_local(DistillOptions(cache, run, tiny_tree, _settings(steps=2), teacher=LoraChoice.parse(teacher, 0.5)))
    published, own = read_adapter(run / "lora.safetensors"), read_adapter(run / "checkpoints" / "step-00000002"
                                                                            / "lora.safetensors")
    assert (published.rank, own.rank) == (8, 4)
    base = weights_sha256(tiny_tree, ModelType.HD)
    assert published.few_step.base_sha256 == base != own.few_step.base_sha256
    read_choice(LoraChoice.parse(run / "lora.safetensors"), tiny_tree, ModelType.HD)  # fits the released weights
    with pytest.raises(CheckpointError, match="distilled from other base weights"):
        read_choice(LoraChoice.parse(own.path), tiny_tree, ModelType.HD)
    folder = tiny_tree / "ootd" / "ootd_hd" / "checkpoint-36000"

    def unets() -> dict[str, torch.nn.Module]:
        return {name: UNet2DConditionModel.from_pretrained(folder / name) for name in ("unet_vton", "unet_garm")}

    one, two = unets(), unets()
    merge_adapter(published, one, ModelType.HD, 1.0)
    merge_adapter(read_adapter(teacher), two, ModelType.HD, 0.5)
    merge_adapter(own, two, ModelType.HD, 1.0)
    for name in one:
        for (key, a), b in zip(one[name].state_dict().items(), two[name].state_dict().values(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=key)
    with pytest.raises(UsageError, match="resume continues a distillation of other base weights or another"):
        train_local(DistillOptions(cache, run, tiny_tree, _settings(steps=3), resume=True))  # without the teacher
    with pytest.raises(UsageError, match="teacher_lora .* is a few-step adapter"):
        train_local(DistillOptions(cache, tmp_path / "again", tiny_tree, _settings(steps=1),
                                   teacher=LoraChoice.parse(run / "lora.safetensors")))


@pytest.mark.slow
def test_the_sheets_show_the_student_beside_the_teacher(tiny_tree: Path, example_images: dict,
                                                       tmp_path: Path) -> None:
    from PIL import Image

    held_out = prepared_cache(tmp_path / "data", tiny_tree, example_images, split=0.5)
    run = tmp_path / "run"
    report = train_local(DistillOptions(held_out, run, tiny_tree, _settings(steps=1, validate_every=1,
                                                                           validation_pairs=1)))
    (row,) = report.validation
    assert set(row["ssim_to_teacher"]) == {"1", "2", "4", "8"}
    assert all(0 < v <= 1 for v in row["ssim_to_teacher"].values()) and row["ssim_mean"] == row["ssim_to_teacher"]["4"]
    with Image.open(run / "validation" / "step-00000001.png") as sheet:
        assert "teacher 20 steps | student 1 step | 2 steps | 4 steps | 8 steps" in sheet.text["columns"]
        assert sheet.width > 5 * sheet.height  # seven 3:4 pictures in a row
    assert (run / "loss.png").is_file() and not list(run.rglob(".*"))
