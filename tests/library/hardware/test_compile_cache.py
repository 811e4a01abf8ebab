"""torch.compile's cache is the user's, not a folder in the shared temporary folder: torch's default is
/tmp/torchinductor_USER, made as soon as diffusers imports torch._inductor (before any pipeline loads)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ootd.hardware.compile_cache import INDUCTOR_CACHE, inductor_cache_dir, use_user_cache
from tests.helpers import REPO

PROBE = "import ootd, diffusers, os; print(os.environ.get('TORCHINDUCTOR_CACHE_DIR'))"


def probe(tmp_path: Path, **env: str) -> tuple[str, list[str]]:
    shared = tmp_path / "tmp"
    shared.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if k not in (INDUCTOR_CACHE, "XDG_CACHE_HOME")}
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                            env={**clean, "PYTHONPATH": str(REPO), "TMPDIR": str(shared), **env})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip(), sorted(p.name for p in shared.iterdir())


@pytest.mark.slow  # a fresh interpreter imports the whole stack
def test_importing_ootd_and_diffusers_leaves_the_temporary_folder_alone(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    where, left = probe(tmp_path, HOME=str(home))
    assert where == str(home / ".cache" / "ootd" / "inductor") and left == []
    where, left = probe(tmp_path, HOME=str(home), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert where == str(tmp_path / "xdg" / "ootd" / "inductor") and left == []
    where, _ = probe(tmp_path, HOME=str(home), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "theirs"))
    assert where == str(tmp_path / "theirs")  # the user's own setting wins


def test_no_home_folder_keeps_torchs_default(tmp_path: Path) -> None:
    assert inductor_cache_dir({"HOME": str(tmp_path / "nobody")}) is None  # a service account without a home
    assert use_user_cache({"HOME": str(tmp_path / "nobody")}) is None
    environ = {"HOME": str(tmp_path), "XDG_CACHE_HOME": "relative/ignored"}
    assert use_user_cache(environ) == str(tmp_path / ".cache" / "ootd" / "inductor") == environ[INDUCTOR_CACHE]
    assert use_user_cache({INDUCTOR_CACHE: "/set", "HOME": str(tmp_path)}) == "/set"
