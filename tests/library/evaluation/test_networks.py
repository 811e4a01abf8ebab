"""The eval extra's real networks: torch-fidelity's InceptionV3 and lpips's AlexNet, as `ootd eval` loads them.
The published weights cannot be downloaded here, so every network in these tests is randomly initialised - the
`--weights random` stand-ins, or random weights saved under the published files' names to drive the loading path
of the published ones. They check the plumbing (shapes, devices, determinism, where the files are read from), not
any number. Run by scripts/test_eval_stack.sh; skipped elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ootd.evaluation.networks import RANDOM_NOTE, load_networks, random_modules, require_stack
from ootd.evaluation.settings import MetricWeights
from tests.helpers.evaluation import require_eval_stack

pytestmark = pytest.mark.eval_stack

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def random_networks():  # noqa: ANN201
    require_eval_stack()
    return load_networks(MetricWeights.RANDOM, CPU)


def images(seed: int, n: int = 2, size: tuple[int, int] = (128, 96)) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, *size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_random_stand_ins_say_so_and_give_inception_features(random_networks) -> None:  # noqa: ANN001
    assert random_networks.stand_in == RANDOM_NOTE and random_networks.feature_dim == 2048
    with torch.inference_mode():
        a, b = random_networks.features(images(1)), random_networks.features(images(2))
    assert a.shape == (2, 2048) and a.dtype == torch.float32 and torch.isfinite(a).all()
    assert a.std() > 1e-4  # the He-normal start keeps the features' scale through InceptionV3's depth
    assert not torch.allclose(a, b)


def test_random_stand_ins_are_the_same_every_time(random_networks) -> None:  # noqa: ANN001
    again = load_networks(MetricWeights.RANDOM, CPU)
    x = images(3)
    with torch.inference_mode():
        assert torch.equal(random_networks.features(x), again.features(x))


def test_lpips_is_zero_for_identical_images_and_per_pair(random_networks) -> None:  # noqa: ANN001
    x = images(4).float() / 127.5 - 1
    y = images(5).float() / 127.5 - 1
    with torch.inference_mode():
        same = random_networks.lpips(x, x)
        other = random_networks.lpips(x, y)
    assert same.shape == (2,) and torch.allclose(same, torch.zeros(2), atol=1e-7)
    assert (other != 0).all()


def test_published_weights_are_read_from_torchs_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random weights saved under the published names: the standard path loads them from the cache and asks the
    network nothing."""
    require_eval_stack()
    import torchvision

    from ootd.evaluation import weights

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(weights, "_download", lambda *a: pytest.fail("nothing is to be downloaded"))
    folder = weights.weights_dir()
    folder.mkdir(parents=True)
    inception_file, alexnet_file = (folder / f.file for f in weights.standard_weights())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        inception, _ = random_modules()
    torch.save(inception.state_dict(), inception_file)
    torch.save(torchvision.models.alexnet(weights=None).state_dict(), alexnet_file)
    published = load_networks(MetricWeights.STANDARD, CPU)
    assert published.stand_in is None
    x = images(6)
    with torch.inference_mode():
        assert torch.equal(published.features(x), inception.eval()(x)[0])  # the file's weights, not another's
        assert published.lpips(x.float() / 255, x.float() / 255).abs().max() < 1e-7


def test_the_stack_imports() -> None:
    require_eval_stack()
    require_stack()
