"""Shared fixtures: one tiny random-weight checkpoints tree per test session, example inputs."""

from __future__ import annotations

import importlib.util
import os
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, REPO
from tests.helpers.fakes import ModelSeam

# The same numbers on every machine: precision auto picks bf16 on CPUs with bf16 matrix units, so the suite
# declares a CPU without them (this process and the CLI subprocesses it starts); tests of that choice set their own.
os.environ.setdefault("OOTD_CPU_BF16", "0")


def _load_script(name: str):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def make_tiny():  # noqa: ANN201
    """The generator function, for tests that need a tree of their own to damage."""
    return _load_script("make_tiny_checkpoints").make_tiny_checkpoints


@pytest.fixture(scope="session")
def tiny_tree(tmp_path_factory: pytest.TempPathFactory, make_tiny) -> Path:  # noqa: ANN001
    """A complete checkpoints tree in the released layout, tiny random weights. Do not modify it."""
    return make_tiny(tmp_path_factory.mktemp("checkpoints"), seed=0)


@pytest.fixture(scope="session")
def example_images() -> dict[str, Path]:
    return {
        "person": EXAMPLES / "person.png",
        "tshirt": EXAMPLES / "tshirt.png",
        "trousers": EXAMPLES / "trousers.png",
        "mask": EXAMPLES / "person_mask_upper.png",
        "mask_lower": EXAMPLES / "person_mask_lower.png",
    }


@pytest.fixture(scope="session")
def pipe_hd(tiny_tree: Path):  # noqa: ANN201
    from ootd.models import Models

    return Models.from_pretrained(tiny_tree, device="cpu").pipeline("hd")


@pytest.fixture(scope="session")
def pipe_dc(tiny_tree: Path):  # noqa: ANN201
    from ootd.models import Models

    return Models.from_pretrained(tiny_tree, device="cpu").pipeline("dc")


@pytest.fixture
def models():  # noqa: ANN201
    """The one seam for models in tests: `models.fake()`, `models.use(pipes)`, `models.forbid()` (tests/helpers/
    fakes.py); whatever is installed applies to every loader the test makes and is undone afterwards."""
    with ExitStack() as stack:
        yield ModelSeam(stack)
