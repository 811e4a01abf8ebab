"""Which PyTorch build a machine needs, seen on faked hardware (a /dev, /sys and /proc tree of the test's own, a
fake nvidia-smi), which build of an index fits, and the pairs and pins of an installed torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from ootd.hardware.torch_builds import (
    InstalledTorch,
    choose_kind,
    detect_gpus,
    pick_variant,
    torchvision_for,
    variants_in_listing,
)

SMI = ("+-----------------------------------------------------------------------------+\n"
       "| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: {cuda}     |\n")


def machine(root: Path, *, kfd: bool = False, displays: tuple[str, ...] = (), nvidia_proc: bool = False) -> Path:
    """A fake root: /dev/kfd, PCI display devices by vendor id, the NVIDIA driver's /proc file."""
    (root / "dev").mkdir(parents=True, exist_ok=True)
    if kfd:
        (root / "dev" / "kfd").touch()
    for i, vendor in enumerate(displays):
        device = root / "sys" / "bus" / "pci" / "devices" / f"0000:0{i}:00.0"
        device.mkdir(parents=True)
        (device / "class").write_text("0x030000\n")
        (device / "vendor").write_text(f"{vendor}\n")
    if nvidia_proc:
        (root / "proc" / "driver" / "nvidia").mkdir(parents=True)
        (root / "proc" / "driver" / "nvidia" / "version").write_text("NVRM version: 570.86.15\n")
    return root


def no_smi() -> None:
    return None


@pytest.mark.parametrize(("setup", "smi", "kind", "words"), [
    ({}, None, "cpu", "no GPU was found (no NVIDIA driver, no /dev/kfd)"),
    ({"kfd": True, "displays": ("0x1002",)}, None, "rocm", "an AMD GPU is here (/dev/kfd"),
    ({"kfd": True}, None, "rocm", "/dev/kfd"),  # an APU or a container given only the device
    ({"displays": ("0x10de",)}, "12.8", "cuda", "an NVIDIA GPU is here (nvidia-smi, driver up to CUDA 12.8)"),
    ({"nvidia_proc": True}, None, "cuda", "an NVIDIA GPU is here (/proc/driver/nvidia)"),
    ({"kfd": True, "displays": ("0x1002", "0x10de")}, "13.0", "cuda", "NVIDIA"),  # AMD iGPU + NVIDIA card
    ({"displays": ("0x1002",)}, None, "cpu", "an AMD display device without /dev/kfd"),
    ({"displays": ("0x10de",)}, None, "cpu", "an NVIDIA display device without its driver"),
])
def test_the_build_follows_the_gpu_found(tmp_path: Path, setup: dict, smi: str | None, kind: str,
                                         words: str) -> None:
    gpus = detect_gpus(machine(tmp_path, **setup), lambda: SMI.format(cuda=smi) if smi else None, "Linux")
    chosen, why = choose_kind(gpus)
    assert chosen == kind and words in why, why


def test_the_driver_cuda_version_is_read_from_nvidia_smi(tmp_path: Path) -> None:
    gpus = detect_gpus(machine(tmp_path), lambda: SMI.format(cuda="12.4"), "Linux")
    assert gpus.nvidia == "nvidia-smi" and gpus.driver_cuda == (12, 4)


def test_asking_decides_and_a_wrong_word_is_refused(tmp_path: Path) -> None:
    amd = detect_gpus(machine(tmp_path, kfd=True), no_smi, "Linux")
    assert choose_kind(amd, "cpu") == ("cpu", "OOTD_TORCH=cpu asks for it")
    assert choose_kind(amd, "cuda", "--build")[0] == "cuda"
    with pytest.raises(ValueError, match="OOTD_TORCH=metal: use one of cpu, cuda, rocm"):
        choose_kind(amd, "metal")


def test_macos_takes_pypis_wheel(tmp_path: Path) -> None:
    chosen, why = choose_kind(detect_gpus(machine(tmp_path), no_smi, "Darwin"))
    assert chosen is None and "MPS" in why


LISTING = "\n".join(
    f'<a href="/whl/{label}/torch-{version}%2B{label}-{py}-{py}-{plat}.whl#sha256=00">'
    f"torch-{version}+{label}-{py}-{py}-{plat}.whl</a><br/>"
    for version in ("2.13.0", "2.12.1")
    for label in ("cpu", "cu126", "cu128", "cu130", "rocm6.3", "rocm6.4", "rocm7.0")
    for py in ("cp311", "cp312")
    for plat in ("manylinux_2_28_x86_64", "manylinux_2_28_aarch64", "win_amd64")
    if not (version == "2.13.0" and label == "rocm7.0")  # a ROCm build only the older release has
)


def test_the_builds_of_a_release_for_this_python_and_platform() -> None:
    found = variants_in_listing(LISTING, "2.13.0", "cp311", "Linux", "x86_64")
    assert found == {"cpu", "cu126", "cu128", "cu130", "rocm6.3", "rocm6.4"}
    assert "rocm7.0" in variants_in_listing(LISTING, "2.12.1", "cp311", "Linux", "x86_64")
    assert variants_in_listing(LISTING, "2.13.0", "cp310", "Linux", "x86_64") == set()
    windows = variants_in_listing(LISTING, "2.13.0", "cp311", "Windows", "AMD64")
    assert "cu128" in windows


def test_the_newest_rocm_and_the_newest_cuda_the_driver_runs() -> None:
    found = variants_in_listing(LISTING, "2.13.0", "cp311", "Linux", "x86_64")
    assert pick_variant("rocm", found) == "rocm6.4"
    assert pick_variant("cuda", found, (12, 8)) == "cu128"
    assert pick_variant("cuda", found, (12, 9)) == "cu128"
    assert pick_variant("cuda", found, (13, 0)) == "cu130"
    assert pick_variant("cuda", found) == "cu130"  # the driver unknown: the newest
    assert pick_variant("cuda", found, (11, 8)) is None  # a driver older than every build
    assert pick_variant("cpu", found) == "cpu"
    assert pick_variant("rocm", {"cpu", "cu128"}) is None


@pytest.mark.parametrize(("torch", "vision"), [("2.13.0", "0.28.0"), ("2.14.1", "0.29.1"), ("2.9.1+cpu", "0.24.1"),
                                               ("2.4", "0.19.0"), ("1.13.1", None)])
def test_torchvision_made_for_each_torch(torch: str, vision: str | None) -> None:
    assert torchvision_for(torch) == vision


def test_an_installed_torch_pins_itself_and_its_torchvision_from_its_own_index() -> None:
    assert InstalledTorch("2.13.0+cpu").pair() == (["torch==2.13.0+cpu", "torchvision==0.28.0+cpu"],
                                                   "https://download.pytorch.org/whl/cpu")
    rocm = InstalledTorch("2.13.0+rocm6.4", hip="6.4.1")
    assert rocm.kind == "rocm" and rocm.pair()[1] == "https://download.pytorch.org/whl/rocm6.4"
    assert rocm.describe() == "torch 2.13.0+rocm6.4 (the ROCm build)"
    pypi = InstalledTorch("2.14.1", cuda="13.0")  # PyPI's: its torchvision is PyPI's too
    assert pypi.kind == "cuda" and pypi.pair() == (["torch==2.14.1", "torchvision==0.29.1"], None)
