"""The layers and their rules, checked on the source: the library's packages each import only the ones below
them, the application layer never imports a tool or a front end (and the single try-on never the batches), front
ends never import each other, `preprocess/` imports nothing of ootd, and no two files import each other in a
circle, function-local and type-checking imports included."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

# The library, lowest first: each may import itself and what comes before it (plus `preprocess`), nothing after.
LIBRARY = ("ootd.errors", "ootd.settings", "ootd.hardware", "ootd.imaging", "ootd.weights", "ootd.evaluation",
           "ootd.attention", "ootd.method", "ootd.speedups", "ootd.memory", "ootd.runtime", "ootd.preprocessing",
           "ootd.pipeline_types", "ootd.pipeline", "ootd.training", "ootd.models")
APP, TRYON, BATCH = "ootd.app", "ootd.app.tryon", "ootd.app.batch"
EVALUATE, TRAIN = "ootd.app.evaluate", "ootd.app.train"
TOOLS = "ootd.tools"
FRONT_ENDS = ("ootd.cli", "ootd.serve", "ootd.comfyui", "run")
# what the `ootd` command may import of another front end: the server it starts (`ootd serve`) and the node pack's
# installer (`ootd comfyui install`), never the nodes themselves
CLI_STARTS = ("ootd.serve", "ootd.comfyui.install")
MAX_TOP_MODULES = 8  # modules directly in ootd/ besides __init__ and __main__
MAX_LINES = 450


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    files = [*REPO.glob("ootd/**/*.py"), *REPO.glob("preprocess/**/*.py"), REPO / "run" / "run_ootd.py"]
    return {_module_name(p): p for p in files}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that a file imports anywhere in it (a name imported from a package that is a module
    of its own counts as that module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                     for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


MODULES = _sources()
GRAPH = {name: _imports(path, MODULES) - {name} for name, path in MODULES.items()}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _layer(module: str) -> int | None:
    return next((i for i, package in enumerate(LIBRARY) if _within(module, package)), None)


def test_library_packages_import_only_the_ones_below() -> None:
    assert len(MODULES) > 100
    for module, imported in GRAPH.items():
        layer = _layer(module)
        if layer is None:
            continue
        for other in imported:
            if _within(other, "preprocess"):
                continue
            assert _layer(other) is not None and _layer(other) <= layer, f"{module} imports {other}"


def test_preprocess_imports_nothing_of_ootd() -> None:
    for module, imported in GRAPH.items():
        if _within(module, "preprocess"):
            assert not [m for m in imported if _within(m, "ootd")], module


def test_the_application_layer_imports_no_tool_and_no_front_end() -> None:
    for module, imported in GRAPH.items():
        if not _within(module, APP):
            continue
        for other in imported:
            assert not _within(other, TOOLS) and not any(_within(other, f) for f in FRONT_ENDS), (module, other)
            if _within(module, TRYON):
                assert not _within(other, BATCH), f"the single try-on {module} imports the batch module {other}"
                assert not _within(other, EVALUATE), f"the single try-on {module} imports {other}"
                assert not _within(other, TRAIN), f"the single try-on {module} imports the training module {other}"
            if _within(module, BATCH):  # an evaluation reads a batch's files, never the other way round
                assert not _within(other, EVALUATE), f"the batch module {module} imports {other}"


def test_tools_are_not_imported_by_the_library_or_the_application_layer() -> None:
    for module, imported in GRAPH.items():
        if _layer(module) is not None or _within(module, APP):
            assert not [m for m in imported if _within(m, TOOLS)], module


def test_front_ends_never_import_each_other() -> None:
    """Only the `ootd` command imports another front end: `ootd serve` starts the web server, `ootd comfyui
    install` writes the node pack (its installer only)."""
    for module, imported in GRAPH.items():
        own = next((f for f in FRONT_ENDS if _within(module, f)), None)
        for other in imported:
            theirs = next((f for f in FRONT_ENDS if _within(other, f)), None)
            if theirs is None or theirs == own or (own == "ootd.cli" and any(_within(other, s) for s in CLI_STARTS)):
                continue
            assert module == "ootd.__main__" and theirs == "ootd.cli", f"{module} imports the front end {other}"


def test_the_comfyui_front_end_is_a_front_end() -> None:
    """The node pack imports the application layer and the library, no other front end, and nothing imports it
    but the `ootd comfyui` command (its installer); its installer imports no node (nor ComfyUI)."""
    pack = [m for m in GRAPH if _within(m, "ootd.comfyui")]
    assert {"ootd.comfyui.nodes", "ootd.comfyui.backend", "ootd.comfyui.install"} <= set(pack)
    assert any(_within(other, APP) for m in pack for other in GRAPH[m])  # it stands on the application layer
    users = {m for m, imported in GRAPH.items() if any(_within(o, "ootd.comfyui") for o in imported)} - set(pack)
    assert users == {"ootd.cli.comfyui"}, users
    assert GRAPH["ootd.cli.comfyui"] & set(pack) == {"ootd.comfyui.install"}
    assert not [m for m in GRAPH["ootd.comfyui.install"] if _within(m, "ootd.comfyui")]


def test_no_import_circles_between_files() -> None:
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in GRAPH.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in GRAPH:
        if node not in index:
            visit(node)
    assert circles == []


def test_the_circle_check_finds_a_circle() -> None:
    """A control: two modules importing each other (inside functions) are reported."""
    global GRAPH
    saved = GRAPH
    GRAPH = {**saved, "ootd.settings": saved["ootd.settings"] | {"ootd.pipeline"}}
    try:
        test_no_import_circles_between_files()
    except AssertionError:
        pass
    else:
        raise AssertionError("a circle went unnoticed")
    finally:
        GRAPH = saved


def test_few_top_level_modules_and_none_too_long() -> None:
    top = [p.name for p in (REPO / "ootd").glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert len(top) <= MAX_TOP_MODULES, top
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_help_does_not_import_torch() -> None:
    code = ("import sys\nfrom ootd.cli import main\n"
            "try:\n    main(['run', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, 'diffusers' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "COLUMNS": "100"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False False"
