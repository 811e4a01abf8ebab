"""The command `ootd eval` names for the metric networks: the eval extra beside the installed torch, which it pins
as it is (build label and all, so pip never replaces it), with the torchvision made for it from the index it came
from; in a checkout the checkout's extra under its lock (when the lock pins this torch), elsewhere the extra's
packages as the installed ootd declares them. Where the eval extra is installed (scripts/test_eval_stack.sh), pip
itself is asked what the command would change: never torch."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from ootd.evaluation import networks
from ootd.hardware import torch_builds
from ootd.hardware.torch_builds import InstalledTorch
from tests.helpers import REPO
from tests.helpers.evaluation import require_eval_stack


def command_for(monkeypatch: pytest.MonkeyPatch, torch: InstalledTorch) -> list[str]:
    monkeypatch.setattr(torch_builds, "installed_torch", lambda: torch)
    return shlex.split(networks.install_command())


@pytest.mark.parametrize(("torch", "pins", "index"), [
    (InstalledTorch("2.13.0+cpu"), ["torch==2.13.0+cpu", "torchvision==0.28.0+cpu"],
     "https://download.pytorch.org/whl/cpu"),
    (InstalledTorch("2.13.0+rocm6.4", hip="6.4.1"), ["torch==2.13.0+rocm6.4", "torchvision==0.28.0+rocm6.4"],
     "https://download.pytorch.org/whl/rocm6.4"),
    (InstalledTorch("2.13.0+cu128", cuda="12.8"), ["torch==2.13.0+cu128", "torchvision==0.28.0+cu128"],
     "https://download.pytorch.org/whl/cu128"),
    (InstalledTorch("2.14.1", cuda="13.0"), ["torch==2.14.1", "torchvision==0.29.1"], None),  # PyPI's pair
])
def test_the_command_pins_this_torch_and_its_torchvision(monkeypatch: pytest.MonkeyPatch, torch: InstalledTorch,
                                                         pins: list[str], index: str | None) -> None:
    monkeypatch.chdir(REPO)
    words = command_for(monkeypatch, torch)
    assert words[:4] == ["python", "-m", "pip", "install"]
    assert all(pin in words for pin in pins) and "-e" in words and ".[eval]" in words
    if index:
        assert words[words.index("--extra-index-url") + 1] == index
    else:
        assert "--extra-index-url" not in words and "--index-url" not in words
    locked = (REPO / "constraints.txt").read_text().splitlines()
    assert ("-c" in words) == (f"torch=={torch.version.split('+')[0]}" in locked)  # the lock when it fits


def test_outside_a_checkout_the_extras_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(networks, "checkout_root", lambda: None)  # an installed wheel
    words = command_for(monkeypatch, InstalledTorch("2.13.0+cpu"))
    assert "-e" not in words and "-c" not in words
    assert {w.split(">")[0].split("=")[0] for w in words} >= {"torchmetrics", "torch-fidelity", "lpips"}
    assert "torch==2.13.0+cpu" in words and "torchvision==0.28.0+cpu" in words


@pytest.mark.eval_stack
def test_installing_the_extra_as_said_never_changes_torch() -> None:
    """pip's own resolver, asked what the command would install here: neither torch nor torchvision."""
    require_eval_stack()
    words = shlex.split(networks.install_command())
    report = subprocess.run([sys.executable, *words[1:], "--dry-run", "--quiet", "--report", "-"], cwd=REPO,
                            capture_output=True, text=True, timeout=900)
    assert report.returncode == 0, report.stderr[-3000:]
    changed = {item["metadata"]["name"].lower() for item in json.loads(report.stdout)["install"]}
    assert not changed & {"torch", "torchvision"}, changed
