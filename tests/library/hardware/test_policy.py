"""Device/precision/attention/environment policy as pure functions of fake DeviceInfos."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ootd.errors import DeviceError, UsageError
from ootd.hardware.device import DeviceInfo, detect_device, gfx_name, kfd_gpu_archs
from ootd.hardware.policy import (
    apply_environment,
    attention_budget_for,
    choose_precision,
    free_memory,
    runtime_environment,
)
from ootd.hardware.profiles import PROFILES_DIR, load_profile, profile_name

GIB = 1 << 30
fp32, fp16, bf16 = torch.float32, torch.float16, torch.bfloat16

DEVICES = {
    "gfx1100": DeviceInfo(type="cuda", index=0, vendor="amd", arch="gfx1100", name="Radeon RX 7900 XTX",
                          total_memory=24 * GIB, free_memory=23 * GIB),
    "gfx1151": DeviceInfo(type="cuda", index=0, vendor="amd", arch="gfx1151", name="Radeon 8060S",
                          total_memory=128 * GIB, free_memory=100 * GIB, unified_memory=True),
    "gfx942": DeviceInfo(type="cuda", index=0, vendor="amd", arch="gfx942", name="MI300X",
                         total_memory=192 * GIB, free_memory=190 * GIB),
    "sm_90": DeviceInfo(type="cuda", index=0, vendor="nvidia", arch="sm_90", name="H100",
                        total_memory=80 * GIB, free_memory=79 * GIB),
    "cpu": DeviceInfo(type="cpu"),
    "mps": DeviceInfo(type="mps", vendor="apple", arch="mps", name="Apple MPS", unified_memory=True),
}
TORCH = {"amd": "2.11.0+rocm7.0", "nvidia": "2.8.0+cu128", "cpu": "2.13.0+cpu", "apple": "2.13.0"}

# device -> (auto unet dtype, auto vae dtype, bf16 allowed, attention order, environment keys)
TABLE = {
    "gfx1100": (fp16, fp16, True, ("sdpa", "flash", "chunked"),
                {"PYTORCH_HIP_ALLOC_CONF", "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL", "MIOPEN_FIND_MODE"}),
    "gfx1151": (fp16, fp32, True, ("sdpa", "flash", "chunked"),
                {"PYTORCH_HIP_ALLOC_CONF", "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL", "MIOPEN_FIND_MODE"}),
    "gfx942": (fp16, fp16, True, ("sdpa", "flash", "chunked"), {"PYTORCH_HIP_ALLOC_CONF"}),
    "sm_90": (fp16, fp16, True, ("sdpa", "flash", "chunked"), {"PYTORCH_CUDA_ALLOC_CONF"}),
    "cpu": (fp32, fp32, True, ("sdpa", "chunked"), set()),
    "mps": (fp16, fp16, False, ("chunked",), set()),
}


@pytest.mark.parametrize("key", list(TABLE))
def test_policy_table(key: str) -> None:
    info = DEVICES[key]
    unet, vae, bf16_ok, order, env_keys = TABLE[key]
    assert profile_name(info) == key
    precision = choose_precision(info)
    assert (precision.unet, precision.vae, precision.text_encoder, precision.image_encoder) == (unet, vae, unet, unet)
    if bf16_ok:
        chosen = choose_precision(info, "bf16")
        assert chosen.unet is bf16 and chosen.vae is bf16  # bf16 has fp32's range: no VAE upcast
    else:
        with pytest.raises(DeviceError, match="bf16"):
            choose_precision(info, "bf16")
    assert choose_precision(info, "fp32").vae is fp32
    assert load_profile(info).attention_order == order
    env = runtime_environment(info, TORCH[info.vendor])
    assert set(env) == env_keys
    assert "HSA_OVERRIDE_GFX_VERSION" not in env
    if "MIOPEN_FIND_MODE" in env:
        assert env["MIOPEN_FIND_MODE"] == "FAST"
    if "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL" in env:
        assert env["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] == "1"
    for name in ("PYTORCH_HIP_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        if name in env:
            assert env[name] == "expandable_segments:True"


def test_precision_errors() -> None:
    with pytest.raises(DeviceError, match="fp16"):
        choose_precision(DEVICES["cpu"], "fp16")
    with pytest.raises(DeviceError, match="unknown precision"):
        choose_precision(DEVICES["cpu"], "int8")
    old_nvidia = DeviceInfo(type="cuda", index=0, vendor="nvidia", arch="sm_75")
    with pytest.raises(DeviceError, match="bf16"):
        choose_precision(old_nvidia, "bf16")
    assert choose_precision(old_nvidia).vae is fp32  # generic profile keeps the VAE in fp32


def test_profile_names() -> None:
    def name(vendor: str, arch: str) -> str:
        return profile_name(DeviceInfo(type="cuda", vendor=vendor, arch=arch))

    assert name("nvidia", "sm_86") == "sm_80"
    assert name("nvidia", "sm_89") == "sm_80"
    assert name("nvidia", "sm_120") == "sm_90"
    assert name("nvidia", "sm_75") == "generic"
    assert name("amd", "gfx1101") == "gfx1101"
    assert name("amd", "gfx1030") == "generic"
    assert name("amd", "unknown") == "generic"


@pytest.mark.parametrize("path", sorted(PROFILES_DIR.glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_profile_loads(path: Path) -> None:
    info = {"cpu": DEVICES["cpu"], "mps": DEVICES["mps"], "generic": DeviceInfo(type="cuda", arch="x")}.get(
        path.stem, DeviceInfo(type="cuda", arch=path.stem))
    profile = load_profile(info)
    assert profile.name == path.stem
    assert "chunked" in profile.attention_order  # the memory-bounded fallback is always there
    assert "math" not in profile.attention_order


def test_environment_versions() -> None:
    gfx1100 = DEVICES["gfx1100"]
    old_torch = runtime_environment(gfx1100, "2.9.1+rocm6.4")
    assert "PYTORCH_HIP_ALLOC_CONF" not in old_torch and old_torch["MIOPEN_FIND_MODE"] == "FAST"
    old_rocm = runtime_environment(gfx1100, "2.11.0+rocm6.4")
    assert "PYTORCH_HIP_ALLOC_CONF" not in old_rocm
    assert "PYTORCH_HIP_ALLOC_CONF" in runtime_environment(gfx1100, "2.12.0.dev20260301+rocm7.1")
    rdna_unknown = DeviceInfo(type="cuda", vendor="amd", arch="gfx1030")
    env = runtime_environment(rdna_unknown, "2.11.0+rocm7.0")
    assert env.get("MIOPEN_FIND_MODE") == "FAST" and "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL" not in env
    assert runtime_environment(DEVICES["sm_90"], "2.0.1+cu118") == {}


def test_apply_environment_keeps_user_values() -> None:
    environ = {"MIOPEN_FIND_MODE": "NORMAL", "PATH": "/bin"}
    wanted = runtime_environment(DEVICES["gfx1151"], TORCH["amd"])
    applied = apply_environment(wanted, environ)
    assert environ["MIOPEN_FIND_MODE"] == "NORMAL"
    assert "MIOPEN_FIND_MODE" not in applied
    assert environ["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] == "1"
    assert set(applied) == set(wanted) - {"MIOPEN_FIND_MODE"}
    assert apply_environment(wanted, environ) == {}


def test_user_profile_overrides(tmp_path: Path) -> None:
    user = tmp_path / "mine.toml"
    user.write_text('[attention]\norder = ["chunked"]\nbudget_max_mib = 512\n[precision]\nbf16 = false\n')
    info = DEVICES["gfx1100"]
    profile = load_profile(info, user)
    assert profile.attention_order == ("chunked",)
    assert profile.attention_budget_max_mib == 512
    assert profile.attention_sdpa_max_head_dim == 256  # untouched keys keep the shipped values
    assert profile.environment_aotriton_experimental is True
    with pytest.raises(DeviceError, match="bf16"):
        choose_precision(info, "bf16", profile)
    assert attention_budget_for(free_memory(info), info, profile) == 512 << 20
    user.write_text("[attention]\nordr = []\n")
    with pytest.raises(DeviceError, match="ordr"):
        load_profile(info, user)
    user.write_text('[attention]\norder = ["xformers"]\n')
    with pytest.raises(DeviceError, match="xformers"):
        load_profile(info, user)
    with pytest.raises(DeviceError, match="not found"):
        load_profile(info, tmp_path / "missing.toml")


def test_attention_budget_from_free_memory() -> None:
    def budget(info: DeviceInfo) -> int:
        return attention_budget_for(free_memory(info), info, load_profile(info))

    assert budget(DEVICES["gfx1100"]) == 2048 << 20  # 25% of 23 GiB, capped
    assert budget(DEVICES["cpu"]) == 1024 << 20  # memory unknown: the cap
    small = DeviceInfo(type="cuda", vendor="nvidia", arch="sm_86", total_memory=GIB, free_memory=100 << 20)
    assert budget(small) == 64 << 20  # floor


def test_kfd_topology(tmp_path: Path) -> None:
    for node, version in [("0", 0), ("1", 110000), ("2", 110501), ("10", 90010)]:
        (tmp_path / node).mkdir()
        (tmp_path / node / "properties").write_text(f"cpu_cores_count 0\ngfx_target_version {version}\n")
    assert kfd_gpu_archs(tmp_path) == ["gfx1100", "gfx1151", "gfx90a"]
    assert kfd_gpu_archs(tmp_path / "absent") == []
    assert gfx_name(90402) == "gfx942" and gfx_name(110001) == "gfx1101"


def test_detect_device_errors() -> None:
    assert detect_device("cpu").type == "cpu"
    with pytest.raises(UsageError, match="unknown device"):
        detect_device("tpu:0")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError):
            detect_device("cuda:0")


# -- bf16 on CPUs with bf16 matrix units ----------------------------------------------------------------------

XEON_FLAGS = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 amx_tile\n"
ZEN3_FLAGS = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize(("text", "expected"), [(XEON_FLAGS, True), (ZEN3_FLAGS, False), (GRAVITON3, True),
                                                ("flags: avx512_bf16x\n", False), ("model name: bf16 box\n", False)])
def test_bf16_flags(text: str, expected: bool) -> None:
    from ootd.hardware.device import bf16_flags

    assert bf16_flags(text) is expected


def test_cpu_bf16_detection_and_override(tmp_path: Path) -> None:
    from ootd.hardware.device import cpu_bf16_matmul

    info = tmp_path / "cpuinfo"
    info.write_text(XEON_FLAGS)
    assert cpu_bf16_matmul({}, info) is True
    assert cpu_bf16_matmul({"OOTD_CPU_BF16": "0"}, info) is False
    info.write_text(ZEN3_FLAGS)
    assert cpu_bf16_matmul({}, info) is False
    assert cpu_bf16_matmul({"OOTD_CPU_BF16": "1"}, info) is True
    assert cpu_bf16_matmul({}, tmp_path / "missing") is False
    with pytest.raises(DeviceError, match="OOTD_CPU_BF16"):
        cpu_bf16_matmul({"OOTD_CPU_BF16": "maybe"}, info)


def test_auto_precision_is_bf16_only_on_cpus_with_bf16_units() -> None:
    plain, bf16_cpu = DeviceInfo(type="cpu"), DeviceInfo(type="cpu", bf16_matmul=True)
    auto = choose_precision(bf16_cpu, "auto")
    assert (auto.unet, auto.vae, auto.text_encoder) == (bf16, bf16, bf16)
    assert "bf16 matrix units" in auto.word() and "--precision fp32" in auto.word()
    assert choose_precision(plain, "auto").unet is fp32 and choose_precision(plain, "auto").reason == ""
    exact = choose_precision(bf16_cpu, "fp32")  # the user's word wins, with no reason attached
    assert (exact.unet, exact.vae, exact.word()) == (fp32, fp32, "fp32")
    # a GPU's auto is its profile's half dtype whatever the flag says
    assert choose_precision(replace_flag(DEVICES["sm_90"]), "auto").unet is fp16


def replace_flag(info: DeviceInfo) -> DeviceInfo:
    from dataclasses import replace

    return replace(info, bf16_matmul=True)


def test_profile_rejects_a_bad_bf16_auto(tmp_path: Path) -> None:
    user = tmp_path / "p.toml"
    user.write_text('[precision]\nauto_bf16_matmul = "fp8"\n')
    with pytest.raises(DeviceError, match="auto_bf16_matmul"):
        load_profile(DeviceInfo(type="cpu"), user)


def test_the_suite_runs_as_on_a_cpu_without_bf16_units() -> None:
    """conftest pins OOTD_CPU_BF16=0 so that images are the same on every CI machine."""
    assert detect_device("cpu").bf16_matmul is False
