"""The job itself (ootd/app/tryon/job.py, preflight.py, passes.py, record.py): one pass or two, the pre-flight's
order and scope, its refusals, and what a job records, on the instant stand-in pipelines of tests/helpers/fakes.py
(through the one models seam) and the synthetic pose + parsing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PIL import Image

import ootd.app.tryon.preflight as preflight
from ootd.app.tryon.config import RunConfig, parse_size
from ootd.app.tryon.inputs import GarmentInput, JobInputs
from ootd.app.tryon.job import plan_job
from ootd.app.tryon.loader import models_for
from ootd.app.tryon.passes import pass_seed
from ootd.app.tryon.preflight import check_batch, prepare_job
from ootd.app.tryon.provenance import differences
from ootd.app.tryon.record import DEFAULT_WORDS, PIXEL_SETTINGS
from ootd.errors import CheckpointError, InputImageError, NoPersonError, OutputError, UsageError
from ootd.settings import Category, ModelType, SamplingSettings, parse_resolution
from tests.helpers.synthetic import synthetic_preprocessor


def config_for(tree: Path, out: Path, **kwargs) -> RunConfig:  # noqa: ANN003
    sampling = SamplingSettings(num_samples=2, steps=1, seed=5, resolution=parse_resolution("384x512"))
    return RunConfig(checkpoints=tree, output=out, sampling=sampling, **kwargs)


def outfit(x: dict[str, Path], top_mask: Path | None = None, trousers_mask: Path | None = None) -> JobInputs:
    """The top first, as a user may give them: the job puts the lower garment's pass first."""
    return JobInputs.of(x["person"], [GarmentInput(x["tshirt"], Category.UPPER, top_mask),
                                      GarmentInput(x["trousers"], Category.LOWER, trousers_mask)])


def one(x: dict[str, Path], category: Category = Category.UPPER, mask: Path | None = None) -> JobInputs:
    return JobInputs.single(x["person"], x["tshirt"] if category is Category.UPPER else x["trousers"], category, mask)


# --------------------------------------------------------------------------------------------- passes


def test_one_garment_is_one_pass_and_an_outfit_two_in_their_order(tmp_path: Path, example_images) -> None:  # noqa: ANN001
    config = config_for(tmp_path, tmp_path / "out", save_intermediates=True)
    single = plan_job(config, one(example_images))
    assert [(p.name, p.model_type, p.on_results) for p in single.passes] == [("", ModelType.HD, False)]
    assert single.models == (ModelType.HD,) and single.describe_models() == "hd" and single.records_run_seed
    assert [p.name for p in single.targets.images] == ["person__tshirt__0.png", "person__tshirt__1.png"]
    assert sorted(single.targets.intermediates) == ["mask", "masked_person", "parsing", "pose"]

    two = plan_job(config, outfit(example_images))
    assert [(p.name, p.garment.category, p.model_type, p.on_results) for p in two.passes] == [
        ("lower", Category.LOWER, ModelType.DC, False), ("upper", Category.UPPER, ModelType.HD, True)]
    assert two.models == (ModelType.DC, ModelType.HD) and two.describe_models() == "dc+hd"
    assert not two.records_run_seed
    assert two.passes[0].config.sampling.seed == pass_seed(5, "lower")
    assert [two.passes[1].config_for(i).sampling.seed for i in range(2)] == [pass_seed(5, f"upper {i}")
                                                                             for i in range(2)]
    assert all(two.passes[1].config_for(i).sampling.num_samples == 1 for i in range(2))
    assert [p.name for p in two.targets.images] == ["person__tshirt-with-trousers__0.png",
                                                    "person__tshirt-with-trousers__1.png"]
    assert sorted(two.targets.intermediates) == sorted([
        "lower_pose", "lower_parsing", "lower_mask", "lower_masked_person", "lower_result_0", "lower_result_1",
        "upper_mask", "upper_masked_person"])
    # --model-type dc: one model serves both passes; the lower pass is dc whatever is asked
    dc = plan_job(config_for(tmp_path, tmp_path / "out", model_type=ModelType.DC), outfit(example_images))
    assert dc.models == (ModelType.DC,) and dc.describe_models() == "dc+dc"


@pytest.mark.parametrize(("garments", "words"), [
    ([("dress.png", Category.DRESS), ("tshirt", Category.UPPER)], "dress.png is a dress"),
    ([("tshirt", Category.UPPER), ("tshirt", Category.UPPER)], "are both upper"),
    ([("tshirt", Category.UPPER)] * 3, "an outfit is two garments, got 3"),
])
def test_refused_outfits(tmp_path: Path, example_images, garments, words: str) -> None:  # noqa: ANN001
    inputs = JobInputs.of(example_images["person"], [GarmentInput(example_images.get(g, g), c) for g, c in garments])
    with pytest.raises(UsageError, match=words):
        plan_job(config_for(tmp_path, tmp_path), inputs)


def test_refused_combinations(tmp_path: Path, example_images) -> None:  # noqa: ANN001
    with pytest.raises(UsageError, match="^grid shows one garment") as grid:  # the setting, in the library's words
        plan_job(config_for(tmp_path, tmp_path, grid=True), outfit(example_images))
    assert grid.value.setting == "grid"
    with pytest.raises(UsageError, match="hd model only does upper-body"):
        plan_job(config_for(tmp_path, tmp_path, model_type=ModelType.HD), one(example_images, Category.LOWER))


# ------------------------------------------------------------------------------------------ pre-flight


def _problems(tmp_path: Path, example_images, tiny_tree: Path):  # noqa: ANN001, ANN202
    """A run in which every step of the pre-flight would fail: each problem is removed in turn."""
    bad_image = tmp_path / "bad.png"
    bad_image.write_text("not an image")
    missing_tree = tmp_path / "no-tree"
    shutil.copytree(tiny_tree, missing_tree)
    shutil.rmtree(missing_tree / "ootd" / "ootd_hd")
    out = tmp_path / "out"
    out.mkdir()
    Image.new("RGB", (8, 8)).save(out / "person__tshirt__0.png")  # not ours: refused without --overwrite
    return bad_image, missing_tree, out


def test_the_steps_run_in_their_order_and_the_first_failing_one_speaks(models, tmp_path: Path, example_images,  # noqa: ANN001
                                                                       tiny_tree: Path) -> None:
    models.forbid()  # no check needs a diffusion model
    bad_image, missing_tree, out = _problems(tmp_path, example_images, tiny_tree)
    x = example_images
    lower_on_hd = JobInputs.single(bad_image, x["trousers"], Category.LOWER)
    budget = parse_size("1MiB")
    config = config_for(missing_tree, out, model_type=ModelType.HD, max_memory=budget)
    with pytest.raises(UsageError, match="hd model only does upper-body"):  # 1 before 2
        prepare_job(config, lower_on_hd)
    config = config_for(missing_tree, out, max_memory=budget)
    with pytest.raises(InputImageError, match="bad.png"):  # 2 before 3
        prepare_job(config, JobInputs.single(bad_image, x["tshirt"], Category.UPPER))
    with pytest.raises(CheckpointError, match="ootd_hd"):  # 3 before 5
        prepare_job(config, one(x))
    config = config_for(tiny_tree, out, max_memory=budget)
    with pytest.raises(UsageError, match="is not an ootd picture"):  # 5 before 6
        prepare_job(config, one(x))
    (out / "person__tshirt__0.png").unlink()
    with pytest.raises(UsageError, match="max_memory"):  # 6 before 7
        prepare_job(config, one(x))

    class Nobody:
        def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
            raise NoPersonError("nobody")

    models.use(lambda model_type: pytest.fail("loaded"), Nobody())
    with pytest.raises(NoPersonError, match="no person detected in .*person.png"):  # 7
        prepare_job(config_for(tiny_tree, out), one(x))
    assert not any(out.iterdir())  # nothing written by any of them


def test_an_outfit_checks_every_input_and_makes_both_masks_from_one_parse(models, tmp_path: Path,  # noqa: ANN001
                                                                          example_images, tiny_tree: Path) -> None:
    bad_image = tmp_path / "bad.png"
    bad_image.write_text("not an image")
    x = {**example_images, "trousers": bad_image}
    with pytest.raises(InputImageError, match="bad.png"):  # the second garment too, before anything else
        prepare_job(config_for(tiny_tree, tmp_path / "out"), outfit(x))

    preprocessor = synthetic_preprocessor()
    parses = []
    parse = preprocessor.parse
    preprocessor.parse = lambda image: parses.append(1) or parse(image)
    models.use(lambda model_type: pytest.fail("loaded"), preprocessor)
    job = prepare_job(config_for(tiny_tree, tmp_path / "out"), outfit(example_images))
    assert job.parses == 1 and len(parses) == 1 and job.inputs.checked
    lower, upper = job.passes
    assert lower.person_mask is not None and lower.person_mask.category is Category.LOWER
    # the upper pass's mask, for the lower pass's results: the photo's framing at the working resolution
    assert upper.person_mask is None and upper.mask.size == (384, 512)


def test_the_batch_steps_run_once_and_the_pair_steps_per_pair(models, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                                              tmp_path: Path, example_images, tiny_tree: Path) -> None:
    from ootd.app.batch.pairs import Pair
    from ootd.app.batch.runner import BatchRunner

    calls: list[str] = []
    for name in ("check_checkpoints_present", "check_memory_budget"):
        real = getattr(preflight, name)
        monkeypatch.setattr(preflight, name, lambda *a, real=real, name=name, **k: calls.append(name) or real(*a, **k))
    models.fake(synthetic_preprocessor())
    x = example_images
    people = [tmp_path / f"p{i}.png" for i in range(3)]
    for person in people:
        shutil.copy(x["person"], person)
    pairs = [Pair(person, x["tshirt"], Category.UPPER, x["mask"], index=i, source=f"row {i}")
             for i, person in enumerate(people)]
    pairs.append(Pair(x["person"], x["trousers"], Category.LOWER, index=3, source="row 3", garment2=x["tshirt"],
                      category2=Category.UPPER))
    config = config_for(tiny_tree, tmp_path / "out")
    summary = BatchRunner(config, models_for(config)).run(pairs)
    assert summary.count("ok") == 4, summary.tally.errors()
    assert calls == ["check_checkpoints_present", "check_memory_budget"]  # once for the whole batch
    calls.clear()
    check_batch(config_for(tiny_tree, tmp_path / "x"), [ModelType.HD, ModelType.DC, ModelType.HD], True)
    assert calls == ["check_checkpoints_present", "check_memory_budget"]


def test_a_job_is_planned_once(models, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, example_images,  # noqa: ANN001
                               tiny_tree: Path) -> None:
    """The pre-flight decodes the inputs of the job it planned (their names kept, so its passes and output names
    stand), a run that makes a later pass's mask decodes them in the same job, and a replica's copy of a job is
    the job moved to its folder: no step plans it again."""
    import ootd.app.tryon.job as job_module

    planned = []
    real = job_module.plan_job
    for module in (job_module, preflight):
        monkeypatch.setattr(module, "plan_job", lambda *a, **k: planned.append(1) or real(*a, **k))
    models.fake(synthetic_preprocessor())
    config = config_for(tiny_tree, tmp_path / "out")
    owner = models_for(config)
    job = prepare_job(config, outfit(example_images), owner)
    moved = job.relocated(tmp_path / "replica")
    assert [p.parent for p in moved.targets.all()] == [tmp_path / "replica"] * len(job.targets.all())
    assert [p.name for p in moved.targets.all()] == [p.name for p in job.targets.all()]
    assert all(one.config.output == tmp_path / "replica" for one in moved.passes)
    moved.run(owner)
    assert planned == [1]
    batch_like = job_module.plan_job(config, outfit(example_images))  # a batch's pair: masks made as it runs
    outcome = batch_like.run(owner)
    assert planned == [1, 1] and outcome.job.inputs.checked and outcome.job.targets == batch_like.targets


# --------------------------------------------------------------------------------------------- records


def test_an_outfit_runs_its_passes_on_their_models_and_records_each(models, tmp_path: Path, example_images,  # noqa: ANN001
                                                                    tiny_tree: Path) -> None:
    made = models.fake()
    x = example_images
    config = config_for(tiny_tree, tmp_path / "out")
    owner = models_for(config)
    job = prepare_job(config, outfit(x, x["mask"], x["mask"]), owner)
    outcome = job.run(owner)
    dc, hd = made["dc"][0], made["hd"][0]
    assert (dc.calls["generate"], hd.calls["generate"]) == (1, 2)  # the lower pass once, the upper per result
    images, intermediates = job.save(outcome)
    assert len(images) == 2 and set(intermediates) == set()
    records = [outcome.record(i) for i in range(2)]
    texts = [r.text() for r in records]
    assert [t["seed"] for t in texts] == [str(pass_seed(5, f"upper {i}")) for i in range(2)]
    assert all(t["lower_seed"] == str(pass_seed(5, "lower")) and t["outfit"] == "lower+upper" for t in texts)
    assert texts[0]["model_type"] == "hd" and texts[0]["lower_model_type"] == "dc" and texts[0]["samples"] == "1"
    with Image.open(images[1]) as im:  # what is written is the record's text, in its order
        assert {k: v for k, v in im.info.items() if isinstance(v, str)} == texts[1]
    # resume: every picture compares as made with the job's settings (their own upper seeds set aside)
    expected = job.expected()
    assert all(differences(job.comparable(t), expected) is None for t in texts)
    assert differences(job.comparable({**texts[0], "lower_seed": "1"}), expected) is not None
    assert [p["model_type"] for p in records[0].pass_summary()] == ["dc", "hd"]


def test_one_garment_records_its_settings_once_for_every_answer(models, tmp_path: Path, example_images,  # noqa: ANN001
                                                                tiny_tree: Path) -> None:
    models.fake()
    config = config_for(tiny_tree, tmp_path / "out", save_intermediates=True, grid=True)
    owner = models_for(config)
    job = prepare_job(config, one(example_images, mask=example_images["mask"]), owner)
    outcome = job.run(owner)
    record = outcome.record(1)
    text = record.text()
    assert list(text)[:3] == ["software", "model_type", "category"] and text["sample"] == "1"
    # no adapter, the working size: their keys are not written, and mean those defaults
    assert {k: {**DEFAULT_WORDS, **text}[k] for k in PIXEL_SETTINGS} == {**job.expected(), "seed": "5"}
    assert "lora" not in text
    settings = record.settings()  # the JSON of `--json` and the API: numbers as numbers
    assert (settings["samples"], settings["steps"], settings["scale"], settings["seed"]) == (2, 1, 2.0, 5)
    described = outcome.describe()
    assert described["settings"] == settings and described["mask"] == str(example_images["mask"])
    images, intermediates = job.save(outcome)
    assert sorted(intermediates) == ["grid", "mask", "masked_person"]
    with Image.open(intermediates["grid"]) as im:  # the job's other pictures: the record without a sample
        assert im.info["seed"] == "5" and "sample" not in im.info
    with pytest.raises(OutputError, match="already exists"):  # nothing is replaced without --overwrite
        prepare_job(config, one(example_images, mask=example_images["mask"]), owner)
