"""The published weights the metrics need: which files, where they live, and fetching them.

They live where torch keeps downloaded weights, `$TORCH_HOME/hub/checkpoints` (by default
`~/.cache/torch/hub/checkpoints`), under the names the networks' own packages give them, so a machine that already
ran torch-fidelity or torchvision has them, and the networks find them there without asking the network:

- torch-fidelity's InceptionV3 (the TensorFlow FID network, converted): FID and KID features;
- torchvision's AlexNet (ImageNet): the backbone of LPIPS. LPIPS's own linear layers ship inside the lpips package.

Their addresses are read from those packages (declared there once). `ensure_weights` fetches what is missing on
first use, as the packages themselves would; when that cannot be done it is one line naming the files, where to
put them and `ootd download --eval`. The metrics never run on other weights unless asked (`--weights random`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ootd.errors import CheckpointError

DOWNLOAD_HINT = "`ootd download --eval` (where the network reaches them)"



@dataclass(frozen=True)
class WeightsFile:
    """One weight file: what it is, its address, and the file name it is kept under (the address's last part,
    as torch.hub names downloads); `sha256_prefix`: what its publisher checks it against (None: not checked)."""

    what: str
    url: str
    sha256_prefix: str | None = None

    @property
    def file(self) -> str:
        return self.url.rsplit("/", 1)[-1]


def weights_dir() -> Path:
    """torch's folder of downloaded weights ($TORCH_HOME/hub/checkpoints)."""
    import torch.hub

    return Path(torch.hub.get_dir()) / "checkpoints"


def standard_weights() -> tuple[WeightsFile, ...]:
    """The files of the standard metrics, with the addresses their packages declare (the eval extra's)."""
    from torch_fidelity.feature_extractor_inceptionv3 import URL_INCEPTION_V3
    from torchvision.models import AlexNet_Weights

    alexnet = AlexNet_Weights.IMAGENET1K_V1.url
    return (WeightsFile("InceptionV3 FID weights (torch-fidelity)", URL_INCEPTION_V3),
            WeightsFile("AlexNet ImageNet weights (torchvision, the LPIPS backbone)", alexnet,
                        alexnet.rsplit("-", 1)[-1].split(".")[0]))


def missing(files: Sequence[WeightsFile], folder: Path) -> list[WeightsFile]:
    return [f for f in files if not (folder / f.file).is_file() or (folder / f.file).stat().st_size == 0]


def _download(url: str, path: Path, sha256_prefix: str | None) -> None:
    """torch.hub's downloader: a temporary file beside `path`, checked, then renamed (never half a file)."""
    import torch.hub

    torch.hub.download_url_to_file(url, os.fspath(path), hash_prefix=sha256_prefix, progress=False)


def fetch(files: Sequence[WeightsFile], folder: Path,
          on_file: Callable[[WeightsFile, Path], None] | None = None) -> list[Path]:
    """Download `files` into `folder`; the first failure is one CheckpointError line (what was fetched before it
    stays)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create {folder}: {exc.strerror or exc}") from None
    done = []
    for item in files:
        path = folder / item.file
        if on_file is not None:
            on_file(item, path)
        try:
            _download(item.url, path, item.sha256_prefix)
        except Exception as exc:  # noqa: BLE001 - any failure of the network or the disk is one line
            still = missing(files, folder)
            raise CheckpointError(_missing_line(still, folder, f"{type(exc).__name__}: {_cause(exc)}")) from None
        done.append(path)
    return done


def _cause(exc: BaseException) -> str:
    link: BaseException = exc
    while (link.__cause__ or link.__context__) is not None:
        link = link.__cause__ or link.__context__  # type: ignore[assignment]
    reason = getattr(link, "reason", None) or link
    return " ".join(str(reason).split())[:160]


def _missing_line(files: Sequence[WeightsFile], folder: Path, why: str) -> str:
    names = "; ".join(f"{f.what}: {f.file} from {f.url}" for f in files)
    return (f"the metric weights are missing and could not be downloaded ({why}): {names}; run "
            f"{DOWNLOAD_HINT}, or put the files in {folder}")


def ensure_weights(files: Sequence[WeightsFile] | None = None) -> Path:
    """The folder holding every standard weight file, fetching the missing ones first (first use)."""
    files = standard_weights() if files is None else files
    folder = weights_dir()
    absent = missing(files, folder)
    if absent:
        fetch(absent, folder)
    return folder


def download_weights(force: bool = False, on_file: Callable[[WeightsFile, Path], None] | None = None
                     ) -> tuple[Path, list[Path]]:
    """`ootd download --eval`: the standard weight files into torch's hub cache (the missing ones, or all with
    `force`); returns the folder and the files fetched now."""
    folder = weights_dir()
    files = standard_weights()
    return folder, fetch(files if force else missing(files, folder), folder, on_file)
