"""The tested set of dependencies (constraints.txt, made by `python scripts/dependencies.py lock`): every
dependency pyproject.toml declares is locked at a version it allows, torch and torchvision as a pair; an environment
installed from the lock holds what it names; an install only swaps the torch pair, or takes the newest releases
when asked; a second install with nothing changed does nothing; and (slow, asking PyPI) the lock resolves to
itself."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ootd.hardware.torch_builds import torchvision_for
from tests.conftest import _load_script
from tests.helpers import REPO

deps = _load_script("dependencies")


def test_every_declared_dependency_is_locked_at_a_version_it_allows() -> None:
    lock = deps.read_lock()
    assert deps.unlocked_declarations(lock) == []
    declared = {deps.requirement_name(r) for reqs in deps.declared().values() for r in reqs} - {"ootd"}
    assert declared - set(lock) == set(deps.UNLOCKED), "declared but neither locked nor said why not"
    assert lock["torchvision"] == torchvision_for(lock["torch"])  # the pair


def test_the_lock_is_checked_against_what_pyproject_declares(tmp_path: Path) -> None:
    """The check that fails once a dependency is added without rerunning `lock` (or one's bound moves past it)."""
    pyproject = tmp_path / "pyproject.toml"
    text = (REPO / "pyproject.toml").read_text()
    pyproject.write_text(text.replace('dev = ["pytest>=8",', 'dev = ["pytest-timeout>=2", "pytest>=8",')
                         .replace('"numpy>=1.26"', '"numpy>=99"'))
    problems = deps.unlocked_declarations(deps.read_lock(), pyproject)
    assert sorted(problems) == [f"numpy>=99: constraints.txt pins numpy=={deps.read_lock()['numpy']}",
                                "pytest-timeout>=2: not in constraints.txt"]


def test_this_environment_holds_what_the_lock_names() -> None:
    """In an environment that scripts/setup_env.sh installed from this lock (scripts/test.sh, CI), every locked
    package that is installed is at the locked version."""
    marker = Path(sys.prefix) / deps.MARKER
    if not marker.is_file():
        pytest.skip(f"{sys.prefix} was not installed by scripts/setup_env.sh (no {deps.MARKER})")
    record = json.loads(marker.read_text())
    if record["deps"] != "locked":
        pytest.skip("installed with OOTD_DEPS=newest: the newest releases, not the lock")
    lock = deps.read_lock()
    if record["lock_sha256"] != deps.install_inputs([], "", False, {})["lock"]:
        pytest.skip("constraints.txt changed since this environment was installed: rerun scripts/test.sh")
    pair = deps.torch_pins(record["torch"])
    wrong = {}
    for dist in importlib.metadata.distributions():
        name = deps.normalize(dist.metadata["Name"])
        want = pair.get(name, lock.get(name))
        if want is not None and dist.version.split("+", 1)[0] != want:
            wrong[name] = (dist.version, want)
    assert wrong == {}, f"installed, locked: {wrong}"


def test_an_install_swaps_only_the_torch_pair_or_takes_the_newest_when_asked() -> None:
    lock = deps.read_lock()
    locked = dict(line.split("==") for line in deps.derived_constraints(lock, "2.14.1", False).splitlines())
    assert locked["torch"] == "2.14.1" and locked["torchvision"] == "0.29.1"
    assert {k: v for k, v in locked.items() if k not in deps.PAIR} == {k: v for k, v in lock.items()
                                                                       if k not in deps.PAIR}
    assert deps.derived_constraints(lock, "2.13.0+cpu", True) == "torch==2.13.0\ntorchvision==0.28.0\n"


def test_a_second_install_with_nothing_changed_does_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ran: list[list[str]] = []

    def run(command: list[str]) -> int:
        ran.append(command)
        return 0

    env = {"OOTD_TORCH_VERSION": "2.13.0"}
    assert deps.install(["dev", "eval"], tmp_path, env, run) == 0
    torch_step = next(c for c in ran if "ootd.tools.torch_install" in c)
    assert torch_step[-3:] == ["--torch", "2.13.0", "--torchvision"]  # eval needs torchvision: the pair
    pip_step = ran[-1]
    assert pip_step[-2:] == ["-e", ".[dev,eval]"] and pip_step[pip_step.index("-c") + 1] == str(tmp_path /
                                                                                               deps.DERIVED)
    first = capsys.readouterr().out
    ran.clear()
    assert deps.install(["eval", "dev"], tmp_path, env, run) == 0
    assert ran == [] and "is up to date" in capsys.readouterr().out
    assert deps.install(["dev"], tmp_path, env, run) == 0  # other extras: installed again, without torchvision
    assert "--torchvision" not in next(c for c in ran if "ootd.tools.torch_install" in c)
    assert deps.install(["dev"], tmp_path, {**env, "OOTD_DEPS": "newest"}, run) == 0
    assert "the newest releases" in capsys.readouterr().out and "locked set" in first
    assert deps.install(["dev"], tmp_path, {**env, "OOTD_DEPS": "latest"}, run) == 2


def test_a_failed_step_leaves_no_record_of_a_complete_install(tmp_path: Path) -> None:
    assert deps.install(["dev"], tmp_path, {}, lambda command: 0) == 0
    assert deps.install(["dev"], tmp_path, {"OOTD_REINSTALL": "1"}, lambda command: 1) == 1
    assert not (tmp_path / deps.MARKER).exists()


@pytest.mark.slow  # pip's resolver over the whole lock, asking PyPI for metadata (about 20 s)
def test_the_lock_resolves_to_itself() -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "dependencies.py"), "check"], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
