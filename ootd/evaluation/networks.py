"""The networks the metrics run on, loaded once per evaluation: torch-fidelity's InceptionV3 (its 2048 pool
features, the standard FID/KID features) and LPIPS v0.1 with its AlexNet (the lpips package), from the published
weights (ootd/evaluation/weights.py) or, when asked, randomly initialised stand-ins.

Both need the `eval` extra; without it (or with a torchvision that does not match this torch) `require_stack` is
one line naming the extra. The model owner (ootd/models/: `Models.metrics`) is what calls `load_networks`; other
networks (tests, an embedding application) are handed to it instead (its `ModelSource.metrics`).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ootd.errors import UnsupportedError
from ootd.evaluation.settings import MetricWeights
from ootd.evaluation.weights import ensure_weights, standard_weights

if TYPE_CHECKING:
    import torch

STACK_HINT = "pip install -e '.[eval]' after the torchvision built for this torch (docs/commands.md#ootd-eval)"
FEATURES = "2048"  # InceptionV3's pool features: what FID and KID are defined on
FEATURE_NAME = "InceptionV3 pool features, 2048 (torch-fidelity)"
LPIPS_NAME = "LPIPS v0.1, AlexNet (lpips)"
RANDOM_SEED = 0
RANDOM_NOTE = (f"stand-in weights: randomly initialised InceptionV3 and LPIPS AlexNet (seed {RANDOM_SEED}), not the "
               "published ones; these numbers compare to nothing")


@dataclass(frozen=True)
class Networks:
    """What the metrics call: `features(uint8 N x 3 x H x W) -> N x feature_dim`, `lpips(a, b in [-1, 1]) -> N`.
    `stand_in` says what stands in for the published weights (None when they are the published ones): every
    output carries it."""

    features: Callable[[torch.Tensor], torch.Tensor]
    feature_dim: int
    lpips: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    device: Any
    stand_in: str | None
    names: tuple[str, str] = (FEATURE_NAME, LPIPS_NAME)


def require_stack() -> None:
    """The eval extra's packages import here, or one line naming the extra (exit 3: another setup runs it)."""
    try:
        import lpips  # noqa: F401
        import torch_fidelity  # noqa: F401
        import torchmetrics  # noqa: F401
        import torchvision  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a missing package or a torchvision built for another torch
        cause = " ".join(str(exc).split())[:160]
        raise UnsupportedError(f"the metrics need the eval extra (torchmetrics, torch-fidelity, lpips, torchvision): "
                               f"{STACK_HINT} ({type(exc).__name__}: {cause})") from None


def check_networks(weights: MetricWeights) -> None:
    """What `load_networks` needs, checked before any work (a batch's pre-flight): the packages, and for the
    published weights their files (fetched when missing, else one line)."""
    require_stack()
    if weights is MetricWeights.STANDARD:
        ensure_weights()


def load_networks(weights: MetricWeights, device: Any) -> Networks:
    """The two networks on `device`, in eval mode, without gradients."""
    check_networks(weights)
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchvision's notice about lpips's `pretrained=` keyword
        if weights is MetricWeights.STANDARD:
            inception, lpips_net = published_modules()
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(RANDOM_SEED)
                inception, lpips_net = random_modules()
    inception = inception.to(device).eval().requires_grad_(False)
    lpips_net = lpips_net.to(device).eval().requires_grad_(False)

    def features(images: torch.Tensor) -> torch.Tensor:
        return inception(images)[0]

    def distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return lpips_net(a, b).flatten()

    return Networks(features, int(FEATURES), distance, device,
                    None if weights is MetricWeights.STANDARD else RANDOM_NOTE)


def published_modules() -> tuple[Any, Any]:
    """InceptionV3 and LPIPS with the published weights, from torch's hub cache."""
    import lpips
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    folder = ensure_weights()
    inception_file = folder / standard_weights()[0].file
    inception = FeatureExtractorInceptionV3("inception-v3-compat", [FEATURES],
                                            feature_extractor_weights_path=str(inception_file))
    # torchvision finds the AlexNet weights in torch's hub cache, where ensure_weights put them
    return inception, lpips.LPIPS(net="alex", version="0.1", verbose=False)


def random_modules() -> tuple[Any, Any]:
    """The same architectures, randomly initialised (He-normal convolutions, so features keep their scale
    through InceptionV3's depth): for trying the command and for measuring, never for numbers to compare."""
    import lpips
    import torch
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    class RandomInception(FeatureExtractorInceptionV3):
        def load_state_dict(self, state_dict: Any, *args: Any, **kwargs: Any) -> Any:  # keep the random init
            return None

    empty = io.BytesIO()
    torch.save({}, empty)
    empty.seek(0)
    inception = RandomInception("inception-v3-compat", [FEATURES], feature_extractor_weights_path=empty)
    for module in inception.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
    return inception, lpips.LPIPS(net="alex", version="0.1", pretrained=False, pnet_rand=True, verbose=False)
