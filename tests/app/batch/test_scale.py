"""Bookkeeping that grows with the batch, never faster: a big failing batch against a bound extrapolated from a
small one on the same machine (a ratio of CPU times, not an absolute time), a resume that reads each output's
record once, and a contact sheet that is not rewritten per pair. The 10^5-pair runs are in
scripts/bench_batch_overhead.py, not here."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from ootd.app.batch.index import ContactIndex
from ootd.app.batch.pages import Heading
from ootd.app.batch.pairs import Pair
from ootd.app.batch.report import PairReport
from ootd.settings import Category
from tests.helpers.cli import invoke
from tests.helpers.fakes import images_tree, read_report


def failing_rows(folder: Path, n: int) -> Path:
    """n rows that fail before anything loads: half name a missing photo, half have no category."""
    path = folder / f"fail{n}.csv"
    path.write_text("".join(f"people/missing{i}.png,garments/g0.png,upper\n" if i % 2 == 0
                            else f"people/p0.png,garments/g{i % 50}.png,\n" for i in range(n)))
    return path


def cpu_seconds(*args: object) -> tuple[float, object]:
    start = time.process_time()  # this process, every thread: the contact sheet's timer included
    result = invoke(*args)
    return time.process_time() - start, result


def test_failing_batches_of_1000_and_10000_rows_cost_what_100_rows_cost_times_10_and_100(
        models, tmp_path: Path, tiny_tree: Path, example_images: dict[str, Path]) -> None:
    models.forbid()
    images_tree(tmp_path, example_images, people=1, garments=1)

    def run(rows: int, name: str) -> float:
        csv_file = failing_rows(tmp_path, rows)
        seconds, result = cpu_seconds("batch", csv_file, "--checkpoints", tiny_tree, "-o", tmp_path / name)
        assert result.exit_code == 1 and result.stderr.count("error: ") == rows, result.output
        return seconds

    run(100, "warm-up")  # imports and first-use costs out of the way
    per_100 = min(run(100, f"small{k}") for k in range(3))
    for rows in (1000, 10_000):
        bound = rows / 100 * per_100  # linear, with the small run's fixed costs (options, folders) counted again
        spent = run(rows, f"big{rows}")
        assert spent < bound, f"{rows} rows took {spent:.2f} s of CPU; 100 rows {per_100:.3f} s: at most {bound:.2f} s"
    assert len(read_report(tmp_path / "big10000" / "batch_report.jsonl")) == 10_000


def test_a_resume_of_a_large_done_batch_reads_each_outputs_record_once(models, tmp_path: Path, tiny_tree: Path,
                                                                       example_images: dict[str, Path],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    models.fake()
    people, garments = images_tree(tmp_path, example_images, people=20, garments=40)
    out = tmp_path / "out"
    args = ["batch", "--models", people, "--cloths", garments, "-k", "upper", "--checkpoints", tiny_tree, "-o", out,
            "--steps", "1", "--resolution", "384x512", "--seed", "2", "-q"]
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    outputs = sorted(out.glob("*.png"))
    assert len(outputs) == 800

    import builtins

    import ootd.app.tryon.provenance as provenance

    opened: Counter[str] = Counter()  # a record read with one read of the file's head, or by Pillow: both count
    real_image_open = Image.open

    def counting(opener):  # noqa: ANN001, ANN202
        def opens(fp, *rest, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            opened[str(fp)] += 1
            return opener(fp, *rest, **kwargs)
        return opens

    monkeypatch.setattr(Image, "open", counting(real_image_open))
    monkeypatch.setattr(provenance, "open", counting(builtins.open), raising=False)  # the module's own reads
    models.forbid()
    again = invoke(*args)
    assert again.exit_code == 0, again.output
    assert [r["status"] for r in read_report(out / "batch_report.jsonl")] == ["skipped"] * 800
    assert opened == Counter({str(p): 1 for p in outputs})  # each record once, no input decoded


def test_a_batch_holds_no_report_or_job_per_pair_while_it_runs(models, tmp_path: Path, tiny_tree: Path,
                                                               example_images: dict[str, Path]) -> None:
    """The summary is counted as reports go past and the jobs are planned as they are reached: while the last
    pair runs, the batch holds a handful of reports and jobs, not one a pair; `--json` lists the first errors."""
    import gc
    import json

    from ootd.app.batch.report import ERRORS_LISTED
    from ootd.app.tryon.job import TryOnJob
    from ootd.cli.display import Display

    models.fake()
    people, garments = images_tree(tmp_path, example_images, people=30, garments=10)
    rows = [f"{person},{garment},upper" for person in sorted(people.iterdir())
            for garment in sorted(garments.iterdir())]
    rows += [f"{people}/missing{i}.png,{garments}/g0.png,upper" for i in range(ERRORS_LISTED + 20)]
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")
    alive: list[tuple[int, int]] = []
    seen = [0]
    real = Display.__call__

    def counting(self: Display, stage: str, done: int, total: int) -> None:  # the progress of every pair
        if stage == "pairs" and done == total - 1:  # the last pair is about to run
            gc.collect()
            objects = gc.get_objects()
            alive.append((sum(isinstance(o, PairReport) for o in objects),
                          sum(isinstance(o, TryOnJob) for o in objects)))
        seen[0] += stage == "pairs"
        real(self, stage, done, total)

    Display.__call__ = counting
    try:
        result = invoke("batch", tmp_path / "pairs.csv", "--checkpoints", tiny_tree, "-o", tmp_path / "out",
                        "--steps", "1", "--resolution", "384x512", "--seed", "2", "--json")
    finally:
        Display.__call__ = real
    assert result.exit_code == 1, result.output
    assert seen[0] == 300 + ERRORS_LISTED + 20
    (reports, jobs), = alive
    assert reports <= 3 and jobs <= 3, (reports, jobs)  # was: every pair's report
    summary = json.loads(result.stdout)
    assert (summary["pairs"], summary["ok"], summary["error"]) == (420, 300, 120)
    assert [e["index"] for e in summary["errors"]] == list(range(300, 300 + ERRORS_LISTED))  # the first rows
    assert summary["errors_not_listed"] == 20


def test_the_contact_sheet_is_written_on_a_timer_not_per_pair(tmp_path: Path) -> None:
    pairs = [Pair(tmp_path / f"p{i}.png", tmp_path / f"g{j}.png", Category.UPPER, index=i * 30 + j)
             for i in range(40) for j in range(30)]
    index = ContactIndex(tmp_path / "index.html", pairs, Heading("t", "s", 0.0), interval=3600)
    index.refresh()
    for pair in pairs:
        index.add(PairReport(pair, "error", "hd", error="no"))
    assert index.writes == 1  # the first write; the next is due in an hour, or at the end
    index.finish()
    assert index.writes == 2 and "1200 pairs: 0 done, 1200 error, 0 pending" in (tmp_path / "index.html").read_text()


def test_the_fast_record_reader_reads_what_pillow_reads(tmp_path: Path) -> None:
    """Resume reads records with one read of each file's head; every other kind of file goes to Pillow, and the
    result is Pillow's in every case."""
    from PIL import PngImagePlugin

    from ootd.app.tryon.provenance import HEAD_BYTES, _read_record_pillow, read_record
    from ootd.imaging.atomic import save_png_atomic

    record = {"software": "ootd 1.0", "seed": "7", "person": "anna.png", "garment": "café.png"}
    save_png_atomic(Image.new("RGB", (8, 8)), tmp_path / "ours.png", record)
    save_png_atomic(Image.new("RGB", (8, 8)), tmp_path / "wide.png", {**record, "person": "日本.png"})  # iTXt
    info = PngImagePlugin.PngInfo()
    info.add_text("software", "ootd 1.0")
    Image.new("RGB", (8, 8)).save(tmp_path / "plain.png", pnginfo=info)
    Image.new("RGB", (8, 8)).save(tmp_path / "none.png")
    Image.new("RGB", (8, 8)).save(tmp_path / "photo.jpg")
    big = PngImagePlugin.PngInfo()
    big.add_text("software", "ootd 1.0")
    big.add_text("notes", "x" * HEAD_BYTES)  # a record longer than the head: Pillow reads it
    Image.new("RGB", (8, 8)).save(tmp_path / "long.png", pnginfo=big)
    data = (tmp_path / "ours.png").read_bytes()
    at = data.index(b"seed") + 6
    (tmp_path / "bad-crc.png").write_bytes(data[:at] + b"8" + data[at + 1:])  # a damaged chunk
    (tmp_path / "cut.png").write_bytes(data[:60])
    (tmp_path / "empty.png").write_bytes(b"")
    for path in sorted(tmp_path.iterdir()):
        assert read_record(path) == _read_record_pillow(path), path.name
    assert read_record(tmp_path / "ours.png") == record
    assert read_record(tmp_path / "wide.png")["person"] == "日本.png"
    assert read_record(tmp_path / "bad-crc.png") == {} and read_record(tmp_path / "missing.png") == {}


@pytest.mark.slow
def test_the_bookkeeping_benchmark_declares_its_stand_in_and_runs_each_case(tiny_tree: Path, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from tests.helpers import REPO

    script = REPO / "scripts" / "bench_batch_overhead.py"
    proc = subprocess.run([sys.executable, str(script), "--sizes", "100", "--ray", "none", "--checkpoints",
                           str(tiny_tree), "--work", str(tmp_path / "work"), "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("STAND-IN MODEL: ")
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [(r["case"], r["code"]) for r in rows] == [("fail", 1), ("ok", 0), ("done", 0)]
    assert rows[1]["calls"]["saving"] == 100  # through the real saving path
    assert rows[1]["calls"]["model"] == 100 + 1 + 100  # 100 try-ons, 1 person, 100 garments
    assert len(list((tmp_path / "work" / "out-local-100").glob("*.png"))) == 100
    assert all(r["peak_rss_mb"] > 0 and 0 < r["components"]["checks"] < r["wall"] for r in rows)
    bad = subprocess.run([sys.executable, str(script), "--cases", "done"], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert bad.returncode == 2 and "done needs ok" in bad.stderr and "Traceback" not in bad.stderr
