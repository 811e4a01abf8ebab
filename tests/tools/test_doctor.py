"""`ootd doctor` report: the real machine (CPU-only here) and each detector with faked inputs."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from ootd.hardware.torch_builds import MachineGpus
from ootd.tools import doctor
from ootd.tools.doctor import (
    FAIL,
    GROUP_FIX,
    OK,
    WARN,
    GpuInfo,
    Report,
    TorchBuild,
    collect_report,
    device_access_items,
    env_items,
    flash_attn_items,
    gpu_items,
    onnxruntime_items,
    python_item,
    sdpa_items,
    torch_fit_items,
    torch_items,
    torchvision_items,
)
from ootd.weights.layout import Layout
from tests.helpers.trees import make_tree

# ------------------------------------------------------------------------------------------- this machine


def test_collect_report_here_without_checkpoints(tmp_path: Path) -> None:
    report = collect_report(tmp_path / "nowhere")
    assert isinstance(report, Report)
    assert not report.can_run and report.models_available == []
    sections = {item.section for item in report.items}
    assert {"python", "torch", "gpu", "attention", "onnxruntime", "checkpoints"} <= sections
    (ckpt,) = report.section("checkpoints")
    assert ckpt.status == FAIL and ckpt.blocking and "does not exist" in ckpt.detail
    assert "ootd download" in ckpt.fix
    for item in report.items:
        assert item.status in (OK, WARN, FAIL)
        assert "\n" not in item.detail


@pytest.mark.skipif(os.environ.get("OOTD_TEST_GPU") == "1", reason="CPU-only expectations")
def test_cpu_only_machine_reports_no_gpu(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    report = collect_report(tmp_path)
    (gpu,) = report.section("gpu")
    assert gpu.status == WARN and "no GPU" in gpu.detail
    assert any("flash-attn" == i.item and i.status == OK for i in report.section("attention"))


def test_collect_report_with_complete_checkpoints(tmp_path: Path) -> None:
    make_tree(tmp_path)
    report = collect_report(tmp_path)
    assert report.can_run, [i for i in report.items if i.status == FAIL]
    assert report.models_available == ["hd", "dc"]
    summary = next(i for i in report.section("checkpoints") if i.item == "summary")
    assert summary.status == OK and "22/22 files ok" in summary.detail
    architecture = next(i for i in report.section("checkpoints") if i.item == "architecture")
    assert architecture.status == WARN and "not the released" in architecture.detail  # a made-up tree


def test_one_model_missing_still_runs(tmp_path: Path) -> None:
    make_tree(tmp_path, models=("hd",))
    report = collect_report(tmp_path)
    assert report.can_run and report.models_available == ["hd"]
    items = report.section("checkpoints")
    assert items[0].status == WARN
    dc = [i for i in items if "(dc)" in i.item]
    assert len(dc) == 4 and all(i.status == WARN and not i.blocking for i in dc)
    assert all("the dc model cannot run" in i.detail for i in dc)


def test_shared_file_missing_blocks(tmp_path: Path) -> None:
    layout = make_tree(tmp_path)
    layout.parsing_atr.unlink()
    report = collect_report(tmp_path)
    assert not report.can_run and report.models_available == []
    bad = [i for i in report.section("checkpoints") if i.item == "human parsing ATR"]
    assert bad and bad[0].status == FAIL and bad[0].blocking and "download" in bad[0].fix


# ------------------------------------------------------------------------------------------- /dev access


def _fake_dev(root: Path, kfd: bool = True, renders: int = 1) -> Path:
    dev = root / "dev"
    (dev / "dri").mkdir(parents=True)
    if kfd:
        (dev / "kfd").write_text("")
    for i in range(renders):
        (dev / "dri" / f"renderD{128 + i}").write_text("")
    (dev / "dri" / "card0").write_text("")
    return dev


def test_devices_inaccessible_not_in_groups(tmp_path: Path) -> None:
    dev = _fake_dev(tmp_path, renders=2)
    items = device_access_items(dev, groups={"alice"}, configured={"alice"}, access=lambda p, m: False)
    nodes = [i for i in items if i.item != "groups"]
    assert [Path(i.item).name for i in nodes] == ["kfd", "renderD128", "renderD129"]
    assert all(i.status == FAIL for i in nodes)
    assert all(GROUP_FIX in i.fix for i in items if i.status == FAIL)
    assert GROUP_FIX == "sudo usermod -aG render,video $USER"
    (groups,) = [i for i in items if i.item == "groups"]
    assert groups.status == FAIL and "render, video" in groups.detail


def test_devices_added_to_groups_but_not_relogged(tmp_path: Path) -> None:
    dev = _fake_dev(tmp_path)
    items = device_access_items(dev, {"alice"}, {"alice", "render", "video"}, access=lambda p, m: False)
    assert all("log out and back in" in i.fix and "usermod" not in i.fix for i in items if i.status == FAIL)


def test_devices_accessible(tmp_path: Path) -> None:
    dev = _fake_dev(tmp_path)
    seen = []

    def access(path: Path, mode: int) -> bool:
        seen.append((path.name, mode))
        return True

    items = device_access_items(dev, {"alice", "render", "video"}, access=access)
    assert all(i.status == OK for i in items)
    assert ("kfd", os.R_OK | os.W_OK) in seen and ("renderD128", os.R_OK | os.W_OK) in seen
    assert "card0" not in {name for name, _ in seen}
    items = device_access_items(dev, {"root"}, access=lambda p, m: True)  # root, or ACLs: fine anyway
    assert all(i.status == OK for i in items)


def test_devices_in_groups_but_still_denied(tmp_path: Path) -> None:
    dev = _fake_dev(tmp_path)
    items = device_access_items(dev, {"render", "video"}, access=lambda p, m: p.name != "kfd")
    (kfd,) = [i for i in items if i.item.endswith("kfd")]
    assert kfd.status == FAIL and "ls -l" in kfd.fix


def test_no_kfd(tmp_path: Path) -> None:
    dev = _fake_dev(tmp_path, kfd=False)
    assert device_access_items(dev, set(), hip_build=False) == []
    (item,) = device_access_items(dev, set(), hip_build=True)
    assert item.status == FAIL and "amdgpu" in item.detail + item.fix


def test_no_render_nodes(tmp_path: Path) -> None:
    dev = _fake_dev(tmp_path, renders=0)
    items = device_access_items(dev, {"render", "video"}, access=lambda p, m: True)
    assert any(i.status == FAIL and "no render nodes" in i.detail for i in items)


# ------------------------------------------------------------------------------------------- other detectors


def test_python_version() -> None:
    assert python_item((3, 11, 4)).status == OK
    old = python_item((3, 10, 12))
    assert old.status == FAIL and old.blocking and "3.11" in old.fix


def test_torch_builds() -> None:
    cpu = torch_items(TorchBuild("2.9.0+cpu"))
    assert [i.status for i in cpu] == [OK, WARN] and "rocm" in cpu[1].fix
    hip = torch_items(TorchBuild("2.9.0+rocm7.0", hip="7.0.1", gpu_count=0))
    assert hip[1].detail.startswith("ROCm/HIP build") and hip[2].status == WARN and "/dev/kfd" in hip[2].fix
    cuda = torch_items(TorchBuild("2.9.0+cu128", cuda="12.8", gpu_count=1))
    assert [i.status for i in cuda] == [OK, OK] and "CUDA 12.8" in cuda[1].detail
    (missing,) = torch_items(TorchBuild(None, error="ImportError: no torch"))
    assert missing.status == FAIL and missing.blocking


KFD = Path("/dev/kfd")


@pytest.mark.parametrize(("build", "machine", "fix"), [
    (TorchBuild("2.13.0+cpu"), MachineGpus(amd="/dev/kfd", kfd=KFD),
     "python -m ootd.tools.torch_install --build rocm --torch 2.13.0"),
    (TorchBuild("2.13.0", cuda="13.0"), MachineGpus(amd="/dev/kfd", kfd=KFD),  # PyPI's CUDA build on an AMD GPU
     "python -m ootd.tools.torch_install --build rocm --torch 2.13.0"),
    (TorchBuild("2.13.0+cpu"), MachineGpus(nvidia="nvidia-smi", driver_cuda=(12, 8)),
     "python -m ootd.tools.torch_install --build cuda --torch 2.13.0"),
    (TorchBuild("2.13.0+rocm6.4", hip="6.4.1"), MachineGpus(nvidia="nvidia-smi"),
     "python -m ootd.tools.torch_install --build cuda --torch 2.13.0"),
])
def test_a_torch_that_cannot_use_the_machines_gpu_is_said_with_the_fix(build: TorchBuild, machine: MachineGpus,
                                                                       fix: str) -> None:
    (item,) = torch_fit_items(build, machine)
    assert item.status == FAIL and not item.blocking  # the CPU still runs try-ons
    assert f"PyTorch {build.version} is the" in item.detail and "cannot use it: try-ons run on the CPU" in item.detail
    assert item.fix == fix
    (vision,) = torch_fit_items(build, machine, torchvision=True)
    assert vision.fix == f"{fix} --torchvision"  # its torchvision is replaced with it


def test_a_rocm_torch_without_access_to_dev_kfd_is_said_with_the_fix(tmp_path: Path) -> None:
    kfd = tmp_path / "kfd"
    kfd.touch()
    rocm = TorchBuild("2.13.0+rocm6.4", hip="6.4.1")
    (denied,) = torch_fit_items(rocm, MachineGpus(amd="/dev/kfd", kfd=kfd), groups=({"users"}, {"users"}),
                                access=lambda path, mode: False)
    assert denied.status == FAIL and f"cannot open {kfd}" in denied.detail and GROUP_FIX in denied.fix
    (absent,) = torch_fit_items(rocm, MachineGpus())
    assert absent.status == FAIL and "there is no /dev/kfd" in absent.detail
    (fine,) = torch_fit_items(rocm, MachineGpus(amd="/dev/kfd", kfd=kfd), access=lambda path, mode: True)
    assert fine.status == OK and "the ROCm build, the one for this machine" in fine.detail


def test_the_build_that_fits_is_ok() -> None:
    (cpu,) = torch_fit_items(TorchBuild("2.13.0+cpu"), MachineGpus())
    assert cpu.status == OK and "no GPU was found" in cpu.detail
    (cuda,) = torch_fit_items(TorchBuild("2.13.0+cu128", cuda="12.8"), MachineGpus(nvidia="nvidia-smi"))
    assert cuda.status == OK
    assert torch_fit_items(TorchBuild(None, error="ImportError"), MachineGpus(nvidia="nvidia-smi")) == []


def test_a_torchvision_that_does_not_fit_blocks_with_its_fix() -> None:
    (item,) = torchvision_items(("torchvision 0.29.1 does not fit torch 2.13.0+cpu (the CPU build)", "install it"))
    assert item.status == FAIL and item.blocking and item.fix == "install it"
    assert torchvision_items(None) == []


def test_gpu_items() -> None:
    items = gpu_items([GpuInfo(0, "AMD Radeon RX 7900 XTX", "gfx1100", 24 * 2**30, 20 * 2**30)])
    assert items[0].status == OK and "gfx1100" in items[0].detail and "24.00 GiB total" in items[0].detail
    items = gpu_items(
        [GpuInfo(0, "NVIDIA H200", "sm_90", 141 * 2**30)], errors=["cuda:1: RuntimeError: boom"]
    )
    assert [i.status for i in items] == [OK, FAIL]
    assert gpu_items([])[0].status == WARN


def test_hsa_override_warning() -> None:
    gpus = [GpuInfo(0, "Radeon", "gfx1100", None)]
    assert env_items({"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}, gpus)[0].status == WARN
    assert env_items({}, gpus) == []
    assert env_items({"HSA_OVERRIDE_GFX_VERSION": "10.3.0"}, [GpuInfo(0, "Radeon", "gfx1031", None)]) == []


def _importer(modules: dict[str, object]):
    def import_module(name: str):
        value = modules.get(name)
        if value is None:
            raise ImportError(f"No module named {name!r}")
        if isinstance(value, Exception):
            raise value
        return value

    return import_module


def test_flash_attn_items() -> None:
    assert flash_attn_items(_importer({}), gpu=False)[0].status == OK
    assert flash_attn_items(_importer({}), gpu=True)[0].status == WARN
    broken = flash_attn_items(_importer({"flash_attn": OSError("undefined symbol: _ZN3c10")}), gpu=True)
    assert broken[0].status == WARN and "undefined symbol" in broken[0].detail
    module = SimpleNamespace(__version__="2.8.3")
    assert "kernel not run" in flash_attn_items(_importer({"flash_attn": module}), gpu=False)[0].detail
    bad = flash_attn_items(_importer({"flash_attn": module}), lambda m: "max error 3", gpu=True)
    assert bad[0].status == WARN and "max error 3" in bad[0].detail
    good = flash_attn_items(_importer({"flash_attn": module}), lambda m: None, gpu=True)
    assert good[0].status == OK and "kernel test passed" in good[0].detail


def test_sdpa_items() -> None:
    flags = {"flash": True, "mem_efficient": True, "math": True}
    assert [i.status for i in sdpa_items(flags, None, hip=False, environ={})] == [OK]
    works = sdpa_items(flags, {"flash": None, "mem_efficient": "no kernel"}, hip=True, environ={})
    assert works[1].status == OK and "flash" in works[1].detail
    broken = sdpa_items(flags, {"flash": "no kernel", "mem_efficient": "no kernel"}, hip=True, environ={})
    assert broken[1].status == WARN and "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1" in broken[1].fix
    already = sdpa_items(
        flags, {"flash": "x"}, hip=True, environ={"TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL": "1"}
    )
    assert "TORCH_ROCM_AOTRITON" not in already[1].fix


def test_onnxruntime_items() -> None:
    real = onnxruntime_items()
    assert real[0].status == OK and "CPUExecutionProvider" in real[1].detail
    (missing,) = onnxruntime_items(_importer({}))
    assert missing.status == FAIL and missing.blocking
    no_cpu = SimpleNamespace(__version__="1.0", get_available_providers=lambda: ["MIGraphXExecutionProvider"])
    assert onnxruntime_items(_importer({"onnxruntime": no_cpu}))[1].status == FAIL


def test_report_can_run_ignores_non_blocking_failures(tmp_path: Path) -> None:
    report = Report([doctor.Item("devices", "/dev/kfd", FAIL, "denied", GROUP_FIX)])
    assert report.can_run and report.worst == FAIL
    report.items.append(doctor.Item("checkpoints", "folder", FAIL, "missing", "download", blocking=True))
    assert not report.can_run
    assert Layout(tmp_path).root == tmp_path


def test_the_table_fits_the_terminal_width_when_piped(tmp_path: Path) -> None:
    """`ootd doctor | cat`: $COLUMNS is the width (long paths unwrapped only where no width is known)."""
    from ootd.cli.display import PIPED_WIDTH, piped_width
    from tests.helpers.cli import invoke

    result = invoke("doctor", "--checkpoints", tmp_path, "--quick", "--no-kernels", env={"COLUMNS": "90"})
    widths = [len(line) for line in result.stdout.splitlines()]
    assert widths and max(widths) <= 90, result.stdout
    assert piped_width({"COLUMNS": "132"}) == 132
    assert piped_width({}) == PIPED_WIDTH  # no terminal here (the test runner's streams): the wide default
