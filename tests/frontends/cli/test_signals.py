"""Every command stopped by a real SIGINT or SIGTERM in the middle of its work, in a real process: `ootd run` and
`run/run_ootd.py` while denoising, `ootd batch` (the local engine) in its second pair, `ootd mask` during pose
and parsing, `ootd classify` between garments, `ootd compare` between images, `ootd checkpoints verify` and
`ootd doctor` between files. Each exits 130 or 143 within a
bound with one last line, no traceback, no temporary file and no half-written output; an interrupted batch keeps
its finished pair, its page says so and stderr says how to resume. (Ray's engines: tests/app/batch/
test_ray_signals.py and tests/frontends/serve/test_ray_command.py; the server: tests/frontends/serve/
test_signals.py.)"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
from PIL import Image

from tests.helpers import REPO
from tests.helpers.signals import Stopped, run_signalled, send_during

pytestmark = pytest.mark.slow  # a process each, most loading the tiny pipeline: ~10 s a case

EXITS = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}
STOP_WITHIN_S = 30  # one denoising step of the tiny pipeline is milliseconds; generous for a loaded machine
STEP = "ootd.method.sampling:StepTimer.__call__"  # called after every denoising step
RUN = ["--steps", "400", "--resolution", "384x512", "--seed", "1", "--device", "cpu"]


def check(stopped: Stopped, sig: int, out: Path | None = None) -> list[str]:
    """The documented exit, promptly, one last line, nothing half-written under `out`; stderr's lines."""
    code, last = EXITS[sig]
    print(f"{signal.Signals(sig).name}: exit {stopped.code}, {stopped.seconds:.2f} s after the signal")
    assert stopped.code == code, (stopped.code, stopped.stderr[-3000:])
    lines = stopped.stderr.strip().splitlines()
    assert lines[-1] == last and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    assert stopped.seconds is not None and stopped.seconds < STOP_WITHIN_S
    assert stopped.left == []
    if out is not None and out.exists():
        assert not [p for p in out.rglob("*") if p.name.startswith(".")], "a temporary file was left"
        for picture in out.rglob("*.png"):
            Image.open(picture).load()  # whole, or absent
    return lines


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_run_while_denoising(sig: int, tmp_path: Path, tiny_tree: Path, example_images: dict[str, Path]) -> None:
    out, mark = tmp_path / "out", tmp_path / "sent"
    stopped = run_signalled(["run", "-m", str(example_images["person"]), "-c", str(example_images["tshirt"]), "-k",
                             "upper", "--mask", str(example_images["mask"]), "--checkpoints", str(tiny_tree), "-o",
                             str(out), *RUN], send_during(STEP, sig, mark, at=3), mark)
    check(stopped, sig, out)
    assert not list(out.glob("*.png")) and stopped.stdout == ""


def test_run_ootd_while_denoising(tmp_path: Path, tiny_tree: Path, example_images: dict[str, Path]) -> None:
    mark = tmp_path / "sent"
    stopped = run_signalled(["--model_path", str(example_images["person"]), "--cloth_path",
                             str(example_images["tshirt"]), "--mask_path", str(example_images["mask"]),
                             "--checkpoints", str(tiny_tree), "--step", "400",
                             "--resolution", "384x512", "--device", "cpu"],
                            send_during(STEP, signal.SIGTERM, mark, at=3), mark, script=REPO / "run" / "run_ootd.py",
                            cwd=tmp_path)
    check(stopped, signal.SIGTERM, tmp_path / "images_output")
    assert not list(tmp_path.rglob("out_*.png"))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_batch_in_its_second_pair(sig: int, tmp_path: Path, tiny_tree: Path, example_images: dict[str, Path]) -> None:
    for name, source in (("p0.png", "person"), ("p1.png", "person"), ("g0.png", "tshirt"), ("m0.png", "mask")):
        shutil.copy(example_images[source], tmp_path / name)
    (tmp_path / "pairs.csv").write_text("p0.png,g0.png,upper,m0.png\np1.png,g0.png,upper,m0.png\n")
    out, mark = tmp_path / "out", tmp_path / "sent"
    stopped = run_signalled(["batch", str(tmp_path / "pairs.csv"), "-o", str(out), "--checkpoints", str(tiny_tree),
                             "--steps", "20", "--resolution", "384x512", "--seed", "1", "--device", "cpu"],
                            send_during(STEP, sig, mark, at=23), mark)  # the second pair's third step
    lines = check(stopped, sig, out)
    assert lines[-2].startswith("stopped after 1 of 2 pairs;") and "rerun the same command" in lines[-2], lines
    assert len(list(out.glob("*.png"))) == 1 and len((out / "batch_report.jsonl").read_text().splitlines()) == 1
    page = (out / "index.html").read_text()
    assert 'class="state interrupted"' in page and 'class="state running"' not in page


def test_mask_during_pose_and_parsing(tmp_path: Path, tiny_tree: Path, example_images: dict[str, Path]) -> None:
    out, mark = tmp_path / "out", tmp_path / "sent"
    stopped = run_signalled(["mask", "-m", str(example_images["person"]), "-k", "upper", "--checkpoints",
                             str(tiny_tree), "-o", str(out), "--resolution", "384x512"],
                            send_during("ootd.preprocessing:mask_person", signal.SIGINT, mark, delay=0.0), mark)
    check(stopped, signal.SIGINT, out)
    assert not list(out.glob("*.png"))


def test_classify_between_garments(tmp_path: Path, tiny_tree: Path, example_images: dict[str, Path]) -> None:
    folder, mark = tmp_path / "garments", tmp_path / "sent"
    folder.mkdir()
    for i in range(3):
        shutil.copy(example_images["tshirt"], folder / f"g{i}.png")
    stopped = run_signalled(["classify", str(folder), "--checkpoints", str(tiny_tree)],
                            send_during("ootd.method.classify:classify_garment", signal.SIGTERM, mark, at=2,
                                        delay=None), mark)
    check(stopped, signal.SIGTERM)
    assert stopped.stdout.splitlines()[0].startswith(f"{folder}/g0.png: ")  # what was reviewed was said
    assert "garments:" not in stopped.stdout  # no counts for a review cut short


def test_compare_between_images(tmp_path: Path) -> None:
    mark = tmp_path / "sent"
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        for i in range(3):
            Image.new("RGB", (64, 64), (i, 2, 3)).save(tmp_path / side / f"x{i}.png")
    stopped = run_signalled(["compare", str(tmp_path / "a"), str(tmp_path / "b")],
                            send_during("ootd.tools.compare:compare_pair", signal.SIGINT, mark, at=2, delay=None),
                            mark)
    check(stopped, signal.SIGINT)


@pytest.mark.parametrize(("args", "owner"), [
    (["checkpoints", "verify"], "ootd.weights.verify:check_file"),
    (["doctor", "--no-kernels", "--checkpoints"], "ootd.weights.verify:check_file"),
], ids=["checkpoints-verify", "doctor"])
def test_the_checks_between_files(args: list[str], owner: str, tmp_path: Path, tiny_tree: Path) -> None:
    mark = tmp_path / "sent"
    stopped = run_signalled([*args, str(tiny_tree)], send_during(owner, signal.SIGTERM, mark, at=2, delay=None), mark)
    check(stopped, signal.SIGTERM)
