"""The measurement scripts whose figures docs/benchmarks.md quotes, run whole on their smallest settings:
scripts/measure_preservation.py (two and four results at 384x512), measure_run_parsing.py and
measure_serve_preservation.py (one run of each case), measure_sweep.py (folders of 20 and 200 results) and
scripts/measure_eval.py (two and four pairs
at 96x128; it needs the eval extra's networks: without them it says so in one line, and its run is skipped here, as
scripts/test_eval_stack.sh runs it); their rows, table and growth line, and bad settings refused in one line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.helpers.evaluation import require_eval_stack

SCRIPTS = REPO / "scripts"


def run_script(name: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def rows_of(stdout: str) -> list[dict]:
    """The JSON row each measured run prints."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def check_rates(row: dict, per: str) -> None:
    """Every time and memory figure of one run is there and positive."""
    for key in (f"{per}_s", f"{per}_cpu_s", "first_tenth_cpu_s", "last_tenth_cpu_s", "total_s", "peak_rss_mib"):
        assert row[key] > 0, (key, row)


@pytest.mark.slow
def test_preservation_script_on_two_and_four_results() -> None:
    proc = run_script("measure_preservation.py", "--sizes", "384x512", "--counts", "2,4", "--people", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = rows_of(proc.stdout)
    assert [(r["size"], r["count"], r["results"], r["skipped"]) for r in rows] == [("384x512", 2, 2, 0),
                                                                                 ("384x512", 4, 4, 0)]
    assert [r["parses"] for r in rows] == [2, 2]  # each person parsed once, whatever the number of results
    for row in rows:
        check_rates(row, "per_result")
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("| 384x512 |") for line in lines) == 2
    assert any(line.startswith("384x512: per result at 4 / at 2: CPU ") for line in lines)
    assert lines[-1].startswith("STAND-IN: pose and parsing are fixed maps")


@pytest.mark.slow
def test_run_parsing_script_counts_one_parse_and_says_what_stands_in() -> None:
    proc = run_script("measure_run_parsing.py", "--repeats", "1", "--threads", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [line for line in proc.stdout.splitlines() if " #1: wall " in line]
    assert len(runs) == 1 and "pose runs 1, parsing runs 1" in runs[0] and "preservation " in runs[0], proc.stdout
    assert "# preservation figures identical across every run and checkout: True" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("STAND-IN: ")


@pytest.mark.slow
def test_serve_preservation_script_measures_each_case_and_says_what_stands_in() -> None:
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
    pytest.importorskip("httpx", reason="the serve-test extra is not installed (pip install -e .[serve-test])")
    proc = run_script("measure_serve_preservation.py", "--repeats", "1", "--threads", "1", "--steps", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert {"automatic mask", "uploaded mask", "automatic mask, off", "uploaded mask, off"} <= set(table)
    assert "| 0.000 s |" in table["uploaded mask, off"] and "| 0.000 s |" not in table["automatic mask"]
    assert proc.stdout.splitlines()[-1].startswith("STAND-IN: ")


@pytest.mark.parametrize(("args", "says"), [(("--sizes", "96x128"), "unsupported resolution 96x128"),
                                           (("--counts", "1,4"), "--counts: '1,4' is not whole numbers"),
                                           (("--sizes", "384by512"), "--sizes: '384by512' is not WIDTHxHEIGHT")])
def test_preservation_script_refuses_bad_settings_in_one_line(args: tuple[str, ...], says: str) -> None:
    proc = run_script("measure_preservation.py", *args, timeout=60)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.slow
def test_sweep_script_on_two_folder_sizes_removes_its_folder() -> None:
    proc = run_script("measure_sweep.py", "--counts", "20,200", "--stale", "3", "--repeats", "2", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = rows_of(proc.stdout)
    assert [(r["count"], r["files"], r["stale"]) for r in rows] == [(20, 23, 3), (200, 203, 3)]
    for row in rows:
        for case in ("sweep", "settled", "settled_every_0"):
            assert row[f"{case}_cpu_s"] >= 0 and row[f"{case}_total_s"] > 0, (case, row)
    lines = proc.stdout.splitlines()
    assert sum(line.startswith(("| 20 |", "| 200 |")) for line in lines) == 2
    assert lines[-1].startswith("per file or pair at 200 / at 20: CPU sweep ") and "settled_every_0 " in lines[-1]
    folder = Path(next(line for line in lines if line.startswith("# folder ")).split(" ", 2)[2])
    assert folder.name.startswith("ootd-sweep-") and not folder.exists()


@pytest.mark.parametrize(("args", "says"), [(("--counts", "1000,x"), "--counts: '1000,x' is not whole numbers"),
                                           (("--stale", "0"), "--stale: 0 is not between 1 and the smallest count"),
                                           (("--repeats", "0"), "--repeats: 0 is not at least 1")])
def test_sweep_script_refuses_bad_settings_in_one_line(args: tuple[str, ...], says: str) -> None:
    proc = run_script("measure_sweep.py", *args, timeout=60)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.slow
@pytest.mark.eval_stack
def test_eval_script_on_two_and_four_pairs() -> None:
    require_eval_stack()
    proc = run_script("measure_eval.py", "--sizes", "96x128", "--counts", "2,4", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = rows_of(proc.stdout)
    assert [(r["size"], r["count"], r["images"], r["pairs"]) for r in rows] == [("96x128", 2, 2, 2),
                                                                              ("96x128", 4, 4, 4)]
    for row in rows:
        check_rates(row, "per_image")
        assert row["stand_in"] and row["kid_subset"] == row["count"]
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("| 96x128 |") for line in lines) == 2
    assert any(line.startswith("96x128: per image at 4 / at 2: CPU ") for line in lines)
    assert lines[-1].startswith("STAND-IN: stand-in weights: randomly initialised")


@pytest.mark.slow
def test_eval_script_without_the_networks_says_so_in_one_line() -> None:
    """Where the eval extra is missing, the script stops before any work with one line naming it and the command
    that installs it (where it is installed, the run above is the check)."""
    from ootd.evaluation.networks import stack_problem

    if stack_problem() is None:
        pytest.skip("the eval extra is installed here: test_eval_script_on_two_and_four_pairs runs the script")
    proc = run_script("measure_eval.py", "--sizes", "96x128", "--counts", "2,4", timeout=120)
    assert proc.returncode == 3 and proc.stdout == "", proc.stderr[-3000:]
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "the metric networks (LPIPS, FID, KID) cannot run here" in proc.stderr and "eval" in proc.stderr


def test_the_cpu_is_named_with_its_family_and_vector_units() -> None:
    """A virtual machine's model name alone ("AMD EPYC") does not say which kind of CPU gave a figure."""
    spec = importlib.util.spec_from_file_location("measuring", SCRIPTS / "measuring.py")
    measuring = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(measuring)
    cpu_name = measuring.cpu_name

    two = ("processor : 0\nvendor_id : AuthenticAMD\ncpu family : 26\nmodel : 2\nmodel name : AMD EPYC\n"
           "flags : fpu sse2 avx2 fma avx512f avx512_bf16\n\nprocessor : 1\ncpu family : 26\nmodel : 2\n"
           "model name : AMD EPYC\nflags : fpu sse2 avx2 fma avx512f avx512_bf16\n")
    assert cpu_name(cpuinfo=two) == "AMD EPYC (cpu family 26, model 2; AVX2, AVX-512, avx512_bf16)"
    assert cpu_name(cpuinfo="model name : Some CPU\nflags : sse2\n") == "Some CPU"
    assert cpu_name("?", cpuinfo="processor : 0\n") == "?"

