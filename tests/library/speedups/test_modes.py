"""Speed modes and presets (ootd/speedups/modes.py): `exact` is the default and today's numbers, `fast` combines the
modes that change the images, explicit options win, and every output records what ran."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from ootd import cli
from ootd.app.tryon.settings import SETTINGS
from ootd.errors import UsageError
from ootd.settings import QuantizeName, SpeedPreset
from ootd.speedups.modes import PRESETS, FeatureCache, SpeedModes, TokenMerge, resolve_speed


def test_no_preset_and_exact_are_the_exact_method() -> None:
    for modes in (resolve_speed(), resolve_speed("exact"), resolve_speed("EXACT")):
        assert modes == SpeedModes(TokenMerge(0.0), FeatureCache(1), QuantizeName.NONE)
        assert modes.label() == "exact"


def test_fast_and_what_overrides_it() -> None:
    fast = resolve_speed("fast")
    assert fast == PRESETS[SpeedPreset.FAST] and fast.label() == "fast"
    assert fast.token_merge.on and fast.feature_cache.on  # both modes that change the images are on
    mine = resolve_speed("fast", cache_interval=2)
    assert (mine.feature_cache.interval, mine.token_merge, mine.label()) == (2, fast.token_merge, "custom")
    back = resolve_speed("fast", token_merge=0, cache_interval=1)  # every mode off again: exact, whatever was asked
    assert back.label() == "exact"
    assert resolve_speed(None, cache_interval=3).label() == "custom"  # options alone, as before presets existed
    # channels_last only changes rounding: it does not make exact anything else
    assert resolve_speed("exact", channels_last=True).label() == "exact"


@pytest.mark.parametrize("given", [{"cache_interval": 3}, {"token_merge": 0.25}, {"quantize": "int8-dynamic"}])
def test_exact_refuses_a_mode_that_changes_the_images(given: dict) -> None:
    with pytest.raises(UsageError, match="^speed exact keeps the exact method") as info:  # the library's words
        resolve_speed("exact", **given)
    assert "\n" not in str(info.value) and info.value.setting == "speed"
    # each front end names the settings its way: the CLI by their flags, the user's own words
    flag = {"cache_interval": "--cache-interval 3", "token_merge": "--token-merge 0.25",
            "quantize": "--quantize int8-dynamic"}[next(iter(given))]
    assert info.value.words(SETTINGS.flag) == f"--speed exact keeps the exact method; {flag} changes the images: " \
                                              "drop one of them"
    exact = PRESETS[SpeedPreset.EXACT]  # the exact values themselves are fine
    words = {"cache_interval": exact.feature_cache.interval, "token_merge": exact.token_merge.ratio,
             "quantize": exact.quantize.value}
    resolve_speed("exact", **{k: v for k, v in words.items() if k in given})


@pytest.mark.parametrize(("preset", "given", "word"), [
    ("turbo", {}, "speed preset"), ("fast", {"token_merge": 0.9}, "token merge"),
    ("fast", {"cache_interval": 0}, "cache interval"), (None, {"quantize": "int4"}, "quantization")])
def test_bad_words_are_one_line_usage_errors(preset: str | None, given: dict, word: str) -> None:
    with pytest.raises(UsageError, match=word):
        resolve_speed(preset, **given)


def _run(args: list, extra: list[str]) -> dict:
    out = CliRunner().invoke(cli.app, [str(a) for a in [*args, *extra]])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def _pixels(path: str) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int16)


@pytest.mark.slow  # three CLI runs end to end
def test_cli_presets_record_their_options_and_exact_is_the_default(tiny_tree, example_images, tmp_path) -> None:  # noqa: ANN001
    args = ["run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper", "--mask",
            example_images["mask"], "--checkpoints", tiny_tree, "--steps", "3", "--resolution", "384x512",
            "--seed", "11", "--device", "cpu", "--precision", "fp32", "--json", "--name", "{i}"]
    default = _run(args, ["-o", tmp_path / "default"])
    exact = _run(args, ["-o", tmp_path / "exact", "--speed", "exact"])
    fast = _run(args, ["-o", tmp_path / "fast", "--speed", "fast"])
    assert default["settings"]["speed"] == exact["settings"]["speed"] == "exact"
    assert np.array_equal(_pixels(default["outputs"][0]), _pixels(exact["outputs"][0]))
    preset = PRESETS[SpeedPreset.FAST]
    assert {k: fast["settings"][k] for k in ("speed", "token_merge", "cache_interval", "quantize")} == {
        "speed": "fast", "token_merge": preset.token_merge.ratio, "cache_interval": preset.feature_cache.interval,
        "quantize": "none"}
    with Image.open(fast["outputs"][0]) as im:
        recorded = dict(im.info)
    assert (recorded["speed"], recorded["token_merge"], recorded["cache_interval"]) == (
        "fast", str(preset.token_merge.ratio), str(preset.feature_cache.interval))
    with Image.open(exact["outputs"][0]) as im:
        assert (im.info["speed"], im.info["token_merge"], im.info["quantize"]) == ("exact", "0.0", "none")
    # a control: the fast images are not the exact ones
    assert np.abs(_pixels(fast["outputs"][0]) - _pixels(exact["outputs"][0])).max() > 0
    custom = _run(args, ["-o", tmp_path / "custom", "--speed", "fast", "--cache-interval", "2"])
    assert (custom["settings"]["speed"], custom["settings"]["cache_interval"]) == ("custom", 2)


def test_cli_refuses_exact_with_a_mode_in_one_line(tiny_tree, example_images, tmp_path) -> None:  # noqa: ANN001
    out = CliRunner().invoke(cli.app, [str(a) for a in [
        "run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper",
        "--checkpoints", tiny_tree, "-o", tmp_path, "--speed", "exact", "--token-merge", "0.5"]])
    assert out.exit_code == 2 and out.stderr.strip().count("\n") == 0
    assert "--speed exact" in out.stderr and "--token-merge 0.5" in out.stderr
    assert not any(tmp_path.iterdir())


def _recorded(modes: SpeedModes):  # noqa: ANN202 - the record of a picture made with these modes
    from pathlib import Path

    from ootd.app.tryon.config import RunConfig
    from ootd.app.tryon.record import PassRecord, Record
    from ootd.settings import Category, ModelType, SamplingSettings

    config = RunConfig(Path("ckpt"), sampling=SamplingSettings(seed=1), speed=modes)
    return Record(PassRecord(ModelType.HD, Category.UPPER, config, "p.png", "g.png", "auto"))


def test_the_summary_line_names_the_modes_that_are_on() -> None:
    assert _recorded(resolve_speed()).speed_summary() == ""
    assert _recorded(resolve_speed("fast")).speed_summary() == "speed fast (token merge 0.5, cache interval 3)"
    assert _recorded(resolve_speed(quantize="int8-dynamic")).speed_summary() == "speed custom (quantize int8-dynamic)"


def test_a_batch_resumed_with_other_speed_modes_is_stale() -> None:
    from ootd.app.tryon.provenance import differences as _differences

    exact = {"steps": "4", "cache_interval": "1", "token_merge": "0.0", "quantize": "none"}
    old = {"software": "ootd 0.9", "steps": "4"}  # written before the keys existed: exact
    assert _differences(old, exact) is None
    assert _differences({**old, **exact, "token_merge": "0.5"}, exact) == "token_merge 0.5 (now 0.0)"
    assert _differences({**old, **exact, "quantize": "int8-dynamic"}, exact) == "quantize int8-dynamic (now none)"


def test_the_server_keeps_its_speed_modes_for_every_request(tmp_path) -> None:  # noqa: ANN001
    from ootd.app.tryon.config import build_config
    from ootd.serve.forms import parse_settings
    from ootd.serve.limits import Limits

    base = build_config(checkpoints=tmp_path, speed="fast")
    _, config = parse_settings({"category": "upper", "steps": "3"}, base, Limits())
    assert config.speed == base.speed == PRESETS[SpeedPreset.FAST]
    assert config.sampling.steps == 3


def test_a_ratio_is_recorded_the_same_however_it_was_spelt() -> None:
    assert str(TokenMerge(0).ratio) == "0.0"
    assert _recorded(resolve_speed(token_merge=0)).text()["token_merge"] == "0.0"


def test_auto_precision_on_a_bf16_cpu_runs_bf16_and_says_why(tiny_tree, example_images, tmp_path,  # noqa: ANN001
                                                               monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("OOTD_CPU_BF16", "1")
    out = CliRunner().invoke(cli.app, [str(a) for a in [
        "run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper", "--mask",
        example_images["mask"], "--checkpoints", tiny_tree, "--steps", "1", "--resolution", "384x512", "--seed", "1",
        "--device", "cpu", "-o", tmp_path]])
    assert out.exit_code == 0, out.output
    assert "bf16 (auto: the CPU has bf16 matrix units; --precision fp32 for fp32 numbers)" in out.stdout
    with Image.open(next(tmp_path.glob("*.png"))) as im:
        assert im.info["precision"] == "bf16"


def test_library_chatter_from_the_quant_extra_stays_out_of_the_terminal() -> None:
    import logging

    from ootd.app.console import console_logging

    with console_logging(verbose=False, quiet=False):
        assert logging.getLogger("torchao").getEffectiveLevel() >= logging.ERROR
        assert logging.getLogger("torch.utils._pytree").getEffectiveLevel() >= logging.ERROR
