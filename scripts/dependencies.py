"""The tested set of dependencies: constraints.txt pins every package that the core and every extra of
pyproject.toml install (the lock); the quickstart, the test scripts and CI install from it.

    python scripts/dependencies.py lock            # resolve the newest releases pyproject.toml allows (torch: the
                                                   # lock's, or --torch), write constraints.txt; rerun after any
                                                   # change to the dependencies, and to upgrade on purpose
    python scripts/dependencies.py check           # every declared dependency locked, and the lock resolves to
                                                   # itself (pip's resolver, asking PyPI; nothing installed)
    python scripts/dependencies.py install --extras '[dev,ray]'   # what scripts/setup_env.sh runs

`install`: torch first, the build for this machine (ootd/tools/torch_install.py), then ootd with the extras under
the lock, whose torch and torchvision lines are replaced by the pair installed (OOTD_TORCH_VERSION picks another
torch; its torchvision follows). OOTD_DEPS=newest installs the newest releases instead of the locked ones (torch
stays pinned), so that an upgrade is tried on purpose. What was installed is recorded in the environment
(ootd-install.json): an install with the same inputs again does nothing (OOTD_REINSTALL=1 forces it).

The lock is resolved for the Python that runs `lock` (CPython 3.11 on Linux x86_64 here): packages that only
another platform needs are not in it and install unpinned there. flash-attn is not locked: it is built from source
against the user's own torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"
LOCK = REPO / "constraints.txt"
PROJECT = "ootd"
UNLOCKED = {"flash-attn": "source-only on PyPI: built against the user's own torch and GPU stack"}
PAIR = ("torch", "torchvision")
# what a torch build brings with it (the CUDA libraries of PyPI's wheel, ROCm's Triton): the build decides them
BUILD_SPECIFIC = re.compile(r"^(nvidia-.*|cuda-.*|triton|pytorch-triton.*)$")
MARKER = "ootd-install.json"  # in the environment: what its last install was made from
DERIVED = "ootd-constraints.txt"  # in the environment: the lock with the torch pair installed there
DEPS_ENV, TORCH_ENV, REINSTALL_ENV = "OOTD_DEPS", "OOTD_TORCH_VERSION", "OOTD_REINSTALL"

Run = Callable[[list[str]], int]


def normalize(name: str) -> str:
    """PEP 503's name: lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalize(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def declared(pyproject: Path = PYPROJECT) -> dict[str | None, list[str]]:
    """The core's requirements (key None) and each extra's, as written."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return {None: list(project["dependencies"]), **project.get("optional-dependencies", {})}


def expand(extras: Iterable[str], pyproject: Path = PYPROJECT) -> list[str]:
    """The requirements of the core and `extras`, the project's own extras (`ootd[eval-math]`) expanded."""
    table = declared(pyproject)
    wanted, seen, out = [None, *extras], set(), []
    while wanted:
        extra = wanted.pop(0)
        if extra in seen:
            continue
        if extra not in table:
            known = ", ".join(sorted(k for k in table if k))
            raise SystemExit(f"error: pyproject.toml has no extra {extra!r} (it has {known})")
        seen.add(extra)
        for requirement in table[extra]:
            own = re.fullmatch(rf"\s*{PROJECT}\[([^\]]+)\]\s*", requirement)
            if own:
                wanted += [e.strip() for e in own.group(1).split(",")]
            elif requirement not in out:
                out.append(requirement)
    return out


def every_requirement(pyproject: Path = PYPROJECT) -> list[str]:
    """The core's and every extra's requirements, but those left unlocked (UNLOCKED)."""
    extras = [e for e in declared(pyproject) if e is not None]
    return [r for r in expand(extras, pyproject) if requirement_name(r) not in UNLOCKED]


def parse_extras(text: str) -> list[str]:
    """'[dev,ray]' (as scripts/test.sh writes it), 'dev,ray' or '' -> ['dev', 'ray']."""
    return [e.strip() for e in text.strip().strip("[]").split(",") if e.strip()]


def read_lock(path: Path = LOCK) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==", 1)
            pins[normalize(name)] = version.strip()
    return pins


def _torchvision_for(torch: str) -> str:
    sys.path.insert(0, str(REPO))
    from ootd.hardware.torch_builds import public_version, torchvision_for

    vision = torchvision_for(torch)
    if vision is None:
        raise SystemExit(f"error: no torchvision is known to pair with torch {torch}")
    return public_version(vision)


def torch_pins(torch: str) -> dict[str, str]:
    """torch and the torchvision made for it, without a build label (any build of that release matches)."""
    torch = torch.split("+", 1)[0]
    return {"torch": torch, "torchvision": _torchvision_for(torch)}


# ----------------------------------------------------------------------------------------------- lock, check


def resolve(requirements: list[str], constraints: Path | None = None) -> dict[str, str]:
    """What pip would install for `requirements` into an empty environment of this Python (nothing installed:
    pip's resolver, metadata only)."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                   "--report", str(report), *(["-c", str(constraints)] if constraints else []), *requirements]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"error: pip could not resolve the dependencies:\n{done.stderr.strip()[-3000:]}")
        installs = json.loads(report.read_text())["install"]
    return {normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def lock_text(resolved: dict[str, str]) -> str:
    pins = {name: version.split("+", 1)[0] if name in PAIR else version for name, version in resolved.items()
            if not BUILD_SPECIFIC.match(name) and name != PROJECT}
    head = [
        "# The tested set of dependencies of the core and every extra (pyproject.toml), for pip's -c. Generated by",
        "#   python scripts/dependencies.py lock",
        "# (the newest releases pyproject.toml allows; rerun it after changing the dependencies, and to upgrade).",
        f"# Resolved for {platform.python_implementation()} {platform.python_version_tuple()[0]}."
        f"{platform.python_version_tuple()[1]} on {platform.system()} {platform.machine()}. torch and torchvision "
        "are a pair: the setup installs them for the machine's GPU.",
        f"# Not locked: {', '.join(f'{k} ({v})' for k, v in UNLOCKED.items())}.",
    ]
    return "\n".join([*head, *(f"{name}=={pins[name]}" for name in sorted(pins))]) + "\n"


def make_lock(torch: str | None, lock: Path = LOCK, pyproject: Path = PYPROJECT) -> dict[str, str]:
    if torch is None:
        if not lock.exists():
            raise SystemExit("error: no constraints.txt yet: give --torch VERSION")
        torch = read_lock(lock)["torch"]
    pins = torch_pins(torch)
    resolved = resolve([*every_requirement(pyproject), *(f"{k}=={v}" for k, v in pins.items())])
    lock.write_text(lock_text(resolved))
    return read_lock(lock)


def unlocked_declarations(lock: dict[str, str], pyproject: Path = PYPROJECT) -> list[str]:
    """Every declared requirement the lock lacks, or pins at a version the requirement does not allow."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip carries its own copy
        from pip._vendor.packaging.requirements import Requirement

    problems = []
    for text in every_requirement(pyproject):
        requirement = Requirement(text)
        name = normalize(requirement.name)
        if name not in lock:
            problems.append(f"{text}: not in constraints.txt")
        elif not requirement.specifier.contains(lock[name], prereleases=True):
            problems.append(f"{text}: constraints.txt pins {name}=={lock[name]}")
    return problems


def check(lock_path: Path = LOCK, pyproject: Path = PYPROJECT) -> list[str]:
    lock = read_lock(lock_path)
    problems = unlocked_declarations(lock, pyproject)
    if "torch" in lock and lock.get("torchvision") != torch_pins(lock["torch"])["torchvision"]:
        problems.append(f"torch {lock['torch']} and torchvision {lock.get('torchvision')} are not a pair")
    if problems:
        return problems
    resolved = resolve([*every_requirement(pyproject), *(f"{k}=={lock[k]}" for k in PAIR)], lock_path)
    for name, version in sorted(resolved.items()):
        if BUILD_SPECIFIC.match(name) or name == PROJECT:
            continue
        if name not in lock:
            problems.append(f"{name} {version} is installed but not locked")
        elif version.split("+", 1)[0] != lock[name]:
            problems.append(f"{name} resolves to {version}, the lock says {lock[name]}")
    return problems


# ----------------------------------------------------------------------------------------------- install


def derived_constraints(lock: dict[str, str], torch: str, newest: bool) -> str:
    """The constraints an install uses: the lock (none of it in `newest` mode) with the torch pair of `torch`."""
    pins = {} if newest else {k: v for k, v in lock.items() if k not in PAIR}
    pins.update(torch_pins(torch))
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def install_inputs(extras: list[str], torch: str, newest: bool, environ: dict[str, str]) -> dict[str, str]:
    """What an install is made from: when all of it is unchanged, installing again changes nothing."""
    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    return {"pyproject": digest(PYPROJECT), "lock": digest(LOCK), "extras": ",".join(sorted(extras)),
            "deps": "newest" if newest else "locked", "torch": torch, "python": platform.python_version(),
            "build": environ.get("OOTD_TORCH", ""), "index": environ.get("OOTD_TORCH_INDEX_ROOT", "")}


def _run(command: list[str]) -> int:
    return subprocess.call(command, cwd=REPO)


def install(extras: list[str], prefix: Path, environ: dict[str, str], run: Run = _run) -> int:
    """Torch for the machine, then ootd with `extras` under the lock (scripts/setup_env.sh)."""
    mode = environ.get(DEPS_ENV, "locked") or "locked"
    if mode not in ("locked", "newest"):
        print(f"error: {DEPS_ENV}={mode}: use locked or newest", file=sys.stderr)
        return 2
    newest = mode == "newest"
    lock = read_lock()
    torch = environ.get(TORCH_ENV) or lock["torch"]
    inputs = install_inputs(extras, torch, newest, environ)
    marker = prefix / MARKER
    try:
        before = json.loads(marker.read_text()).get("inputs")
    except (OSError, ValueError):
        before = None
    if before == inputs and environ.get(REINSTALL_ENV) != "1":
        print(f"setup: {prefix} is up to date (pyproject.toml, constraints.txt, the extras and torch unchanged since "
              f"its last install): nothing to install ({REINSTALL_ENV}=1 installs again)")
        return 0
    marker.unlink(missing_ok=True)  # an install cut short leaves no record of being complete
    needs_vision = "torchvision" in {requirement_name(r) for r in expand(extras)}
    python = [sys.executable, "-m"]
    steps = [[*python, "pip", "install", "-q", "--upgrade", "pip"],
             [*python, "ootd.tools.torch_install", "--torch", torch, *(["--torchvision"] if needs_vision else [])]]
    constraints = prefix / DERIVED
    constraints.write_text(derived_constraints(lock, torch, newest))
    target = f".[{','.join(extras)}]" if extras else "."
    steps.append([*python, "pip", "install", "-q", "-c", str(constraints), "-e", target])
    print(f"setup: {'the newest releases' if newest else 'the locked set (constraints.txt)'} of ootd{target[1:]}")
    for step in steps:
        code = run(step)
        if code != 0:
            return code
    marker.write_text(json.dumps({"deps": inputs["deps"], "extras": inputs["extras"], "torch": torch,
                                  "lock_sha256": inputs["lock"], "inputs": inputs}, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/dependencies.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    lock = sub.add_parser("lock", help="resolve and write constraints.txt")
    lock.add_argument("--torch", metavar="VERSION", help="the torch to lock (default: the lock's)")
    sub.add_parser("check", help="is the lock complete, and does it resolve to itself")
    inst = sub.add_parser("install", help="torch for this machine, then ootd and the extras under the lock")
    inst.add_argument("--extras", default="", help="e.g. '[dev,ray]'")
    args = parser.parse_args(argv)
    if args.command == "lock":
        pins = make_lock(args.torch)
        print(f"wrote {LOCK.name}: {len(pins)} packages (torch {pins['torch']}, torchvision {pins['torchvision']})")
        return 0
    if args.command == "check":
        problems = check()
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        if not problems:
            print(f"{LOCK.name}: every declared dependency is locked and the lock resolves to itself")
        return 1 if problems else 0
    return install(parse_extras(args.extras), Path(sys.prefix), dict(os.environ))


if __name__ == "__main__":
    sys.exit(main())
