"""`python -m ootd.tools.torch_install` (what scripts/setup_env.sh runs first) as a command: on faked hardware
(a root of the test's own, a fake nvidia-smi on PATH) against a mirror of the wheel index in a folder, the line
that says which build and why, the fallback to PyPI with its line, and the pip command; and on this machine for
real (no GPU: the CPU build; download.pytorch.org is out of reach here, so the fallback is what runs)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.library.hardware.test_torch_builds import LISTING, SMI, machine

PY = f"cp{sys.version_info[0]}{sys.version_info[1]}"


def mirror(folder: Path) -> str:
    """A folder laid out as the index (one page of torch's wheels), as a file:// address."""
    (folder / "torch").mkdir(parents=True)
    (folder / "torch" / "index.html").write_text(LISTING.replace("cp311", PY))
    return folder.as_uri()


def fake_smi(folder: Path, cuda: str) -> str:
    """A PATH whose nvidia-smi prints a driver's header."""
    folder.mkdir(parents=True, exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{SMI.format(cuda=cuda)}EOF\n")
    smi.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def install(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("OOTD_TORCH", "OOTD_TORCH_INDEX_ROOT")}
    return subprocess.run([sys.executable, "-m", "ootd.tools.torch_install", *args], cwd=REPO,
                          env={**base, **(env or {})}, capture_output=True, text=True, timeout=120)


def test_an_amd_gpu_gets_the_newest_rocm_build_pinned_with_its_label(tmp_path: Path) -> None:
    root = machine(tmp_path / "root", kfd=True, displays=("0x1002",))
    index = mirror(tmp_path / "whl")
    done = install("--torch", "2.13.0", "--torchvision", "--sysroot", str(root), "--index-root", index, "--dry-run")
    assert done.returncode == 0, done.stderr
    said, would = done.stdout.strip().splitlines()
    assert said == ("torch: the ROCm build of torch 2.13.0, rocm6.4 (the newest ROCm build), because an AMD GPU is "
                    "here (/dev/kfd, ROCm's compute interface)")
    assert would == (f"torch: would run: python -m pip install torch==2.13.0+rocm6.4 torchvision==0.28.0+rocm6.4 "
                     f"--index-url {index}/rocm6.4")


def test_an_nvidia_gpu_gets_the_newest_cuda_build_its_driver_runs(tmp_path: Path) -> None:
    root = machine(tmp_path / "root", displays=("0x10de",))
    index = mirror(tmp_path / "whl")
    done = install("--torch", "2.13.0", "--sysroot", str(root), "--index-root", index, "--dry-run",
                   env={"PATH": fake_smi(tmp_path / "bin", "12.9")})
    assert done.returncode == 0, done.stderr
    said, would = done.stdout.strip().splitlines()
    assert "the CUDA build of torch 2.13.0, cu128 (the newest CUDA build the driver runs)" in said
    assert "an NVIDIA GPU is here (nvidia-smi, driver up to CUDA 12.9)" in said
    assert would == f"torch: would run: python -m pip install torch==2.13.0+cu128 --index-url {index}/cu128"


def test_ootd_torch_overrides_the_machine(tmp_path: Path) -> None:
    root = machine(tmp_path / "root", kfd=True)
    done = install("--torch", "2.13.0", "--sysroot", str(root), "--index-root", mirror(tmp_path / "whl"),
                   "--dry-run", env={"OOTD_TORCH": "cpu"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("torch: the CPU build of torch 2.13.0, cpu, because OOTD_TORCH=cpu asks for it\n")
    # the exact build is what this environment has: nothing to install
    assert "torch==2.13.0+cpu --index-url" in done.stdout or "torch 2.13.0+cpu installed already: kept" in done.stdout
    wrong = install("--torch", "2.13.0", "--dry-run", env={"OOTD_TORCH": "vulkan"})
    assert wrong.returncode == 2 and "OOTD_TORCH=vulkan: use one of cpu, cuda, rocm" in wrong.stderr


def test_an_index_out_of_reach_falls_back_to_pypi_with_a_line(tmp_path: Path) -> None:
    root = machine(tmp_path / "root", kfd=True)
    gone = (tmp_path / "nowhere").as_uri()
    done = install("--torch", "2.13.0", "--torchvision", "--sysroot", str(root), "--index-root", gone, "--dry-run")
    assert done.returncode == 0, done.stderr
    chose, fallback, would = done.stdout.strip().splitlines()
    assert chose.startswith("torch: the ROCm build of torch 2.13.0, because an AMD GPU is here")
    assert fallback.startswith(f"torch: {gone} cannot be reached (") and "from PyPI instead" in fallback
    assert "PyPI's wheel is the CUDA build" in fallback
    assert would == "torch: would run: python -m pip install torch==2.13.0 torchvision==0.28.0"


def test_an_index_without_that_build_falls_back_to_pypi_with_a_line(tmp_path: Path) -> None:
    root = machine(tmp_path / "root", kfd=True)
    done = install("--torch", "2.11.0", "--sysroot", str(root), "--index-root", mirror(tmp_path / "whl"), "--dry-run")
    assert done.returncode == 0, done.stderr
    fallback = done.stdout.strip().splitlines()[1]
    assert f"has no ROCm build of torch 2.11.0 for {PY}" in fallback and "from PyPI instead" in fallback


def test_on_this_machine_the_cpu_build() -> None:
    """The real detection and the real index: no GPU here, so the CPU build; where download.pytorch.org cannot be
    reached (this machine reaches PyPI only) the fallback line, else the CPU index."""
    if Path("/dev/kfd").exists() or Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has a GPU")
    done = install("--torch", "2.13.0", "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    because = "because no GPU was found (no NVIDIA driver, no /dev/kfd)"
    assert lines[0] in (f"torch: the CPU build of torch 2.13.0, {because}",
                        f"torch: the CPU build of torch 2.13.0, cpu, {because}")
    if len(lines) == 3:
        assert "cannot be reached" in lines[1] and lines[2] == "torch: would run: python -m pip install torch==2.13.0"
    else:
        assert lines[1] == "torch: would run: python -m pip install torch==2.13.0+cpu --index-url " \
                           "https://download.pytorch.org/whl/cpu"


@pytest.mark.slow  # a fresh environment and a real install of torch (from a wheel at hand or the network)
def test_a_real_install_here_gives_the_cpu_build(tmp_path: Path) -> None:
    """The CPU path for real, as scripts/setup_env.sh runs it in a new environment: a torch that imports, of the
    CPU build, with the line that says so."""
    if Path("/dev/kfd").exists() or Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has a GPU")
    venv.create(tmp_path / "env", with_pip=True)
    python = tmp_path / "env" / "bin" / "python"
    done = subprocess.run([str(python), "-m", "ootd.tools.torch_install", "--torch", "2.13.0"], cwd=REPO,
                          capture_output=True, text=True, timeout=1800,
                          env={k: v for k, v in os.environ.items() if k not in ("OOTD_TORCH", "PYTHONPATH")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("torch: the CPU build of torch 2.13.0")
    assert done.stdout.strip().splitlines()[-1].startswith("torch: installed torch 2.13.0")
    probe = subprocess.run([str(python), "-c", "import torch; print(torch.__version__, torch.version.cuda, "
                            "torch.cuda.is_available())"], capture_output=True, text=True, timeout=300)
    version, cuda, available = probe.stdout.split()
    assert version.startswith("2.13.0") and available == "False"
    assert cuda == "None", f"a CUDA build was installed on a machine without a GPU: {probe.stdout}"
