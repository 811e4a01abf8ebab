"""`ootd train run --engine ray`: two Ray Train CPU workers with the global batch of one worker end with the same
adapter weights, within float tolerance (DDP averages what one worker sums)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ootd.app.train.loop import TrainOptions, train_local
from ootd.app.train.ray_engine import train_ray
from ootd.training.settings import TrainSettings
from tests.helpers.training import prepared_cache

pytestmark = pytest.mark.slow


def test_two_ray_workers_match_one_worker_with_the_same_global_batch(tiny_tree: Path, example_images: dict,
                                                                     tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.train.torch")
    cache = prepared_cache(tmp_path / "data", tiny_tree, example_images, split=0.0)
    common = {"steps": 3, "learning_rate": 1e-2, "warmup": 0, "validation_pairs": 0, "train_garment": True}
    one = train_local(TrainOptions(cache, tmp_path / "one", tiny_tree,
                                   TrainSettings.from_words(batch_size=2, **common)))  # type: ignore[arg-type]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        two = train_ray(TrainOptions(cache, tmp_path / "two", tiny_tree,
                                     TrainSettings.from_words(batch_size=1, **common)), 2, False)  # type: ignore[arg-type]
    finally:
        ray.shutdown()
    assert two.steps == 3 and len(two.losses) == 3
    a, b = load_file(str(tmp_path / "one" / "lora.safetensors")), load_file(str(tmp_path / "two" / "lora.safetensors"))
    assert a.keys() == b.keys()
    start = {k: v for k, v in a.items() if ".lora_B." in k}
    assert any(v.abs().max() > 1e-3 for v in start.values())  # trained: B moved away from zero
    for key in a:  # float sums in another order (two processes, an all-reduce): ~1e-4 of weights that moved ~1e-2
        torch.testing.assert_close(b[key], a[key], rtol=1e-3, atol=5e-4)
    for x, y in zip(one.losses, two.losses, strict=True):
        assert abs(x - y) < 1e-4
