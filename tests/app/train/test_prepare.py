"""`ootd train prepare`: the three layouts give the same cache for the same pairs, bad rows are listed with their
numbers and skipped, a rerun does no work, and the split never puts one person on both sides."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ootd.app.train.prepare import PrepareOptions, held_out, prepare
from ootd.models import use_models
from ootd.settings import Category, ModelType, parse_resolution
from ootd.training.cache import entry_path, image_paths, read_entry, read_index
from tests.helpers.synthetic import counted_preprocessor, synthetic_preprocessor
from tests.helpers.training import PAIRS, RESOLUTION, masked_csv, three_layouts


def _options(data: Path, cache: Path, tree: Path, **kw: object) -> PrepareOptions:
    return PrepareOptions(data, cache, tree, resolution=parse_resolution(RESOLUTION), **kw)  # type: ignore[arg-type]


def test_three_layouts_give_the_same_cache(tmp_path: Path, tiny_tree: Path, example_images: dict) -> None:
    layouts = three_layouts(tmp_path / "data", example_images)
    preprocessor = synthetic_preprocessor()
    with use_models(preprocessor=lambda: preprocessor):  # pose + parsing stand in for the tiny tree's random ones
        reports = {name: prepare(_options(data, tmp_path / name, tiny_tree)) for name, data in layouts.items()}
    assert {name: r.layout for name, r in reports.items()} == {name: name for name in layouts}
    keys = {name: sorted(e.key for e in r.index.entries) for name, r in reports.items()}
    assert len(keys["csv"]) == len(PAIRS) and keys["viton-hd"] == keys["dress-code"] == keys["csv"]
    for key in keys["csv"]:
        blobs = {name: entry_path(tmp_path / name, key).read_bytes() for name in layouts}
        assert blobs["viton-hd"] == blobs["dress-code"] == blobs["csv"]
    entry = read_entry(tmp_path / "csv", keys["csv"][0])
    assert entry["target"].shape == (4, 64, 48) and entry["mask"].dtype == torch.uint8


def test_the_cache_holds_what_inference_computes(tmp_path: Path, tiny_tree: Path, example_images: dict,
                                                 pipe_hd) -> None:  # noqa: ANN001
    cache = tmp_path / "cache"
    report = prepare(_options(masked_csv(tmp_path, example_images), cache, tiny_tree))
    first = report.index.entries[0]
    entry = read_entry(cache, first.key)
    res = parse_resolution(RESOLUTION)
    person = pipe_hd.prepare_person(first.person, Category.UPPER, mask=tmp_path / "src" / "m1.png", resolution=res)
    garment = pipe_hd.prepare_garment(first.garment, Category.UPPER, resolution=res)
    (latents,) = pipe_hd._encode([garment.garment])  # the pipeline's own VAE encode of the framed garment
    prompt = garment.prompt
    torch.testing.assert_close(entry["target"], person.original_latents[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(entry["masked"], person.person_latents[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(entry["garment"], latents[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(entry["prompt"], prompt[0], rtol=1e-4, atol=1e-5)


def test_bad_rows_are_listed_and_skipped_and_a_rerun_does_no_work(tmp_path: Path, tiny_tree: Path,
                                                                  example_images: dict) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "broken.png").write_bytes(b"not a picture")
    bad = ("src/missing.png,src/g1.png,upper,src/m1.png", "src/broken.png,src/g1.png,upper",
           "src/p1.png,src/g1.png,lower,src/m1.png", "src/p1.png,src/g1.png,upper,src/g1_wide.png")
    data = masked_csv(tmp_path, example_images, bad)
    from PIL import Image

    Image.new("L", (400, 100), 255).save(tmp_path / "src" / "g1_wide.png")
    options = _options(data, tmp_path / "cache", tiny_tree, split=0.5, model_type=ModelType.HD)
    first = prepare(options)
    assert first.prepared == len(PAIRS) and first.reused == 0
    assert [p.split(":")[0] for p in first.problems] == [f"row {n} (pairs.csv line {n + 1})" for n in (4, 5, 6, 7)]
    assert "not found" in first.problems[0] and "hd model only does upper-body" in first.problems[2]
    assert "aspect" in first.problems[3] and all("\n" not in p for p in first.problems)
    assert read_index(options.cache).skipped == first.problems
    stamps = {p: p.stat().st_mtime_ns for p in (options.cache / "entries").iterdir()}
    again = prepare(options)
    assert (again.prepared, again.reused) == (0, len(PAIRS))
    assert {p: p.stat().st_mtime_ns for p in (options.cache / "entries").iterdir()} == stamps


def test_the_split_never_puts_a_person_on_both_sides(tmp_path: Path, tiny_tree: Path, example_images: dict) -> None:
    report = prepare(_options(masked_csv(tmp_path, example_images), tmp_path / "cache", tiny_tree, split=0.5))
    index = report.index
    train = {e.person_id for e in index.split("train")}
    val = {e.person_id for e in index.split("val")}
    assert train and val and not train & val
    assert len(index.split("train")) == 2  # the person of two pairs stays whole on one side
    for entry in index.split("val"):
        assert all(p.is_file() for p in image_paths(tmp_path / "cache", entry.key))
    people = [f"person{i}" for i in range(50)]
    assert [len(held_out(people[:3], f, 0)) for f in (0.1, 0.34, 0.5, 0.66, 0.9)] == [1, 1, 2, 2, 2]  # nearest
    chosen = held_out(people * 3, 0.2, seed=1)
    assert len(chosen) == 10 and chosen == held_out(list(reversed(people)), 0.2, seed=1)
    assert chosen != held_out(people, 0.2, seed=2)


def test_a_cache_refuses_another_resolution(tmp_path: Path, tiny_tree: Path, example_images: dict) -> None:
    from ootd.errors import UsageError

    data = masked_csv(tmp_path, example_images)
    prepare(_options(data, tmp_path / "cache", tiny_tree))
    with pytest.raises(UsageError, match="holds hd pairs at 384x512"):
        prepare(PrepareOptions(data, tmp_path / "cache", tiny_tree, resolution=parse_resolution("768x1024")))


def test_a_second_identical_row_is_a_duplicate_not_already_there(tmp_path: Path, tiny_tree: Path,
                                                                  example_images: dict) -> None:
    """The same photos listed twice: prepared once, trained on once, and said to be a duplicate of the first row
    (not "already there", which means prepared by an earlier run)."""
    data = masked_csv(tmp_path, example_images, ("src/p1.png,src/g1.png,upper,src/m1.png",))
    first = prepare(_options(data, tmp_path / "cache", tiny_tree))
    assert (first.prepared, first.reused) == (len(PAIRS), 0)
    assert first.duplicates == ["row 4 (pairs.csv line 5): the same photos as row 1 (pairs.csv line 2), trained on "
                                "once"]
    assert len(first.index.entries) == len(PAIRS)
    again = prepare(_options(data, tmp_path / "cache", tiny_tree))
    assert (again.prepared, again.reused, len(again.duplicates)) == (0, len(PAIRS), 1)


def test_a_photo_in_several_rows_is_parsed_once_and_the_cache_is_what_one_row_at_a_time_gives(
        tmp_path: Path, tiny_tree: Path, example_images: dict) -> None:
    """p1 in three rows and p2 in two, interleaved, automatic masks: one pose + parsing per photo; every entry
    byte for byte what a prepare of its row alone writes (that row's own parse), the index in the rows' order."""
    from tests.helpers.training import photos

    photos(tmp_path / "src", example_images)
    rows = ["src/p1.png,src/g1.png,upper", "src/p2.png,src/g1.png,upper", "src/p1.png,src/g2.png,upper",
            "src/p2.png,src/g2.png,upper", "src/p1.png,src/g1.png,lower"]
    (tmp_path / "pairs.csv").write_text("\n".join(["person,garment,category", *rows]) + "\n")
    pre, runs = counted_preprocessor()
    with use_models(preprocessor=lambda: pre):
        report = prepare(_options(tmp_path / "pairs.csv", tmp_path / "cache", tiny_tree))
        assert runs == {"pose": 2, "parsing": 2}  # one parse per distinct photo, not one per row
        assert report.prepared == len(rows) and not report.problems
        listed = [(Path(e.person).name, Path(e.garment).name, e.category) for e in report.index.entries]
        assert listed == [tuple(Path(word).name for word in row.split(",")) for row in rows]
        for n, row in enumerate(rows):  # each row alone: its own parse, as every row had before
            alone = tmp_path / f"alone{n}.csv"
            alone.write_text(f"person,garment,category\n{row}\n")
            own = prepare(_options(alone, tmp_path / f"cache{n}", tiny_tree, model_type=ModelType.DC))
            (entry,) = own.index.entries
            assert entry.key == report.index.entries[n].key
            assert (entry_path(tmp_path / f"cache{n}", entry.key).read_bytes()
                    == entry_path(tmp_path / "cache", entry.key).read_bytes())
