"""The model owner's promises, with stand-in models (instant) and once on the tiny tree: the runtime resolved once,
what stays in memory together, failures remembered, one load reported once however many threads ask, release."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ootd.errors import CheckpointError
from ootd.models import DISPLACES, Keep, Kind, LoadTime, Models, ModelSource, use_models
from ootd.settings import ModelType
from tests.helpers.fakes import FakePipe
from tests.helpers.synthetic import synthetic_preprocessor


class Counter:
    """A stand-in source that counts its loads."""

    def __init__(self) -> None:
        self.loads: list[str] = []

    def pipeline(self, model_type: ModelType) -> FakePipe:
        self.loads.append(model_type.value)
        return FakePipe(model_type)

    def source(self) -> ModelSource:
        return ModelSource(self.pipeline, lambda: self.loads.append("preprocessor") or synthetic_preprocessor(),
                           metrics=lambda weights, device: self.loads.append("metrics") or object())


def test_one_pipeline_at_a_time_unless_told_and_each_loads_once() -> None:
    counter = Counter()
    models = Models(None, source=counter.source())
    hd = models.pipeline(ModelType.HD)
    assert models.pipeline("hd") is hd and counter.loads == ["hd"]  # held: no second load
    models.pipeline(ModelType.DC)
    assert models.held() == ["dc"] and not models.holds(ModelType.HD)  # the hd pipeline went first
    assert models.loads == {"hd": 1, "dc": 1}

    both = Models(None, source=Counter().source(), keep=Keep(pipelines=2))
    both.pipeline(ModelType.HD)
    both.pipeline(ModelType.DC)
    assert both.held() == ["hd", "dc"]
    both.pipeline(ModelType.HD)  # the least recently used is last to go
    assert both.held() == ["dc", "hd"]


def test_what_a_load_releases_first() -> None:
    """Pose + parsing stay beside a pipeline; the classifier goes unless kept; the metric networks never stay beside
    a pipeline, nor a pipeline beside them."""
    counter = Counter()
    models = Models(None, source=counter.source())
    models._held[(Kind.CLASSIFIER,)] = object()  # as if loaded (the classifier loads from a CLIP on disk)
    models.preprocessor()
    models.pipeline(ModelType.HD)
    assert models.held() == ["preprocessor", "hd"]
    from ootd.evaluation.settings import MetricWeights

    models.metrics(MetricWeights.RANDOM)
    assert models.held() == ["preprocessor", "metrics"]
    kept = Models(None, source=Counter().source(), keep=Keep(classifier=True))
    kept._held[(Kind.CLASSIFIER,)] = object()
    kept.pipeline(ModelType.HD)
    assert kept.held() == ["classifier", "hd"]
    assert Kind.PIPELINE in DISPLACES[Kind.METRICS] and Kind.PREPROCESSOR not in DISPLACES[Kind.PIPELINE]


def test_a_failed_load_is_remembered_and_raised_again_at_once() -> None:
    calls = []

    def broken(model_type: ModelType) -> FakePipe:
        calls.append(model_type)
        raise CheckpointError(f"the {model_type.value} UNet is damaged")

    models = Models(None, source=ModelSource(broken))
    for _ in range(3):
        with pytest.raises(CheckpointError, match="hd UNet is damaged"):
            models.pipeline(ModelType.HD)
    assert calls == [ModelType.HD] and str(models.failure(ModelType.HD)) == "the hd UNet is damaged"
    assert models.failure(ModelType.DC) is None


def test_a_failed_load_stands_until_its_files_change(tiny_tree: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """On a copy of the tiny tree: a damaged checkpoint fails, and fails again without being read; damaged
    otherwise, it fails with the fresh error; repaired in place (a server that stays up), it loads at the next ask."""
    import shutil

    import ootd.weights.loading as loading
    from ootd.runtime import RuntimeRequest
    from ootd.weights.layout import Layout

    tree = tmp_path / "checkpoints"
    shutil.copytree(tiny_tree, tree, ignore=shutil.ignore_patterns("ootd_dc"))
    weights = Layout(tree).unet_vton(ModelType.HD) / "diffusion_pytorch_model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    reads: list[str] = []
    real = loading.load_unet
    monkeypatch.setattr(loading, "load_unet", lambda folder, *a: reads.append(folder.name) or real(folder, *a))
    models = Models(tree, RuntimeRequest(device="cpu"))
    for _ in range(3):
        with pytest.raises(CheckpointError, match="cannot load the try-on UNet"):
            models.pipeline(ModelType.HD)
    assert reads == ["unet_garm", "unet_vton"]  # one load read the files; the asks after it read nothing
    weights.write_bytes(b"")  # another damage: a fresh load and its own error, remembered in turn
    for _ in range(2):
        with pytest.raises(CheckpointError, match="is empty"):
            models.pipeline(ModelType.HD)
    assert reads == ["unet_garm", "unet_vton"] * 2
    weights.write_bytes(good)  # repaired in place: the same path and inode
    pipe = models.pipeline(ModelType.HD)
    assert models.pipeline(ModelType.HD) is pipe and models.held() == ["hd"] and models.loads == {"hd": 1}
    assert reads == ["unet_garm", "unet_vton"] * 3 and models.failure(ModelType.HD) is None


def test_loads_report_progress_and_time_once_and_release_gives_them_back() -> None:
    ticks: list[tuple] = []
    models = Models(None, source=ModelSource(lambda model_type: time.sleep(0.02) or FakePipe(model_type)))
    with models.timed() as loading:
        models.pipeline(ModelType.HD, progress=lambda *tick: ticks.append(tick))
        models.pipeline(ModelType.HD, progress=lambda *tick: ticks.append(tick))  # held: nothing to report
    assert ticks == [("load", 0, 1), ("load", 1, 1)]
    assert isinstance(loading, LoadTime) and loading.count == 1 and 0.02 <= loading.seconds == models.seconds
    models.release()
    assert models.held() == []
    models.pipeline(ModelType.HD)
    assert models.loads == {"hd": 2}


def test_release_of_one_model_type_keeps_the_rest() -> None:
    """A host that unloads its models one at a time (ComfyUI) gets one pipeline back, not every pipeline."""
    counter = Counter()
    models = Models(None, source=counter.source(), keep=Keep(pipelines=2))
    models.pipeline(ModelType.HD), models.pipeline(ModelType.DC), models.preprocessor()
    models.release(Kind.PIPELINE, model_type=ModelType.HD)
    assert models.held() == ["dc", "preprocessor"]
    models.release(model_type=ModelType.DC)  # the pipelines of that type, whatever kinds are named
    assert models.held() == ["preprocessor"]
    models.pipeline(ModelType.HD)
    assert counter.loads == ["hd", "dc", "preprocessor", "hd"]


def test_one_load_however_many_threads_ask() -> None:
    counter = Counter()
    slow = ModelSource(lambda model_type: time.sleep(0.2) or counter.pipeline(model_type))
    models = Models(None, source=slow)
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(models.pipeline(ModelType.HD))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.loads == ["hd"] and len({id(pipe) for pipe in got}) == 1


def test_a_use_models_block_reaches_every_owner_made_in_it() -> None:
    counter = Counter()
    with use_models(counter.pipeline):
        inside = Models(None)
    assert isinstance(inside.pipeline(ModelType.DC), FakePipe) and counter.loads == ["dc"]
    assert Models(None).source is None


def test_the_runtime_is_resolved_once_for_every_model(tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the tiny tree: two pipelines, pose + parsing and the encoders all run on the one runtime, resolved when
    the first model loads; the pipelines are handed the owner's pose + parsing."""
    import ootd.runtime
    from ootd.runtime import RuntimeRequest

    resolved = []
    real = ootd.runtime.resolve_runtime
    monkeypatch.setattr(ootd.runtime, "resolve_runtime", lambda *a, **k: resolved.append(1) or real(*a, **k))
    models = Models(tiny_tree, RuntimeRequest(device="cpu"), keep=Keep(pipelines=2))
    assert resolved == [] and models.device is None  # nothing loaded, nothing resolved
    hd, dc = models.pipeline(ModelType.HD), models.pipeline(ModelType.DC)
    assert hd.preprocessor is dc.preprocessor is models.preprocessor()
    encoders = models.encoders()  # the try-on pipelines go first (a prepare never runs beside them)
    assert resolved == [1] and models.held() == ["preprocessor", "encoders"]
    assert encoders.device == models.device == models.runtime().device.torch_device
