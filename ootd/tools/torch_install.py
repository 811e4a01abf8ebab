"""Install the PyTorch build for this machine: `python -m ootd.tools.torch_install --torch 2.13.0`.

One line says which build and why (the GPU found, or OOTD_TORCH=cpu|cuda|rocm); the wheel comes from PyTorch's
index for that build (the newest ROCm; the newest CUDA the NVIDIA driver runs), pinned with its label
(`torch==2.13.0+rocm6.4`) so that pip replaces a torch of another build. When the index cannot be reached, or
has no such build for this Python, a line says so and torch comes from PyPI instead (on Linux PyPI's wheel is
the CUDA build). With --torchvision the matching torchvision comes from the same place, and is checked to import.

Standard library only: scripts/setup_env.sh runs it before anything else is installed, and `ootd doctor` names
it as the fix for a torch that cannot use this machine's GPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ootd.hardware.torch_builds import (
    BUILD_ENV,
    INDEX_ROOT,
    INDEX_ROOT_ENV,
    KIND_NAMES,
    KINDS,
    choose_kind,
    detect_gpus,
    index_url,
    local_label,
    pick_variant,
    public_version,
    torchvision_for,
    variants_in_listing,
)

LISTING_TIMEOUT = 20  # seconds to reach the index
PREFIX = "torch:"


@dataclass(frozen=True)
class Plan:
    """What to install and from where (`index` None: PyPI), and the lines that say why."""

    requirements: list[str]
    index: str | None
    lines: list[str]

    def pip_args(self) -> list[str]:
        return [*self.requirements, *(["--index-url", self.index] if self.index else [])]


def read_listing(root: str, timeout: float = LISTING_TIMEOUT) -> str:
    """The index's page of torch wheels (a folder of a file:// mirror: its index.html)."""
    url = f"{root.rstrip('/')}/torch/"
    if url.startswith("file://"):
        path = Path(urllib.request.url2pathname(url[len("file://"):]))
        return (path / "index.html").read_text(encoding="utf-8")
    with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - the index's https address
        return answer.read().decode("utf-8", "replace")


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or exc
    return f"{type(exc).__name__}: {' '.join(str(reason).split())[:160]}"


def plan_install(version: str, torchvision: bool, kind: str | None, why: str, root: str,
                 listing: str | Exception, driver_cuda: tuple[int, int] | None = None,
                 python_tag: str | None = None, system: str | None = None, machine: str | None = None) -> Plan:
    """The requirements and index for torch `version` of build `kind` (None: PyPI's), given the index's
    listing (or why it could not be read)."""
    python_tag = python_tag or f"cp{sys.version_info[0]}{sys.version_info[1]}"
    system, machine = system or platform.system(), machine or platform.machine()
    vision = torchvision_for(version) if torchvision else None
    if torchvision and vision is None:
        raise ValueError(f"no torchvision is known to pair with torch {version}")
    pypi = [f"torch=={version}", *([f"torchvision=={vision}"] if vision else [])]
    if kind is None:
        return Plan(pypi, None, [f"{PREFIX} torch {version} from PyPI, because {why}"])
    name = KIND_NAMES[kind]
    if isinstance(listing, Exception):
        return Plan(pypi, None, [
            f"{PREFIX} the {name} build of torch {version}, because {why}",
            f"{PREFIX} {root} cannot be reached ({_reason(listing)}): installing torch=={version} from PyPI instead "
            f"(on Linux PyPI's wheel is the CUDA build, whatever the machine has); {INDEX_ROOT_ENV} names a mirror"])
    variant = pick_variant(kind, variants_in_listing(listing, version, python_tag, system, machine), driver_cuda)
    if variant is None:
        driver = f" that the NVIDIA driver runs (CUDA {driver_cuda[0]}.{driver_cuda[1]})" if (
            kind == "cuda" and driver_cuda) else ""
        return Plan(pypi, None, [
            f"{PREFIX} the {name} build of torch {version}, because {why}",
            f"{PREFIX} {root} has no {name} build of torch {version}{driver} for {python_tag} on {system} "
            f"{machine}: installing torch=={version} from PyPI instead"])
    pins = [f"torch=={version}+{variant}", *([f"torchvision=={vision}+{variant}"] if vision else [])]
    newest = {"rocm": " (the newest ROCm build)", "cuda": " (the newest CUDA build the driver runs)"
              if driver_cuda else " (the newest CUDA build)"}.get(kind, "")
    return Plan(pins, index_url(variant, root),
                [f"{PREFIX} the {name} build of torch {version}, {variant}{newest}, because {why}"])


def _installed(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _pip(args: list[str]) -> int:
    return subprocess.call([sys.executable, "-m", "pip", "install", "-q", *args])


def _check_torchvision() -> str | None:
    """Why torchvision does not import beside torch in this environment (None: it does)."""
    done = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True)
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit {done.returncode}"


def install(plan: Plan, dry_run: bool = False) -> int:
    """Run pip for `plan` (from PyPI when the index fails); print what is installed then. 0 on success."""
    wanted = dict(r.split("==", 1) for r in plan.requirements)
    if all(local_label(v) and _installed(n) == v for n, v in wanted.items()):  # an exact build, there already
        print(f"{PREFIX} {', '.join(f'{n} {v}' for n, v in wanted.items())} installed already: kept")
        return 0
    if dry_run:
        print(f"{PREFIX} would run: python -m pip install {' '.join(plan.pip_args())}")
        return 0
    code = _pip(plan.pip_args())
    if code != 0 and plan.index is not None:
        pypi = [f"{n}=={public_version(v)}" for n, v in wanted.items()]
        print(f"{PREFIX} pip could not install {' '.join(plan.requirements)} from {plan.index}: installing "
              f"{' '.join(pypi)} from PyPI instead")
        code = _pip(pypi)
    if code != 0:
        print(f"{PREFIX} error: pip could not install torch (exit {code})", file=sys.stderr)
        return code
    have = {name: _installed(name) for name in wanted}
    print(f"{PREFIX} installed {', '.join(f'{n} {v}' for n, v in have.items())}")
    if "torchvision" in wanted:
        problem = _check_torchvision()
        if problem is not None:
            print(f"{PREFIX} error: torchvision {have['torchvision']} does not import beside torch {have['torch']} "
                  f"({problem}): the two must come from one index (the torch build's)", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ootd.tools.torch_install", description=__doc__.split("\n\n")[0],
                                     epilog=f"{BUILD_ENV}=cpu|cuda|rocm chooses the build as --build does; "
                                            f"{INDEX_ROOT_ENV} names a mirror of {INDEX_ROOT}.")
    parser.add_argument("--torch", metavar="VERSION", help="the torch release (default: the installed one's)")
    parser.add_argument("--build", choices=("auto", *KINDS), default=None,
                        help=f"the build (default: ${BUILD_ENV}, else auto: the one for this machine's GPU)")
    parser.add_argument("--torchvision", action="store_true", help="also the torchvision made for that torch")
    parser.add_argument("--index-root", default=os.environ.get(INDEX_ROOT_ENV) or INDEX_ROOT, metavar="URL",
                        help="where the per-build indexes are (default: %(default)s)")
    parser.add_argument("--sysroot", type=Path, default=Path("/"), metavar="DIR",
                        help="look for GPUs in this root's dev, sys and proc (a container's view of a host)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be installed, install nothing")
    args = parser.parse_args(argv)
    version = args.torch or _installed("torch")
    if not version:
        parser.error("no torch is installed here: give --torch VERSION")
    version = public_version(version)
    gpus = detect_gpus(args.sysroot)
    try:
        wanted, asked_by = (args.build, "--build") if args.build else (os.environ.get(BUILD_ENV), BUILD_ENV)
        kind, why = choose_kind(gpus, None if wanted in (None, "", "auto") else wanted, asked_by)
        listing: str | Exception = ""
        if kind is not None:
            try:
                listing = read_listing(args.index_root)
            except (OSError, urllib.error.URLError, ValueError) as exc:
                listing = exc
        plan = plan_install(version, args.torchvision, kind, why, args.index_root, listing, gpus.driver_cuda)
    except ValueError as exc:
        parser.error(str(exc))
    for line in plan.lines:
        print(line)
    return install(plan, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
