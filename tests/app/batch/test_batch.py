"""`ootd batch`: pairs from CSV and folders, bad pairs, resume, reuse of prepared inputs, shards, scripts.

Batch logic runs against FakePipe (instant); one test runs the real tiny pipeline and counts preparations.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from ootd import cli
from ootd.app.batch.pairs import Pair, Shard, pairs_from_folders, read_pairs_csv, select_shard
from ootd.app.tryon.config import RunConfig
from ootd.errors import UsageError
from ootd.settings import Category
from tests.helpers import REPO
from tests.helpers.fakes import images_tree, read_report, small_config


def config_for(tmp_path: Path, tiny_tree: Path, **kwargs) -> RunConfig:  # noqa: ANN003
    return small_config(tiny_tree, tmp_path / "out", **kwargs)


# ---------------------------------------------------------------------------------------------- pairs


def test_read_pairs_csv_header_optional_relative_paths_and_bad_rows(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    csv_file = tmp_path / "sub" / "pairs.csv"
    csv_file.write_text(
        "# people and garments\n"
        "a.png,shirt.png,upper\n"
        "\n"
        "b.png, /abs/skirt.png , lowerbody, masks/b.png\n"
        "c.png,dress.png,2\n"
        "d.png,x.png,sideways\n"
        "e.png\n"
        "f.png,g.png,upper,m.png,extra\n"
    )
    pairs = read_pairs_csv(csv_file)
    assert [p.index for p in pairs] == list(range(6))
    a, b, c, d, e, f = pairs
    assert a.person == tmp_path / "sub" / "a.png" and a.category is Category.UPPER and a.problem is None
    assert b.garment == Path("/abs/skirt.png") and b.category is Category.LOWER
    assert b.mask == tmp_path / "sub" / "masks" / "b.png"
    assert c.category is Category.DRESS
    assert "sideways" in d.problem and "line 6" in d.problem
    assert e.problem is not None and f.problem is not None

    with_header = tmp_path / "h.csv"
    with_header.write_text("garment,person,mask\nshirt.png,a.png,\n")
    (pair,) = read_pairs_csv(with_header, default_category=Category.UPPER)
    assert pair.person.name == "a.png" and pair.garment.name == "shirt.png" and pair.mask is None
    assert pair.category is Category.UPPER

    with pytest.raises(UsageError, match="no pairs"):
        empty = tmp_path / "empty.csv"
        empty.write_text("person,garment,category\n")
        read_pairs_csv(empty)
    with pytest.raises(UsageError, match="not found"):
        read_pairs_csv(tmp_path / "missing.csv")


def test_read_pairs_csv_hands_the_file_to_the_csv_module_as_it_is(tmp_path: Path) -> None:
    """A quoted newline is one cell (never another file name), a Unicode line separator splits nothing, and a
    record that spans lines is named by its first line."""
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text('a.png,"b.png\nother.png",upper\nc.png,d\u2028e.png,upper\r\nf.png,"g,h.png",upper\n',
                        newline="")
    first, second, third = read_pairs_csv(csv_file)
    assert first.garment.name == "b.png\nother.png" and first.source == "pairs.csv line 1"
    assert second.garment.name == "d\u2028e.png" and second.source == "pairs.csv line 3"
    assert third.garment.name == "g,h.png" and third.source == "pairs.csv line 4"
    assert all(p.problem is None for p in (first, second, third))


@pytest.mark.parametrize("header", ["person,garment,category,notes", "person,notes,garment,category",
                                    "id,person,garment,category", "notes,garment,person,category,id"])
def test_columns_the_header_names_but_ootd_does_not_use_are_ignored_wherever_they_are(tmp_path: Path,
                                                                                      header: str) -> None:
    names = header.split(",")
    values = {"person": "a.png", "garment": "b.png", "category": "upper"}
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text(f"{header}\n{','.join(values.get(n, 'x') for n in names)}\n")
    (pair,) = read_pairs_csv(csv_file)
    assert pair.problem is None and pair.person.name == "a.png" and pair.garment.name == "b.png"
    assert pair.category is Category.UPPER


def test_a_row_wider_than_its_header_and_a_header_naming_a_column_twice(tmp_path: Path) -> None:
    wide = tmp_path / "wide.csv"
    wide.write_text("person,garment\na.png,b.png,upper\n")
    (pair,) = read_pairs_csv(wide)
    assert "3 columns, expected at most 2" in pair.problem and "line 2" in pair.problem
    twice = tmp_path / "twice.csv"
    twice.write_text("person,garment,model\na.png,b.png,c.png\n")
    with pytest.raises(UsageError, match="twice.csv line 1: .*names the person column twice"):
        read_pairs_csv(twice)


@pytest.mark.parametrize("data, line, words", [
    (b"a.png,b.png,upper\nc.png,d\x00.png,upper\n", 2, "NUL byte"),
    (b"a.png,b.png,upper\n" * 5000 + b"caf\xe9.png,b.png,upper\n", 5001, "UTF-8"),
])
def test_what_the_csv_module_cannot_take_names_its_line(tmp_path: Path, data: bytes, line: int, words: str) -> None:
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_bytes(data)
    with pytest.raises(UsageError, match=f"pairs.csv line {line}: .*{words}"):
        read_pairs_csv(csv_file)


def test_pairs_from_folders_zip_product_and_masks(tmp_path: Path, example_images: dict[str, Path]) -> None:
    people, garments = images_tree(tmp_path, example_images, people=2, garments=3)
    (tmp_path / "masks").mkdir()
    shutil.copy(example_images["mask"], tmp_path / "masks" / "p1.png")
    (people / "notes.txt").write_text("not an image")

    product = pairs_from_folders(people, garments, Category.UPPER, "product", masks=tmp_path / "masks")
    assert [(p.person.name, p.garment.name) for p in product] == [
        (f"p{i}.png", f"g{j}.png") for i in range(2) for j in range(3)
    ]
    assert {p.person.name: p.mask for p in product}["p1.png"] == tmp_path / "masks" / "p1.png"
    assert {p.person.name: p.mask for p in product}["p0.png"] is None

    with pytest.raises(UsageError, match="zip pairing needs as many"):
        pairs_from_folders(people, garments, Category.UPPER, "zip")
    (garments / "g2.png").unlink()
    zipped = pairs_from_folders(people, garments, Category.UPPER, "zip")
    assert [(p.person.name, p.garment.name) for p in zipped] == [("p0.png", "g0.png"), ("p1.png", "g1.png")]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no images"):
        pairs_from_folders(people, tmp_path / "empty", Category.UPPER)
    with pytest.raises(UsageError, match="not found"):
        pairs_from_folders(people, tmp_path / "nowhere", Category.UPPER)


def test_select_shard_covers_every_pair_once_in_garment_blocks(tmp_path: Path, tiny_tree: Path) -> None:
    config = config_for(tmp_path, tiny_tree)
    pairs = [Pair(Path(f"p{i}.png"), Path(f"g{j}.png"), Category.UPPER, index=i * 5 + j)
             for i in range(4) for j in range(5)]
    shards = [select_shard(pairs, Shard(k, 3), config) for k in range(3)]
    assert sorted(p.index for s in shards for p in s) == list(range(20))
    assert sorted(len(s) for s in shards) == [6, 7, 7]
    garments_per_shard = [len({p.garment for p in s}) for s in shards]
    assert sum(garments_per_shard) <= 5 + 2  # contiguous blocks: a garment is split at most at a border
    with pytest.raises(UsageError):
        Shard(3, 3)
    with pytest.raises(UsageError, match="K/N"):
        Shard.parse("1-3")
    assert Shard.parse("1/3") == Shard(1, 3)


# ---------------------------------------------------------------------------------------------- runs


def test_batch_folders_product_reuses_each_input_once(models, tmp_path: Path, example_images: dict[str, Path],
                                                      tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    people, garments = images_tree(tmp_path, example_images, people=3, garments=2)
    made = models.fake()
    out = tmp_path / "out"
    result = CliRunner().invoke(cli.app, [
        "batch", "--models", str(people), "--cloths", str(garments), "--category", "upper", "--pairing", "product",
        "--checkpoints", str(tiny_tree), "-o", str(out), "--seed", "11", "--steps", "1", "--resolution", "384x512",
    ])
    assert result.exit_code == 0, result.output
    (pipe,) = made["hd"]
    assert pipe.calls == {"person": 3, "garment": 2, "generate": 6}
    # garment by garment: each garment's pairs run back to back
    assert [Path(g).name for g in pipe.garments] == ["g0.png", "g1.png"]
    report = read_report(out / "batch_report.jsonl")
    assert [r["status"] for r in report] == ["ok"] * 6
    assert sorted(r["index"] for r in report) == list(range(6))
    assert sum(not r["reused"]["person"] for r in report) == 3
    assert sum(not r["reused"]["garment"] for r in report) == 2
    assert {r["seed"] for r in report} == {11}
    assert sorted(p.name for p in out.glob("*.png")) == sorted(
        f"p{i}__g{j}__0.png" for i in range(3) for j in range(2)
    )
    assert "6 pairs: 6 ok, 0 skipped, 0 error" in result.stdout
    assert "prepared 3 people, 2 garments" in result.stdout


def test_batch_csv_bad_pair_in_the_middle_then_resume(models, tmp_path: Path, example_images: dict[str, Path],
                                                      tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    people, garments = images_tree(tmp_path, example_images, people=2, garments=1)
    data = example_images["person"].read_bytes()
    (people / "broken.png").write_bytes(data[: len(data) // 3])
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text(
        "person,garment,category\n"
        "people/p0.png,garments/g0.png,upper\n"
        "people/broken.png,garments/g0.png,upper\n"
        "people/missing.png,garments/g0.png,upper\n"
        "people/p1.png,garments/g0.png,sideways\n"
        "people/p1.png,garments/g0.png,upperbody\n"
    )
    made = models.fake()
    out = tmp_path / "out"
    args = ["batch", str(csv_file), "--checkpoints", str(tiny_tree), "-o", str(out), "--steps", "1",
            "--resolution", "384x512", "--save-intermediates"]
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 1, result.output
    report = {r["index"]: r for r in read_report(out / "batch_report.jsonl")}
    assert [report[i]["status"] for i in range(5)] == ["ok", "error", "error", "error", "ok"]
    assert "corrupt or truncated" in report[1]["error"] and "broken.png" in report[1]["error"]
    assert "file not found" in report[2]["error"]
    assert "sideways" in report[3]["error"]
    assert report[0]["outputs"] == [str(out / "p0__g0__0.png")]
    assert set(report[0]["intermediates"]) == {"mask", "masked_person", "pose", "parsing"}
    assert "3 error" in result.stdout and "broken.png" in result.stderr
    assert (out / "p1__g0__0.png").is_file() and not (out / "broken__g0__0.png").exists()
    assert made["hd"][0].calls["generate"] == 2

    # rerun: finished pairs are skipped (no model load at all when nothing else can run)
    (people / "broken.png").write_bytes(data)
    before = (out / "p0__g0__0.png").stat().st_mtime_ns
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 1  # the missing file and the bad category are still errors
    report = {r["index"]: r for r in read_report(out / "batch_report.jsonl")}
    assert [report[i]["status"] for i in range(5)] == ["skipped", "ok", "error", "error", "skipped"]
    assert (out / "p0__g0__0.png").stat().st_mtime_ns == before
    assert made["hd"][1].calls == {"person": 1, "garment": 1, "generate": 1}

    # fixed CSV: every pair done now -> exit 0 without loading anything
    csv_file.write_text("people/p0.png,garments/g0.png,upper\npeople/broken.png,garments/g0.png,upper\n")
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    assert len(made["hd"]) == 2
    assert "0 ok, 2 skipped" in result.stdout


def test_batch_mixed_categories_load_each_model_once(models, tmp_path: Path, example_images: dict[str, Path],
                                                     tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    people, garments = images_tree(tmp_path, example_images, people=1, garments=1)
    shutil.copy(example_images["trousers"], garments / "trousers.png")
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text(
        "people/p0.png,garments/trousers.png,lower\n"
        "people/p0.png,garments/g0.png,upper\n"
        "people/p0.png,garments/g0.png,dress\n"
        "people/p0.png,garments/trousers.png,lower\n"  # duplicate: same output names
    )
    made = models.fake()
    out = tmp_path / "out"
    result = CliRunner().invoke(cli.app, ["batch", str(csv_file), "--checkpoints", str(tiny_tree), "-o", str(out),
                                          "--json", "--steps", "1", "--resolution", "384x512"])
    summary = json.loads(result.stdout)
    assert result.exit_code == 1
    assert summary["loads"] == {"hd": 1, "dc": 1}
    assert (summary["ok"], summary["error"]) == (2, 2)  # dress collides with upper (same names), duplicate too
    assert all("collide" in e["error"] for e in summary["errors"])
    assert {pipe.calls["generate"] for pipes in made.values() for pipe in pipes} == {1}

    forced = CliRunner().invoke(cli.app, ["batch", str(csv_file), "--checkpoints", str(tiny_tree), "-o",
                                          str(tmp_path / "o2"), "--model-type", "hd", "--json"])
    errors = json.loads(forced.stdout)["errors"]
    assert forced.exit_code == 1 and any("only does upper-body" in e["error"] for e in errors)


def test_batch_interrupt_exits_130_and_keeps_report(models, tmp_path: Path, example_images: dict[str, Path],
                                                    tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    people, garments = images_tree(tmp_path, example_images, people=2, garments=1)
    models.fake(fail_generate=KeyboardInterrupt(), fail_on_call=2)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli.app, ["batch", "--models", str(people), "--cloths", str(garments),
                                          "--category", "upper", "--checkpoints", str(tiny_tree), "-o", str(out)])
    assert result.exit_code == 130
    assert result.stderr.strip().splitlines()[-1] == "interrupted"  # after the finished pair's line
    assert [r["status"] for r in read_report(out / "batch_report.jsonl")] == ["ok"]
    assert sorted(p.name for p in out.iterdir()) == ["batch_report.jsonl", "index.html", "p0__g0__0.png"]
    page = (out / "index.html").read_text()
    assert 'src="p0__g0__0.png"' in page  # written once more as the batch stopped
    assert "Interrupted" in page and "1 pending pair(s) were not run: rerun the same command to resume" in page
    assert 'http-equiv="refresh"' not in page  # a stopped batch's page does not reload itself


def test_batch_usage_errors(models, tmp_path: Path, tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    models.fake()
    runner = CliRunner()
    cases = [
        (["batch"], "nothing to do"),
        (["batch", "--models", str(tmp_path)], "needs both"),
        (["batch", "--models", str(tmp_path), "--cloths", str(tmp_path)], "needs --category"),
        (["batch", str(tmp_path / "x.csv"), "--models", str(tmp_path)], "not both"),
        (["batch", str(tmp_path / "x.csv")], "file not found"),
        (["batch", str(tmp_path / "x.csv"), "--shard", "2/2"], "shard"),
    ]
    for args, message in cases:
        result = runner.invoke(cli.app, [*args, "--checkpoints", str(tiny_tree)])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_batch_real_pipeline_prepares_each_input_once(models, tmp_path: Path, example_images: dict[str, Path], pipe_hd,  # noqa: ANN001
                                                      tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2 people x 2 garments on the tiny model: 4 try-ons, 2 person and 2 garment preparations."""
    people, garments = images_tree(tmp_path, example_images, people=2, garments=2)
    csv_file = tmp_path / "pairs.csv"
    mask = example_images["mask"]
    csv_file.write_text("".join(f"people/p{i}.png,garments/g{j}.png,upper,{mask}\n" for i in range(2)
                                for j in range(2)))
    counts: Counter[str] = Counter()
    for name in ("prepare_person", "prepare_garment", "generate"):
        original = getattr(pipe_hd, name)

        def spy(*args, _original=original, _name=name, **kwargs):  # noqa: ANN002, ANN003, ANN202
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(pipe_hd, name, spy)
    models.use(pipe_hd)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli.app, ["batch", str(csv_file), "-o", str(out), "--checkpoints",
                                          str(tiny_tree), "--steps", "1", "--resolution", "384x512",
                                          "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert counts == {"prepare_person": 2, "prepare_garment": 2, "generate": 4}
    outputs = sorted(out.glob("*.png"))
    assert len(outputs) == 4
    with Image.open(outputs[0]) as im:
        assert im.size == (384, 512) and im.text["seed"] == "3"


# ---------------------------------------------------------------------------------------------- scripts


def test_scripts_dry_run(tmp_path: Path) -> None:
    env = {**os.environ, "DRY_RUN": "1", "OOTD": "ootd", "STEPS": "2", "SAMPLES": "3", "CATEGORY": "lower",
           "OOTD_DEVICE": "cuda:1", "OOTD_CHECKPOINTS": "/ck", "OUT": str(tmp_path / "o")}
    single = subprocess.run(["bash", str(REPO / "scripts" / "batch_tryon.sh"), "people", "garments", "--seed", "4"],
                            env=env, capture_output=True, text=True, check=True).stdout
    for part in ("ootd batch --models people --cloths garments --category lower", "--steps 2", "--samples 3",
                 "--checkpoints /ck", "--device cuda:1", "--seed 4"):
        assert part in single
    multi = subprocess.run(["bash", str(REPO / "scripts" / "multi_gpu.sh"), "pairs.csv"],
                           env={**env, "GPUS": "2,5", "GPU_VAR": "HIP_VISIBLE_DEVICES"},
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(multi) == 2
    assert multi[0].startswith("HIP_VISIBLE_DEVICES=2 ootd batch pairs.csv --shard 0/2")
    assert multi[1].startswith("HIP_VISIBLE_DEVICES=5 ootd batch pairs.csv --shard 1/2")
    assert all("--device cuda:0" in line and "batch_report.shard" in line for line in multi)
    usage = subprocess.run(["bash", str(REPO / "scripts" / "multi_gpu.sh")], capture_output=True, text=True)
    assert usage.returncode == 2 and "shard" in usage.stdout


def test_the_reuse_caches_remembered_error_is_raised_with_a_fresh_traceback_each_time() -> None:
    """A bad input is prepared once and its error raised for each of its pairs; the raises must not chain (a
    garment in 10^5 rows would keep 10^5 tracebacks and their frames alive)."""
    from ootd.app.batch.runner import _Cache
    from ootd.errors import UsageError
    from tests.helpers import traceback_length

    cache = _Cache(2)
    computed = []

    def prepare() -> None:
        computed.append(1)
        raise UsageError("person image: cannot be read")

    lengths = []
    for _ in range(200):
        with pytest.raises(UsageError) as caught:
            cache.get(("person.png", "upper"), prepare)
        lengths.append(traceback_length(caught.value))
    assert len(computed) == 1 and max(lengths) < 10, lengths[:5]
