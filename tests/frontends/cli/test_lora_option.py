"""`--lora` on the command line: the PNG record names the adapter (file, sha256, scale) so a resumed batch redoes
pictures of another adapter; a bad adapter or a scale without one is one line and an exit code."""

from __future__ import annotations

from pathlib import Path

from ootd.app.tryon.config import build_config
from ootd.app.tryon.inputs import JobInputs
from ootd.app.tryon.job import plan_job
from ootd.app.tryon.provenance import differences
from ootd.settings import Category
from ootd.weights.lora import read_adapter
from tests.helpers.cli import assert_one_line_error, invoke
from tests.helpers.images import text
from tests.helpers.training import write_adapter


def test_run_records_the_adapter_and_refuses_bad_ones(tmp_path: Path, tiny_tree: Path, example_images: dict) -> None:
    adapter = write_adapter(tiny_tree, tmp_path / "shop.safetensors", trained=True)
    common = ("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper", "--mask",
              example_images["mask"], "--checkpoints", tiny_tree, "--steps", "1", "--resolution", "384x512",
              "--seed", "1", "--device", "cpu")
    result = invoke(*common, "-o", tmp_path / "out", "--lora", adapter, "--lora-scale", "0.7")
    assert result.exit_code == 0, result.output
    (png,) = (tmp_path / "out").glob("*__0.png")
    record = text(png)
    assert (record["lora"], record["lora_scale"]) == ("shop.safetensors", "0.7")
    assert record["lora_sha256"] == read_adapter(adapter).sha256
    inputs = JobInputs.single(example_images["person"], example_images["tshirt"], Category.UPPER,
                              example_images["mask"])

    def expected_record(config) -> dict[str, str]:  # noqa: ANN001 - what resume expects of the pair with `config`
        return plan_job(config, inputs).expected()

    same = build_config(checkpoints=tiny_tree, seed=1, steps=1, resolution="384x512", lora=str(adapter),
                        lora_scale=0.7)
    assert differences(record, expected_record(same)) is None
    other = build_config(checkpoints=tiny_tree, seed=1, steps=1, resolution="384x512", lora=str(adapter))
    assert "lora_scale 0.7 (now 1)" in differences(record, expected_record(other))
    base = build_config(checkpoints=tiny_tree, seed=1, steps=1, resolution="384x512")
    assert "lora_sha256" in differences(record, expected_record(base))
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(adapter.read_bytes()[:100])
    assert_one_line_error(invoke(*common, "-o", tmp_path / "bad", "--lora", broken), 1, "broken.safetensors",
                          "truncated")
    assert_one_line_error(invoke(*common, "-o", tmp_path / "bad", "--lora-scale", "0.5"), 2, "--lora-scale needs")
    assert_one_line_error(invoke(*common, "-o", tmp_path / "bad", "--lora", adapter, "--lora-scale", "9"), 2,
                          "--lora-scale must be from 0 to 4")
    assert not list((tmp_path / "bad").glob("*.png"))
