"""One of each concept, read from the source: the progress callback's type, SSIM, the byte-size formatter and the
VAE encode are each written once, and everything else uses that one (a second copy is what drifts apart)."""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable

from tests.helpers import REPO


@functools.cache
def _sources() -> dict[str, ast.Module]:
    files = [*REPO.glob("ootd/**/*.py"), *REPO.glob("preprocess/**/*.py"), REPO / "run" / "run_ootd.py"]
    return {path.relative_to(REPO).as_posix(): ast.parse(path.read_text(encoding="utf-8")) for path in files}


Match = Callable[[ast.AST], bool]


def _where(found: dict[str, ast.Module], match: Match) -> list[str]:
    return sorted(path for path, tree in found.items() if any(match(node) for node in ast.walk(tree)))


def _assigns(name: str) -> Match:
    def match(node: ast.AST) -> bool:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        return any(isinstance(t, ast.Name) and t.id == name for t in targets)

    return match


def _defines(name: str) -> Match:
    return lambda node: isinstance(node, ast.FunctionDef) and node.name == name


def test_each_concept_is_written_once() -> None:
    found = _sources()
    assert _where(found, _assigns("Progress")) == ["ootd/pipeline_types.py"]
    assert _where(found, _defines("ssim")) == ["ootd/imaging/similarity.py"]
    assert _where(found, _defines("size_text")) == ["ootd/hardware/units.py"]


def test_the_vae_encode_is_the_pipelines() -> None:
    """`latent_dist` (a VAE encode's output) is read by the pipeline's encode alone, apart from the measurements
    of memory and speed (the memory trace; the benchmark's reference pipeline and profiles)."""
    def reads_latents(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "latent_dist"

    measuring = ("ootd/memory/trace.py", "ootd/tools/bench/")
    users = [p for p in _where(_sources(), reads_latents) if not p.startswith(measuring)]
    assert users == ["ootd/pipeline.py"]


def test_the_scan_sees_a_second_copy() -> None:
    """A control: the matchers find what they look for."""
    tree = ast.parse("Progress = Callable[[str, int, int], None]\ndef ssim(a, b): ...\nx = vae.encode(p).latent_dist")
    copy = {"elsewhere.py": tree}
    assert _where(copy, _assigns("Progress")) == _where(copy, _defines("ssim")) == ["elsewhere.py"]
