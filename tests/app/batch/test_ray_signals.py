"""`ootd batch --engine ray` stopped by SIGTERM or SIGINT while Ray starts and in the middle of a pair: a real
process with its own private Ray instance and its own process group, the signal sent while `ray.init` runs, the
moment it returns (Ray's own handlers installed, not yet replaced) or while a worker denoises (to the whole
group, as Ctrl-C at a terminal). Every time: the documented exit code within a bound, one last line, no stack
dump, nothing half-written, no Ray process left behind, and the page and stderr saying how to resume."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
from PIL import Image

from tests.helpers.signals import run_signalled, send_during

pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # each case starts a Ray instance: ~15 s

EXITS = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}
FIRST_IMPORT = "from ootd.app.signals import ray_for_a_driver\nray_for_a_driver()\n"  # as the command imports Ray
STOP_WITHIN_S = 60  # generous for a loaded machine; each case prints what it took


@pytest.fixture
def pairs(tmp_path: Path, example_images: dict[str, Path]) -> Path:
    for name, source in (("p0.png", "person"), ("p1.png", "person"), ("g0.png", "tshirt"), ("m0.png", "mask")):
        shutil.copy(example_images[source], tmp_path / name)
    csv = tmp_path / "pairs.csv"
    csv.write_text("p0.png,g0.png,upper,m0.png\np1.png,g0.png,upper,m0.png\n")
    return csv


def ray_batch(pairs: Path, tiny_tree: Path, out: Path, steps: int) -> list[str]:
    return ["batch", str(pairs), "-o", str(out), "--checkpoints", str(tiny_tree), "--engine", "ray", "--workers", "1",
            "--gpus-per-worker", "0", "--steps", str(steps), "--resolution", "384x512", "--seed", "1"]


def check_stopped(stopped, sig: int) -> None:  # noqa: ANN001
    code, last = EXITS[sig]
    print(f"{signal.Signals(sig).name}: exit {stopped.code}, {stopped.seconds:.1f} s after the signal")
    assert stopped.code == code, (stopped.code, stopped.stderr[-3000:])
    assert stopped.stderr.strip().splitlines()[-1] == last, stopped.stderr[-3000:]
    for bad in ("Traceback", "SIGTERM received", "internal error"):
        assert bad not in stopped.stderr, stopped.stderr[-3000:]
    assert stopped.seconds is not None and stopped.seconds < STOP_WITHIN_S
    assert stopped.left == [], f"Ray processes left behind: {stopped.left}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("when", [0.3, None], ids=["while-ray-starts", "as-ray-init-returns"])
def test_a_signal_while_ray_starts_stops_it_and_leaves_nothing(pairs: Path, tiny_tree: Path, tmp_path: Path,
                                                                sig: int, when: float | None) -> None:
    mark = tmp_path / "sent"
    out = tmp_path / "out"
    stopped = run_signalled(ray_batch(pairs, tiny_tree, out, 1),
                            FIRST_IMPORT + send_during("ray:init", sig, mark, delay=when), mark)
    check_stopped(stopped, sig)
    assert not out.exists()  # Ray starts before anything is written


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_group_mid_pair_keeps_what_is_done_and_says_how_to_resume(pairs: Path, tiny_tree: Path,
                                                                                   tmp_path: Path, sig: int) -> None:
    """The first pair finishes; the signal reaches the driver and Ray's node (raylet, GCS; the actor has a process
    group of its own) while the second denoises. The node's end races the driver's own stop: Ray's threads in the
    driver must find nothing of the batch to recover (that ends the process at once, exit 1)."""
    mark = tmp_path / "sent"
    out = tmp_path / "out"
    patch = FIRST_IMPORT + send_during("ootd.app.batch.report:ReportWriter.write", sig, mark, at=1, delay=2.0,
                                       target="group")
    stopped = run_signalled(ray_batch(pairs, tiny_tree, out, 200), patch, mark)
    check_stopped(stopped, sig)
    lines = stopped.stderr.strip().splitlines()
    assert lines[-2].startswith("stopped after 1 of 2 pairs;") and "rerun the same command to resume" in lines[-2]
    page = (out / "index.html").read_text()
    assert 'class="state interrupted"' in page and "rerun" in page.lower(), page[-2000:]
    # the first pair's picture; the second's too where its worker (a process group of its own) finished it while the
    # driver stopped (a fast machine: 200 tiny steps in about the 2 s before the signal), whole either way
    pictures = sorted(out.glob("*.png"))
    assert [p.name for p in pictures][:1] == ["p0__g0__0.png"] and len(pictures) <= 2, pictures
    for picture in pictures:
        with Image.open(picture) as image:
            image.load()
    assert not list(out.glob(".*.tmp"))
    assert len((out / "batch_report.jsonl").read_text().splitlines()) == 1
