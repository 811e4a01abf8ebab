"""The metric weights: found in torch's hub cache, fetched when missing (here from file:// addresses, since the
network is not part of the tests), checked against their publisher's hash, and one line naming the files, where
they go and `ootd download --eval` when they cannot be had."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ootd.errors import CheckpointError
from ootd.evaluation import weights
from ootd.evaluation.weights import WeightsFile, ensure_weights, weights_dir


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    return tmp_path / "torch" / "hub" / "checkpoints"


def published(tmp_path: Path, name: str, data: bytes, checked: bool) -> WeightsFile:
    source = tmp_path / "server"
    source.mkdir(exist_ok=True)
    digest = hashlib.sha256(data).hexdigest()[:8]
    path = source / f"{name}-{digest}.pth"
    path.write_bytes(data)
    return WeightsFile(f"the {name} network", path.as_uri(), digest if checked else None)


def test_weights_live_in_torchs_hub_cache(hub: Path) -> None:
    assert weights_dir() == hub


def test_missing_weights_are_fetched_on_first_use_then_found(hub: Path, tmp_path: Path) -> None:
    files = [published(tmp_path, "a", b"alpha" * 100, checked=True), published(tmp_path, "b", b"beta", False)]
    assert ensure_weights(files) == hub
    assert (hub / files[0].file).read_bytes() == b"alpha" * 100 and (hub / files[1].file).read_bytes() == b"beta"
    for f in files:  # a second use asks nothing of the network
        Path(f.url.removeprefix("file://")).unlink()
    assert ensure_weights(files) == hub


def test_weights_that_cannot_be_had_are_one_line(hub: Path, tmp_path: Path) -> None:
    gone = WeightsFile("the InceptionV3 network", (tmp_path / "nowhere" / "inception-1234abcd.pth").as_uri())
    with pytest.raises(CheckpointError) as caught:
        ensure_weights([gone])
    line = str(caught.value)
    assert "\n" not in line and "inception-1234abcd.pth" in line and "ootd download --eval" in line
    assert str(hub) in line and gone.url in line
    assert not (hub / gone.file).exists()


def test_a_file_that_fails_its_hash_is_not_kept(hub: Path, tmp_path: Path) -> None:
    bad = published(tmp_path, "c", b"gamma", checked=True)
    Path(bad.url.removeprefix("file://")).write_bytes(b"tampered")
    with pytest.raises(CheckpointError, match="could not be downloaded"):
        ensure_weights([bad])
    assert not (hub / bad.file).exists() and not list(hub.glob("*.partial"))


def test_the_download_is_torch_hubs(monkeypatch: pytest.MonkeyPatch, hub: Path, tmp_path: Path) -> None:
    seen = []
    monkeypatch.setattr("torch.hub.download_url_to_file", lambda url, dst, **kw: seen.append((url, dst, kw)) or
                        Path(dst).write_bytes(b"x"))
    item = WeightsFile("w", "https://example.invalid/w-0123abcd.pth", "0123abcd")
    weights.fetch([item], hub)
    assert seen == [(item.url, str(hub / "w-0123abcd.pth"), {"hash_prefix": "0123abcd", "progress": False})]
