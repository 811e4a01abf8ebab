"""The networks the metrics run on, loaded once per evaluation: torch-fidelity's InceptionV3 (its 2048 pool
features, the standard FID/KID features) and LPIPS v0.1 with its AlexNet (the lpips package), from the published
weights (ootd/evaluation/weights.py) or, when asked, randomly initialised stand-ins.

Both need the `eval` extra; without it (or with a torchvision that does not match this torch) `stack_problem` is
one line saying what is missing and the exact command that installs it for this torch, without changing torch
(`install_command`); an evaluation then computes what needs no network (SSIM) and says so. The model owner
(ootd/models/: `Models.metrics`) is what calls `load_networks`; other networks (tests, an embedding application) are
handed to it instead (its `ModelSource.metrics`).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ootd.errors import UnsupportedError
from ootd.evaluation.settings import MetricWeights
from ootd.evaluation.weights import ensure_weights, standard_weights

if TYPE_CHECKING:
    import torch

EXTRA = "eval"
STACK_PACKAGES = "torchmetrics, torch-fidelity, lpips"
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


def checkout_root() -> Path | None:
    """The source checkout this ootd is imported from (an editable install), or None (an installed wheel)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "ootd" / "__init__.py").is_file() else None


def _extra_target(extra: str) -> list[str]:
    """What pip installs for `extra`: this checkout's own extra (with its lock, when it pins this torch), or the
    extra's requirements as the installed ootd declares them."""
    import os
    import re
    from importlib.metadata import PackageNotFoundError, requires

    from ootd.hardware.torch_builds import installed_torch, public_version

    checkout = checkout_root()
    if checkout is not None:
        where = "." if checkout == Path.cwd().resolve() else os.fspath(checkout)
        lock = checkout / "constraints.txt"
        torch = installed_torch()
        pinned = lock.is_file() and torch is not None and f"torch=={public_version(torch.version)}" in \
            lock.read_text().splitlines()
        return [*(["-c", lock.name if where == "." else os.fspath(lock)] if pinned else []), "-e", f"{where}[{extra}]"]
    try:
        declared = requires("ootd") or []
    except PackageNotFoundError:
        declared = []
    wanted, out = [extra], []
    while wanted:
        name = wanted.pop()
        for line in declared:
            found = re.match(r"\s*([^;]+?)\s*;.*extra\s*==\s*['\"]([^'\"]+)['\"]", line)
            if not found or found.group(2) != name:
                continue
            own = re.fullmatch(r"ootd\[([^\]]+)\]", found.group(1))
            if own:
                wanted += [e.strip() for e in own.group(1).split(",")]
            elif found.group(1).split(">")[0].split("=")[0].strip() != "torchvision":
                out.append(found.group(1))
    return out


def install_command(extra: str = EXTRA) -> str:
    """The one pip command that installs `extra` beside the installed torch: torch pinned as it is (build label
    and all, so pip never replaces it), and the torchvision made for it from the index torch came from."""
    from ootd.hardware.torch_builds import installed_torch, pip_command

    torch = installed_torch()
    if torch is None:
        return pip_command(_extra_target(extra))
    pins, index = torch.pair()
    return pip_command([*_extra_target(extra), *pins, *(["--extra-index-url", index] if index else [])])


def stack_problem() -> str | None:
    """Why the eval extra's networks cannot run here, with the command that fixes it (None: they can)."""
    from ootd.hardware.torch_builds import installed_torch, torchvision_problem

    mismatch = torchvision_problem()
    if mismatch is not None:
        return mismatch
    try:
        import lpips  # noqa: F401
        import torch_fidelity  # noqa: F401
        import torchmetrics  # noqa: F401
        import torchvision  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a missing package (or one that fails to import)
        torch = installed_torch()
        made_for = f" and the torchvision made for {torch.describe()}" if torch is not None else ", torchvision"
        cause = " ".join(str(exc).split())[:120]
        return (f"they need the {EXTRA} extra ({STACK_PACKAGES}{made_for}; {type(exc).__name__}: {cause}): "
                f"{install_command()}")
    return None


def require_stack() -> None:
    """The eval extra's packages import here, or one line saying what is missing and the command that installs it
    (exit 3: another setup runs it)."""
    problem = stack_problem()
    if problem is not None:
        raise UnsupportedError(f"the metric networks (LPIPS, FID, KID): {problem}")


def check_networks(weights: MetricWeights) -> str | None:
    """What `load_networks` needs, checked before any work (a batch's pre-flight): for the published weights
    their files (fetched when missing, else one line). Returns why the networks cannot run here (None: they
    can): the metrics that need them are then not computed, and the output says so with the fix."""
    problem = stack_problem()
    if problem is None and weights is MetricWeights.STANDARD:
        ensure_weights()
    return problem


def load_networks(weights: MetricWeights, device: Any) -> Networks | None:
    """The two networks on `device`, in eval mode, without gradients; None when the eval extra is not here
    (`stack_problem` says why)."""
    if check_networks(weights) is not None:
        return None
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
