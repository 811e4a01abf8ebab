"""Which PyTorch build fits this machine, and which one is installed.

PyTorch publishes one wheel index per build (`https://download.pytorch.org/whl/<variant>`: `cpu`, `cu128`,
`rocm6.4`, ...); PyPI's Linux wheel is the CUDA build. What the machine has is seen without torch (the setup runs
this before torch exists): the NVIDIA driver (`nvidia-smi`, /proc/driver/nvidia) and AMD's compute interface
(/dev/kfd), with sysfs's display devices for a GPU whose driver is missing. torchvision is made for one torch:
2.N.P pairs with 0.(N+15).P, from the same index.

Standard library only, and importable without torch: the setup (ootd/tools/torch_install.py), the doctor and
`ootd eval` (the command that installs the metric networks for this torch) read it. `usable_torchvision` is the
one function that imports torch: a torchvision that does not fit it is one line wherever models load.
"""

from __future__ import annotations

import functools
import importlib.util
import platform
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

INDEX_ROOT = "https://download.pytorch.org/whl"
INDEX_ROOT_ENV = "OOTD_TORCH_INDEX_ROOT"  # a mirror of INDEX_ROOT (one folder per variant)
BUILD_ENV = "OOTD_TORCH"  # cpu, cuda or rocm: the build to install, whatever the machine has
KINDS = ("cpu", "cuda", "rocm")
KIND_NAMES = {"cpu": "CPU", "cuda": "CUDA", "rocm": "ROCm"}
AMD_VENDOR, NVIDIA_VENDOR = "0x1002", "0x10de"
DISPLAY_CLASS = "0x03"  # PCI class 03xxxx: display controllers (VGA, 3D)


# ----------------------------------------------------------------------------------------------- the machine


@dataclass(frozen=True)
class MachineGpus:
    """The GPUs a torch build could use, as seen without torch. Each field says how it was seen (None: not)."""

    nvidia: str | None = None  # the NVIDIA driver: "nvidia-smi" or "/proc/driver/nvidia"
    driver_cuda: tuple[int, int] | None = None  # the newest CUDA the NVIDIA driver runs (nvidia-smi's header)
    amd: str | None = None  # "/dev/kfd" (ROCm can use it) or "sysfs" (an AMD display device, no /dev/kfd)
    kfd: Path | None = None  # /dev/kfd, when present
    other: str | None = None  # a GPU no build can use as it is (an NVIDIA device without its driver)
    system: str = "Linux"


def _nvidia_smi() -> str | None:
    """nvidia-smi's output, or None without it (or when it fails: no driver loaded)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _display_vendors(root: Path) -> set[str]:
    vendors = set()
    for device in sorted((root / "sys" / "bus" / "pci" / "devices").glob("*")):
        try:
            if (device / "class").read_text().strip().startswith(DISPLAY_CLASS):
                vendors.add((device / "vendor").read_text().strip().lower())
        except OSError:
            continue
    return vendors


def driver_cuda_version(smi_output: str) -> tuple[int, int] | None:
    found = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", smi_output)
    return (int(found.group(1)), int(found.group(2))) if found else None


def detect_gpus(root: Path = Path("/"), nvidia_smi: Callable[[], str | None] = _nvidia_smi,
                system: str | None = None) -> MachineGpus:
    """What this machine has (`root`: where its /dev, /sys and /proc are; tests give a fake tree)."""
    system = system or platform.system()
    smi = nvidia_smi()
    vendors = _display_vendors(root)
    nvidia = "nvidia-smi" if smi is not None else (
        "/proc/driver/nvidia" if (root / "proc" / "driver" / "nvidia" / "version").exists() else None)
    kfd = root / "dev" / "kfd"
    amd = "/dev/kfd" if kfd.exists() else ("sysfs" if AMD_VENDOR in vendors else None)
    other = "an NVIDIA display device without its driver" if nvidia is None and NVIDIA_VENDOR in vendors else None
    return MachineGpus(nvidia, driver_cuda_version(smi) if smi else None, amd, kfd if kfd.exists() else None,
                       other, system)


def choose_kind(gpus: MachineGpus, wanted: str | None = None, asked_by: str = BUILD_ENV) -> tuple[str | None, str]:
    """The build for this machine (`cpu`, `cuda`, `rocm`; None: PyPI's, as on macOS) and why, in words.
    `wanted` decides when given (`asked_by`: where it came from, OOTD_TORCH or an option)."""
    if wanted:
        if wanted not in KINDS:
            raise ValueError(f"{asked_by}={wanted}: use one of {', '.join(KINDS)}")
        return wanted, f"{asked_by}={wanted} asks for it"
    if gpus.system == "Darwin":
        return None, "macOS: PyPI's wheel is the one that runs on Apple's GPU (MPS)"
    if gpus.nvidia:
        cuda = f", driver up to CUDA {gpus.driver_cuda[0]}.{gpus.driver_cuda[1]}" if gpus.driver_cuda else ""
        return "cuda", f"an NVIDIA GPU is here ({gpus.nvidia}{cuda})"
    if gpus.amd == "/dev/kfd" and gpus.system == "Linux":
        return "rocm", "an AMD GPU is here (/dev/kfd, ROCm's compute interface)"
    seen = [s for s in (gpus.other, "an AMD display device without /dev/kfd (load the amdgpu driver)"
                        if gpus.amd == "sysfs" else None) if s]
    if seen:
        return "cpu", f"no GPU a build can use: {'; '.join(seen)}"
    return "cpu", "no GPU was found (no NVIDIA driver, no /dev/kfd)"


# ----------------------------------------------------------------------------------------------- the indexes


def _variant_version(variant: str) -> tuple[int, ...]:
    """cu128 -> (12, 8); cu130 -> (13, 0); rocm6.4 -> (6, 4); rocm6.2.4 -> (6, 2, 4)."""
    if variant.startswith("cu"):
        digits = variant[2:]
        return (int(digits[:-1]), int(digits[-1])) if digits.isdigit() and len(digits) >= 2 else (0,)
    if variant.startswith("rocm"):
        return tuple(int(p) for p in variant[4:].split(".") if p.isdigit())
    return (0,)


def kind_of_variant(variant: str | None) -> str | None:
    if variant is None:
        return None
    return "cuda" if variant.startswith("cu") else "rocm" if variant.startswith("rocm") else (
        "cpu" if variant.startswith("cpu") else None)


def platform_fits(wheel_platform: str, system: str, machine: str) -> bool:
    """Whether a wheel's platform tag runs on this system and machine."""
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine.lower())
    if system == "Linux":
        return "linux" in wheel_platform and wheel_platform.endswith(machine)
    if system == "Windows":
        return wheel_platform == ("win_amd64" if machine == "x86_64" else f"win_{machine}")
    return system == "Darwin" and wheel_platform.startswith("macosx")


def variants_in_listing(listing: str, version: str, python_tag: str, system: str, machine: str) -> set[str]:
    """The builds (local version labels) of torch `version` for this Python and platform in an index page of
    torch's wheels (PEP 503 HTML: one link per file)."""
    pattern = re.compile(rf"torch-{re.escape(version)}(?:\+|%2B)([A-Za-z0-9.]+)-{python_tag}-{python_tag}-"
                         r"([A-Za-z0-9_.]+?)\.whl")
    return {m.group(1) for m in pattern.finditer(listing) if platform_fits(m.group(2), system, machine)}


def pick_variant(kind: str, variants: set[str], driver_cuda: tuple[int, int] | None = None) -> str | None:
    """The index for `kind`: `cpu`; the newest ROCm; the newest CUDA the driver runs (the newest when the driver
    is not known). None: the index has no such build."""
    if kind == "cpu":
        return "cpu" if "cpu" in variants else None
    ofkind = [v for v in variants if kind_of_variant(v) == kind and len(_variant_version(v)) >= 2]
    if kind == "cuda" and driver_cuda is not None:
        ofkind = [v for v in ofkind if _variant_version(v)[:2] <= driver_cuda]
    return max(ofkind, key=_variant_version, default=None)


def index_url(variant: str, root: str = INDEX_ROOT) -> str:
    return f"{root.rstrip('/')}/{variant}"


# ----------------------------------------------------------------------------------------------- what is installed


def public_version(version: str) -> str:
    """2.13.0+cpu -> 2.13.0."""
    return version.split("+", 1)[0]


def local_label(version: str) -> str | None:
    """2.13.0+cpu -> cpu; 2.13.0 -> None (PyPI's)."""
    return version.split("+", 1)[1] if "+" in version else None


def torchvision_for(torch_version: str) -> str | None:
    """The torchvision release made with a torch release: 2.N.P -> 0.(N+15).P (2.13.0 -> 0.28.0, 2.14.1 ->
    0.29.1); None for a torch outside that rule."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", public_version(torch_version))
    if not found or found.group(1) != "2":
        return None
    return f"0.{int(found.group(2)) + 15}.{found.group(3) or 0}"


@dataclass(frozen=True)
class InstalledTorch:
    """An installed torch: its version and build (`cuda`, `hip`: torch.version's fields)."""

    version: str
    cuda: str | None = None
    hip: str | None = None

    @property
    def kind(self) -> str:
        return "rocm" if self.hip else "cuda" if self.cuda else "cpu"

    @property
    def variant(self) -> str | None:
        """The index it came from (None: PyPI's, which pairs with PyPI's torchvision)."""
        return local_label(self.version)

    def describe(self) -> str:
        """torch 2.13.0+cpu (the CPU build)."""
        return f"torch {self.version} (the {KIND_NAMES[self.kind]} build)"

    def pair(self, root: str = INDEX_ROOT) -> tuple[list[str], str | None]:
        """The requirements that pin this torch and its torchvision exactly, and the index holding them (None:
        PyPI)."""
        label = f"+{self.variant}" if self.variant else ""
        vision = torchvision_for(self.version)
        pins = [f"torch=={self.version}"] + ([f"torchvision=={vision}{label}"] if vision else ["torchvision"])
        return pins, index_url(self.variant, root) if self.variant else None


def installed_torch() -> InstalledTorch | None:
    """The torch this Python imports (None: none importable). Its version is the one pip sees (the package's):
    PyPI's CUDA wheel calls itself 2.14.1+cu130 at run time but is 2.14.1 to pip, and comes from PyPI."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        import torch
    except Exception:  # noqa: BLE001 - a broken install raises OSError too: there is no usable torch
        return None
    try:
        installed = version("torch")
    except PackageNotFoundError:  # a torch built from source, not installed as a package
        installed = torch.__version__
    return InstalledTorch(installed, torch.version.cuda, getattr(torch.version, "hip", None))


def pip_command(args: list[str]) -> str:
    """A `python -m pip install ...` line to print, each argument quoted where a shell needs it."""
    import shlex

    return " ".join(["python", "-m", "pip", "install", *(shlex.quote(a) for a in args)])


@functools.cache
def torchvision_mismatch() -> tuple[str, str] | None:
    """What is wrong with the installed torchvision beside this torch, and the fix (None: none installed, or it
    imports). transformers and diffusers import it whenever it is installed, so a mismatch breaks every model,
    not only the metrics."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        import torchvision  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - its compiled operators missing, a symbol of another torch, ...
        from importlib.metadata import PackageNotFoundError, version

        try:
            have = version("torchvision")
        except PackageNotFoundError:
            have = "?"
        torch = installed_torch()
        if torch is None:
            return None  # no torch at all: that is the problem to report, elsewhere
        pins, index = torch.pair()
        where = f" --index-url {index}" if index else ""
        cause = " ".join(str(exc).split())[:120]
        return (f"torchvision {have} does not fit {torch.describe()} ({type(exc).__name__}: {cause})",
                f"install the one made for it, {pip_command(pins[1:])}{where}, or remove it (python -m pip "
                "uninstall torchvision; only `ootd eval` needs it)")
    return None


def torchvision_problem() -> str | None:
    """`torchvision_mismatch` as one line (None: nothing wrong)."""
    mismatch = torchvision_mismatch()
    return None if mismatch is None else f"{mismatch[0]}: {mismatch[1]}"


def require_usable_torchvision() -> None:
    """An UnsupportedError naming the mismatch when torchvision is installed but does not fit torch."""
    problem = torchvision_problem()
    if problem is not None:
        from ootd.errors import UnsupportedError

        raise UnsupportedError(problem)
