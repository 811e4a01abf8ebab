"""A disk that fills up under every writer of the commands: `ootd run`, `ootd train prepare`, `ootd train run` and
`ootd eval`'s files (the batch's own: tests/frontends/cli/test_never_lose_a_file.py; the server's jobs:
tests/frontends/serve/test_full_disk.py). Each writer is tried both ways (tests/helpers/disk.py): with ENOSPC
injected at each file it writes in turn, and on a small real filesystem (a tmpfs, where the test may mount one).

Every time: one line, `error: no space left on device (FILE)`, naming the file that did not fit, exit 1; every file
written before it complete and as a run without the full disk writes it; no temporary file or folder left; and once
space is back the same command (resume, or --overwrite) finishes - a resumed training run with an adapter equal,
bit for bit, to an uninterrupted run's."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.helpers.cli import invoke
from tests.helpers.disk import disk_fills_at, fill_leaving, free_up, leftovers, small_filesystem
from tests.helpers.evaluation import batch_folder, stand_ins
from tests.helpers.training import masked_csv, prepared_cache

FULL = "no space left on device ("


def _one_full_line(result, path: Path | None = None) -> str:  # noqa: ANN001
    assert result.exit_code == 1, result.output
    (line,) = [line for line in result.stderr.strip().splitlines() if line.startswith("error: ")]
    assert result.stderr.strip().splitlines()[-1] == line and "Traceback" not in result.output, result.stderr
    assert FULL in line, line
    if path is not None:
        assert line == f"error: {FULL}{path})", line
    return line


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative name -> bytes), the filler of a small filesystem left out."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".filler"}


# ---------------------------------------------------------------------------------------------- ootd run


def _run(example_images: dict[str, Path], tiny_tree: Path, out: Path, *extra: object):  # noqa: ANN202
    return invoke("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper",
                  "--mask", example_images["mask"], "--checkpoints", tiny_tree, "-o", out, "--samples", "2",
                  "--steps", "1", "--resolution", "384x512", "--seed", "4", "--save-intermediates", "--grid", *extra)


def test_ootd_run_stops_at_each_write_that_does_not_fit(models, tmp_path: Path, tiny_tree: Path,  # noqa: ANN001
                                                        example_images: dict[str, Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    models.fake()
    with disk_fills_at(None, monkeypatch) as clean:
        assert _run(example_images, tiny_tree, tmp_path / "clean").exit_code == 0
    whole = _files(tmp_path / "clean")
    assert len(clean.paths) == len(whole) >= 5  # two pictures, the mask, the masked person, the grid
    for n, path in enumerate(clean.paths):
        out = tmp_path / f"full{n}"
        with disk_fills_at(n, monkeypatch) as log:
            result = _run(example_images, tiny_tree, out)
        _one_full_line(result, out / path.name)
        assert log.failed == out / path.name and len(log.paths) == n + 1  # it stopped there
        before = {p.name for p in clean.paths[:n]}
        assert _files(out) == {name: whole[name] for name in before}  # what was written: whole, as without
        assert not leftovers(out)
        again = _run(example_images, tiny_tree, out, "--overwrite")  # space is back
        assert again.exit_code == 0, again.output
        assert _files(out) == whole


def test_ootd_run_on_a_small_filesystem(models, tmp_path: Path, tiny_tree: Path,  # noqa: ANN001
                                        example_images: dict[str, Path]) -> None:
    models.fake()
    assert _run(example_images, tiny_tree, tmp_path / "clean").exit_code == 0
    whole = _files(tmp_path / "clean")
    with small_filesystem(tmp_path / "small", "4m") as small:
        out = small / "out"
        out.mkdir()
        fill_leaving(small, 0)
        line = _one_full_line(_run(example_images, tiny_tree, out))
        assert str(out) in line and _files(out) == {} and not leftovers(out)
        fill_leaving(small, 3 * 4096)  # three pages: some files fit, then one does not
        line = _one_full_line(_run(example_images, tiny_tree, out))
        kept = _files(out)
        assert kept and all(kept[name] == whole[name] for name in kept) and not leftovers(out)
        assert Path(line.removeprefix(f"error: {FULL}").rstrip(")")).name not in kept
        free_up(small)
        assert _run(example_images, tiny_tree, out, "--overwrite").exit_code == 0
        assert _files(out) == whole


# ------------------------------------------------------------------------------------------- train prepare


def _prepare(data: Path, cache: Path, tiny_tree: Path):  # noqa: ANN202
    return invoke("train", "prepare", data, "-o", cache, "--checkpoints", tiny_tree, "--resolution", "384x512",
                  "--split", "0.5", "--device", "cpu")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, tiny_tree: Path, example_images: dict) -> dict:
    """A training set's pairs (masks given) and the cache a prepare without a full disk makes of it, with the
    files it writes in order."""
    root = tmp_path_factory.mktemp("prepare")
    data = masked_csv(root / "data", example_images)
    monkeypatch = pytest.MonkeyPatch()
    with disk_fills_at(None, monkeypatch) as log:
        assert _prepare(data, root / "clean", tiny_tree).exit_code == 0
    monkeypatch.undo()
    return {"data": data, "whole": _files(root / "clean"), "writes": log.paths, "root": root / "clean"}


@pytest.mark.parametrize("n", [0, 2, pytest.param(-1, id="the index")])
def test_train_prepare_stops_at_a_write_that_does_not_fit_and_resumes(prepared: dict, tmp_path: Path,
                                                                      tiny_tree: Path, n: int,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    writes = prepared["writes"]
    assert len(writes) == len(prepared["whole"]) >= 4  # the entries, the held-out photos, the index (last)
    n = n % len(writes)
    cache = tmp_path / "cache"
    with disk_fills_at(n, monkeypatch) as log:
        result = _prepare(prepared["data"], cache, tiny_tree)
    failed = cache / writes[n].relative_to(prepared["root"])
    _one_full_line(result, failed)
    assert log.failed == failed
    done = _files(cache)
    assert done == {k: prepared["whole"][k] for k in done} and str(failed.relative_to(cache)) not in done
    assert not leftovers(cache)
    again = _prepare(prepared["data"], cache, tiny_tree)  # space is back: the pairs left, then the index
    assert again.exit_code == 0, again.output
    assert _files(cache) == prepared["whole"]


@pytest.mark.slow
def test_train_prepare_stops_at_every_write(prepared: dict, tmp_path: Path, tiny_tree: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for n, path in enumerate(prepared["writes"]):
        cache = tmp_path / f"cache{n}"
        with disk_fills_at(n, monkeypatch):
            _one_full_line(_prepare(prepared["data"], cache, tiny_tree), cache / path.relative_to(prepared["root"]))
        assert not leftovers(cache)
        assert _prepare(prepared["data"], cache, tiny_tree).exit_code == 0
        assert _files(cache) == prepared["whole"]


def test_train_prepare_on_a_small_filesystem(prepared: dict, tmp_path: Path, tiny_tree: Path) -> None:
    with small_filesystem(tmp_path / "small", "8m") as small:
        cache = small / "cache"
        cache.mkdir()
        fill_leaving(small, 0)
        _one_full_line(_prepare(prepared["data"], cache, tiny_tree))
        assert not leftovers(cache)
        free_up(small)
        assert _prepare(prepared["data"], cache, tiny_tree).exit_code == 0
        assert _files(cache) == prepared["whole"]


# ------------------------------------------------------------------------------------------------ train run

STEPS = ["--steps", "4", "--checkpoint-every", "2", "--validation-pairs", "1", "--validate-every", "4",
         "--validation-steps", "1", "--device", "cpu", "--seed", "3", "--batch-size", "1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_tree: Path, example_images: dict) -> dict:
    """A prepared cache (one person held out, for the validation sheets) and an uninterrupted run of it, with the
    files it wrote in order."""
    root = tmp_path_factory.mktemp("train")
    cache = prepared_cache(root / "data", tiny_tree, example_images, split=0.5)
    monkeypatch = pytest.MonkeyPatch()
    with disk_fills_at(None, monkeypatch) as log:
        result = _train(cache, root / "whole", tiny_tree)
    monkeypatch.undo()
    assert result.exit_code == 0, result.output
    return {"cache": cache, "run": root / "whole", "writes": log.paths}


def _train(cache: Path, run: Path, tiny_tree: Path, *extra: str):  # noqa: ANN202
    return invoke("train", "run", cache, "-o", run, "--checkpoints", tiny_tree, *STEPS, *extra)


def _as_checkpoint(relative: Path) -> Path:
    """A file written in a checkpoint's hidden folder, as the checkpoint's own file (what the error names)."""
    return Path(re.sub(r"\.(step-\d+)\.\d+\.tmp", r"\1", str(relative)))


def _resumed_equals_whole(trained: dict, run: Path, tiny_tree: Path) -> None:
    """--resume once space is back: it ends at the last step with the uninterrupted run's adapter, bit for bit."""
    from ootd.app.train.checkpoints import checkpoints

    resumed = _train(trained["cache"], run, tiny_tree, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert (run / "lora.safetensors").read_bytes() == (trained["run"] / "lora.safetensors").read_bytes()
    assert [c.step for c in checkpoints(run)] == [2, 4]
    assert not leftovers(run)


@pytest.mark.parametrize(("which", "time"), [
    ("checkpoints/step-00000004/optimizer.safetensors", 0),  # the second checkpoint, half-written
    pytest.param("lora.safetensors", 1, marks=pytest.mark.slow),  # the run's adapter after the last checkpoint
    pytest.param("loss.jsonl", 0, marks=pytest.mark.slow),  # step 1's loss line: no checkpoint yet, so from 0
    pytest.param("loss.jsonl", 2, marks=pytest.mark.slow),  # step 3's line of the loss log
    pytest.param("validation/step-00000004.png", 0, marks=pytest.mark.slow),  # the validation sheet
])
def test_train_run_stops_at_a_write_and_resumes_to_the_same_adapter(trained: dict, tmp_path: Path,
                                                                    tiny_tree: Path, which: str, time: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped at the `time`-th write of `which` (from 0), with every checkpoint before it whole; resumed (from
    step 0 when it stopped before its first checkpoint)."""
    from ootd.app.train.checkpoints import checkpoints, load_checkpoint

    writes = [_as_checkpoint(p.relative_to(trained["run"])) for p in trained["writes"]]
    n = [k for k, p in enumerate(writes) if p == Path(which)][time]
    run = tmp_path / "run"
    with disk_fills_at(n, monkeypatch) as log:
        result = _train(trained["cache"], run, tiny_tree)
    _one_full_line(result, run / which)
    assert log.failed is not None and log.failed.name == Path(which).name
    assert not leftovers(run)
    for last in checkpoints(run)[-1:]:
        assert load_checkpoint(last).step == last.step >= 2  # the last complete checkpoint loads
    _resumed_equals_whole(trained, run, tiny_tree)


@pytest.mark.slow
def test_train_run_stops_at_every_write_and_resumes_to_the_same_adapter(trained: dict, tmp_path: Path,
                                                                        tiny_tree: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for n in range(len(trained["writes"])):
        run = tmp_path / f"run{n}"
        with disk_fills_at(n, monkeypatch):
            result = _train(trained["cache"], run, tiny_tree)
        _one_full_line(result)
        assert not leftovers(run)
        if (run / "run.json").is_file():
            _resumed_equals_whole(trained, run, tiny_tree)
        else:  # the first write: nothing of the run exists, it starts afresh
            assert _train(trained["cache"], run, tiny_tree).exit_code == 0
            assert (run / "lora.safetensors").read_bytes() == (trained["run"] / "lora.safetensors").read_bytes()


@pytest.mark.slow
def test_train_run_on_a_small_filesystem_resumes_to_the_same_adapter(trained: dict, tmp_path: Path,
                                                                     tiny_tree: Path) -> None:
    """Room for the run up to its first checkpoint and a little more: it stops at a later write, naming it."""
    from ootd.app.train.checkpoints import checkpoints

    with small_filesystem(tmp_path / "small", "32m") as small:
        probe = small / "probe"
        free = _measure_first_checkpoint(trained, probe, tiny_tree, small)
        shutil.rmtree(probe)
        run = small / "run"
        fill_leaving(small, free)
        _one_full_line(_train(trained["cache"], run, tiny_tree))
        assert not leftovers(run) and [c.step for c in checkpoints(run)][:1] == [2]
        free_up(small)
        _resumed_equals_whole(trained, run, tiny_tree)


def _measure_first_checkpoint(trained: dict, probe: Path, tiny_tree: Path, small: Path) -> int:
    """The bytes a run takes up to its first checkpoint, plus half a checkpoint: room for that, not the next."""
    from ootd.app.train.checkpoints import checkpoints
    from tests.helpers.disk import free_bytes

    before = free_bytes(small)
    assert invoke("train", "run", trained["cache"], "-o", probe, "--checkpoints", tiny_tree,
                  *[a if a != "4" else "2" for a in STEPS]).exit_code == 0
    used = before - free_bytes(small)
    checkpoint = sum(p.stat().st_size for p in checkpoints(probe)[-1].folder.iterdir())
    return used + checkpoint // 2


# -------------------------------------------------------------------------------------------------- eval


def _batch_folder(root: Path) -> tuple[Path, Path]:
    out, photos = batch_folder(root)
    (out / "index.html").write_text('<!doctype html><title>batch</title><p class="counts">2 ok</p></html>\n')
    return out, photos


def _complete(name: str, data: bytes) -> bool:
    """A file of eval's, whole: JSON that parses, a page that ends."""
    if name.endswith(".json"):
        return isinstance(json.loads(data), dict)
    return data.rstrip().endswith(b"</html>")


def test_eval_stops_at_each_of_its_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, photos = _batch_folder(tmp_path / "clean")
    with stand_ins(), disk_fills_at(None, monkeypatch) as clean:
        assert invoke("eval", out, "--truth", photos).exit_code == 0
    names = [p.name for p in clean.paths]
    assert names == ["eval.json", "eval.html", "index.html"]
    for n, name in enumerate(names):
        folder, photos = _batch_folder(tmp_path / f"full{n}")
        before = _files(folder)
        with stand_ins(), disk_fills_at(n, monkeypatch):
            _one_full_line(invoke("eval", folder, "--truth", photos), folder / name)
        now = _files(folder)
        assert not leftovers(folder)
        assert all(_complete(kept, now[kept]) for kept in names[:n])  # written before the full disk: whole
        assert all(now.get(left) == before.get(left) for left in names[n:])  # the rest as before (the page too)
        with stand_ins():
            assert invoke("eval", folder, "--truth", photos).exit_code == 0  # space is back
        now = _files(folder)
        assert all(_complete(each, now[each]) for each in names) and b"eval.html" in now["index.html"]


def test_eval_on_a_small_filesystem(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "small", "4m") as small:
        out, photos = _batch_folder(small)
        before = _files(out)
        fill_leaving(small, 0)
        with stand_ins():
            line = _one_full_line(invoke("eval", out, "--truth", photos))
        assert "eval" in line and _files(out) == before and not leftovers(out)
        free_up(small)
        with stand_ins():
            assert invoke("eval", out, "--truth", photos).exit_code == 0
        assert {"eval.json", "eval.html"} <= set(_files(out))
