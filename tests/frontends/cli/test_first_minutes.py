"""A new user's first minutes: the quickstart ends with the next commands that work (and the README's next command
is theirs) and says what needs the released weights, as the README does (its examples working as written), the
scripts find this checkout's environment and never fall back to a Python without ootd, every
script's help exits 0, installs print no setuptools warnings, and torchao's import-time chatter stays silent
unless --debug, in the CLI and in library use.

The scripts and installs run in subprocesses; the quickstart in a copy of the repository, with the environment
these tests run in (OOTD_VENV, OOTD_NO_INSTALL=1: no pip, nothing downloaded).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ootd import IMPORT_NOISE
from ootd.app.console import console_logging
from tests.helpers import REPO
from tests.helpers.fakes import images_tree

VENV = Path(sys.prefix)  # the environment these tests run in: it has ootd and its `ootd` command
SCRIPTS = sorted((REPO / "scripts").glob("*.sh"))
PY_SCRIPTS = sorted((REPO / "scripts").glob("*.py"))
BARE_PATH = "/usr/bin:/bin"  # a shell with no environment activated


def copy_of_repo(dest: Path) -> Path:
    return Path(shutil.copytree(REPO, dest, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".tiny-checkpoints",
        "outputs", "images_output")))


def bare_env(**extra: str) -> dict[str, str]:
    """The environment of a fresh terminal: no virtual environment active, nothing of ours on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "OOTD", "PYTHONPATH", "OOTD_VENV")}
    return {**env, "PATH": BARE_PATH, **extra}


# ---------------------------------------------------------------------------------------------- quickstart


@pytest.mark.slow
def test_quickstart_ends_with_next_commands_that_work_and_the_readme_has_them(tmp_path: Path) -> None:
    repo = copy_of_repo(tmp_path / "clone")
    env = bare_env(OOTD_VENV=str(VENV), OOTD_NO_INSTALL="1", OOTD_CHECKPOINTS=str(tmp_path / "none"))
    done = subprocess.run(["bash", "scripts/quickstart.sh"], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    told = done.stdout.split("What needs the released weights", 1)[1].split("\nNext, in this folder", 1)[0]
    for words in ("no person detected", "examples/person_mask_upper.png", "examples/person_mask_lower.png",
                  "--category auto", "ootd mask"):
        assert words in told, words
    tail = done.stdout.split("\nNext, in this folder", 1)[1].splitlines()[1:4]
    activate, run, outfit = (line.strip() for line in tail)
    assert activate == f". {VENV}/bin/activate"
    assert run.startswith("ootd run --model examples/person.png") and "--checkpoints .tiny-checkpoints" in run
    assert outfit.count("--cloth") == 2 and outfit.count("--mask") == 2
    # the exact lines, in a fresh shell in that folder: they work as printed
    after = subprocess.run(["bash", "-c", f"set -e; {activate}; {run}; {outfit}"], cwd=repo, env=bare_env(),
                           capture_output=True, text=True, timeout=900)
    assert after.returncode == 0, after.stdout[-2000:] + after.stderr[-2000:]
    assert (repo / "outputs" / "mine" / "person__tshirt__0.png").is_file()
    assert (repo / "outputs" / "outfit" / "person__tshirt-with-trousers__0.png").is_file()
    # and the README's next command after the quickstart is that one
    readme = (REPO / "README.md").read_text()
    first_section = readme.split("\n## ", 1)[0]
    assert ". .venv/bin/activate" in first_section
    assert " ".join(run.split()) in " ".join(first_section.replace("\\\n", " ").split())
    # a second quickstart reuses the tiny checkpoints and says so, instead of saying it generates them
    again = subprocess.run(["bash", "scripts/quickstart.sh"], cwd=repo, env=env, capture_output=True, text=True,
                           timeout=900)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "Using the tiny RANDOM-WEIGHT checkpoints in .tiny-checkpoints (made by an earlier run)" in again.stdout
    assert "Generating" not in again.stdout and "Generating tiny" in done.stdout


def readme_section(title: str) -> str:
    return (REPO / "README.md").read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def shell_commands(text: str) -> list[list[str]]:
    """The `ootd ...` commands of a text's ```bash blocks, continuation lines joined, comments dropped."""
    import shlex

    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    joined = "\n".join(blocks).replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.startswith("ootd ")]


def test_the_readme_says_what_needs_the_released_weights_and_its_example_commands_work(
        models, tiny_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the README says fails on the tiny checkpoints fails so, with the words it quotes; the examples' masks
    it names are there, and its commands for the tiny checkpoints work as written (on an instant stand-in model;
    pose, parsing and CLIP are the tiny tree's own)."""
    from tests.helpers.cli import assert_one_line_error, invoke

    section = readme_section("What needs the released weights")
    for mask in re.findall(r"examples/[\w.]*mask[\w.]*\.png", section):
        assert (REPO / mask).is_file(), mask
    monkeypatch.chdir(REPO)  # the commands name examples/ from the checkout's root
    models.fake()
    out = tmp_path / "out"
    nobody = invoke("mask", "--model", "examples/person.png", "--category", "upper", "--checkpoints", tiny_tree,
                    "-o", out / "masks")
    assert "`no person detected`" in section and assert_one_line_error(nobody, 1, "no person detected")
    refused = invoke("run", "--model", "examples/person.png", "--cloth", "examples/tshirt.png", "--category", "auto",
                     "--mask", "examples/person_mask_upper.png", "--checkpoints", tiny_tree, "-o", out / "auto")
    said = "give it with --category upper, lower or dress"
    assert f"`{said}`" in section and assert_one_line_error(refused, 2, "cannot tell the category", said)
    tiny = [c for c in shell_commands(section) if ".tiny-checkpoints" in c]
    assert len(tiny) == 2 and any(c.count("--cloth") == 2 for c in tiny)  # a try-on and an outfit
    for command in tiny:
        args = [str(tiny_tree) if a == ".tiny-checkpoints" else a for a in command[1:]]
        args[args.index("-o") + 1] = str(out / args[args.index("-o") + 1])
        done = invoke(*args)
        assert done.exit_code == 0, done.output
        assert len(list(Path(args[args.index("-o") + 1]).glob("*__0.png"))) == 1, done.output


# ---------------------------------------------------------------------------------------------- the scripts


def test_batch_script_finds_the_checkouts_environment_from_a_bare_shell(tmp_path: Path) -> None:
    shown = subprocess.run(["bash", str(REPO / "scripts" / "batch_tryon.sh"), "people", "garments"], cwd=tmp_path,
                           env=bare_env(DRY_RUN="1", OOTD_VENV=str(VENV)), capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split()[:2] == [str(VENV / "bin" / "ootd"), "batch"]
    if (REPO / ".venv" / "bin" / "ootd").exists():  # the default: this checkout's .venv
        default = subprocess.run(["bash", str(REPO / "scripts" / "batch_tryon.sh"), "p", "g"], cwd=tmp_path,
                                 env=bare_env(DRY_RUN="1"), capture_output=True, text=True)
        assert default.stdout.split()[0] == str(REPO / ".venv" / "bin" / "ootd"), default.stderr


@pytest.mark.slow
def test_batch_script_runs_a_batch_from_a_bare_shell(tmp_path: Path, tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    people, garments = images_tree(tmp_path, example_images, 1, 1)
    masks = tmp_path / "masks"
    masks.mkdir()
    shutil.copy(example_images["mask"], masks / "p0.png")
    env = bare_env(OOTD_VENV=str(VENV), OOTD_CHECKPOINTS=str(tiny_tree), OUT=str(tmp_path / "out"), STEPS="1",
                   RESOLUTION="384x512", SEED="1", MASKS=str(masks), OOTD_DEVICE="cpu")
    done = subprocess.run(["bash", str(REPO / "scripts" / "batch_tryon.sh"), str(people), str(garments), "-q"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "out" / "p0__g0__0.png").is_file()


@pytest.mark.parametrize("script", ["batch_tryon.sh", "multi_gpu.sh"])
def test_without_ootd_the_scripts_say_how_to_install_in_one_line(script: str, tmp_path: Path) -> None:
    """No environment, no `ootd` on PATH, a system Python without ootd: one line, exit 1, no traceback (it used
    to fall back to that Python and end in `No module named 'typer'`)."""
    env = bare_env(OOTD_VENV=str(tmp_path / "no-venv"), PYTHON="/usr/bin/python3", GPUS="0")
    (tmp_path / "p").mkdir()
    (tmp_path / "g").mkdir()
    done = subprocess.run(["bash", str(REPO / "scripts" / script), "p", "g"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ootd is not installed: run `bash ")
    assert "quickstart.sh" in lines[0] and "Traceback" not in done.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_shell_script_has_help_that_exits_0_and_does_nothing(script: Path, tmp_path: Path) -> None:
    for flag in ("--help", "-h"):
        shown = subprocess.run(["bash", str(script), flag], cwd=tmp_path, env=bare_env(), capture_output=True,
                               text=True, timeout=60)
        assert shown.returncode == 0, (flag, shown.stderr)
        assert len(shown.stdout.strip().splitlines()) >= 2, shown.stdout
    assert list(tmp_path.iterdir()) == []  # no install, no output folder, nothing made


@pytest.mark.slow
@pytest.mark.parametrize("script", PY_SCRIPTS, ids=lambda p: p.name)
def test_every_python_script_has_help_that_exits_0_and_does_nothing(script: Path, tmp_path: Path) -> None:
    shown = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.startswith("usage: ")
    assert list(tmp_path.iterdir()) == []


def test_missing_arguments_are_usage_errors_not_help(tmp_path: Path) -> None:
    for script in ("batch_tryon.sh", "multi_gpu.sh"):
        done = subprocess.run(["bash", str(REPO / "scripts" / script)], cwd=tmp_path, env=bare_env(),
                              capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("error: give ")


# ---------------------------------------------------------------------------------------------- installs


BUILD = """
import sys, warnings
import setuptools.build_meta as backend
dist, report = sys.argv[1:3]  # the backend rewrites sys.argv
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    backend.build_editable(dist)
    backend.build_wheel(dist)
with open(report, "w") as out:
    for w in caught:
        out.write(f"{w.category.__name__}: {str(w.message).strip().splitlines()[0]}\\n")
"""


@pytest.mark.slow
def test_installs_raise_no_setuptools_warning(tmp_path: Path) -> None:
    """What `pip install -e .` and `pip install .` build, built by the same backend hooks pip calls (pip shows
    every warning they raise as a BuildBackendWarning); nothing is installed anywhere."""
    pytest.importorskip("setuptools")
    repo = copy_of_repo(tmp_path / "src")
    report = tmp_path / "warnings.txt"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    built = subprocess.run([sys.executable, "-c", BUILD, str(tmp_path / "dist"), str(report)], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    assert report.read_text() == ""
    assert sorted(p.suffix for p in (tmp_path / "dist").iterdir() if p.suffix == ".whl") == [".whl", ".whl"]


# ---------------------------------------------------------------------------------------------- library noise


def test_the_import_noise_filter_drops_exactly_those_messages() -> None:
    records = [("torchao", "Failed to load /x/_C_mxfp8.so: Could not load this library", False),
               ("torchao", "something else torchao says", True),
               ("torch.utils._pytree", "<enum 'KernelPreference'> is an Enum subclass and is now natively supported "
                "by torch.compile", False),
               ("diffusers.quantizers.torchao.torchao_quantizer", "Unable to import `torchao` Tensor objects. This "
                "may affect loading checkpoints serialized with `torchao`", False),
               ("ootd.pipeline", "Unable to import `torchao` Tensor objects", True)]
    for name, message, kept in records:
        record = logging.LogRecord(name, logging.WARNING, __file__, 1, message, None, None)
        assert IMPORT_NOISE.filter(record) is kept, (name, message)
    with console_logging(False, False, debug=True):
        assert IMPORT_NOISE.filter(logging.LogRecord("torchao", logging.WARNING, __file__, 1,
                                                     "Failed to load x.so", None, None))
    assert IMPORT_NOISE.show is False


needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="the noise comes from torchao (the quant extra), which is not installed")

SNIPPET = """
from ootd import Models

models = Models.from_pretrained({tree!r})
pipe = models.pipeline("hd")
result = pipe({person!r}, {garment!r}, "upper", num_samples=1, seed=1, mask={mask!r}, steps=1, resolution="384x512")
print(result.seed)
"""


@needs_torchao
@pytest.mark.slow
def test_the_readme_python_snippet_prints_nothing_on_stderr(tiny_tree: Path, example_images, tmp_path: Path) -> None:  # noqa: ANN001
    code = SNIPPET.format(tree=str(tiny_tree), person=str(example_images["person"]),
                          garment=str(example_images["tshirt"]), mask=str(example_images["mask"]))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1" and done.stderr == ""


@needs_torchao
@pytest.mark.slow
def test_cli_runs_say_only_their_own_lines(tiny_tree: Path, example_images, tmp_path: Path) -> None:  # noqa: ANN001
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    budget = subprocess.run(
        [sys.executable, "-m", "ootd", "run", "-m", str(example_images["person"]), "-c", str(example_images["tshirt"]),
         "-k", "upper", "--mask", str(example_images["mask"]), "--checkpoints", str(tiny_tree), "-o",
         str(tmp_path / "o"), "--steps", "1", "--resolution", "384x512", "--device", "cpu", "--max-memory", "10MiB"],
        capture_output=True, text=True, timeout=900, env=env)
    assert budget.returncode == 2
    assert re.fullmatch(r"error: [^\n]*\n", budget.stderr), budget.stderr
    bench = subprocess.run([sys.executable, "-m", "ootd", "bench", "--random-weights", "tiny", "--resolution",
                            "384x512", "-n", "1", "--steps", "1", "-q"], capture_output=True, text=True,
                           timeout=900, env=env, cwd=tmp_path)
    assert bench.returncode == 0, bench.stderr[-2000:]
    assert bench.stderr == ""
