"""The library speaks its own words: an error raised below the front ends (the library and the application layer
under it) names the setting it is about by its declared name (and carries it, with the value), never a
command-line flag, and each front end words it its own way (ootd/errors.py: `OotdError.about`, `worded`).

Three checks: the library's checks exercised with bad values (each error names its setting, no flag, and the CLI's
words for it are the flag), the application layer's likewise, worded by the command that reaches them (its own
flags: `ootd batch` calls `people` `--models`), and a scan of the source of every module outside the front ends for
a flag in the text of anything it raises (a command a user runs in a shell, in backticks, such as `ootd download
--list` or `ray start --head`, is a command, not a setting).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from ootd.app.tryon.settings import SETTINGS
from ootd.errors import OotdError, worded
from tests.helpers import REPO

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
COMMAND = re.compile(r"`(?:ootd|ray|pip|python) [^`]*`")  # a shell command the message tells the user to run
FRONT_ENDS = ("cli", "serve", "comfyui")  # ootd's front ends (run/run_ootd.py is outside ootd/): they word errors


def _cases(tmp_path: Path) -> list[tuple[str, Callable[[], object]]]:
    import torch

    from ootd.evaluation.settings import check_batch
    from ootd.imaging.atomic import write_bytes_atomic
    from ootd.settings import (
        Category,
        ModelType,
        PhotoOutput,
        SamplingSettings,
        check_category_margin,
        check_feather,
        check_mask_grow,
        check_model_category,
        check_threads,
    )
    from ootd.speedups.execution import compile_error
    from ootd.speedups.modes import FeatureCache, TokenMerge, resolve_speed
    from ootd.training.settings import DistillSettings, TrainSettings
    from ootd.weights.integrity import require_finite_latents
    from ootd.weights.layout import Layout
    from ootd.weights.loading import check_text_tower
    from ootd.weights.lora import LoraChoice, check_lora_scale

    (tmp_path / "exists.bin").write_bytes(b"x")
    clip = Layout(tmp_path / "tree").clip
    clip.mkdir(parents=True)
    (clip / "config.json").write_text("{}")  # no text tower: what `auto` needs
    (clip / "model.safetensors").write_bytes(b"x")

    def raise_(error: Exception) -> None:
        raise error

    return [
        ("mask_grow", lambda: check_mask_grow(10_000)),
        ("threads", lambda: check_threads(0)),
        ("feather", lambda: check_feather(99)),
        ("category_margin", lambda: check_category_margin(1.0)),
        ("model_type", lambda: check_model_category(ModelType.HD, Category.LOWER)),
        ("output_size", lambda: PhotoOutput.from_words("working", True)),
        ("feather", lambda: PhotoOutput.from_words(None, False, 6)),
        ("samples", lambda: SamplingSettings.from_words(num_samples=0)),
        ("steps", lambda: SamplingSettings.from_words(steps=5000)),
        ("scale", lambda: SamplingSettings.from_words(guidance_scale=99.0)),
        ("seed", lambda: SamplingSettings.from_words(seed=-1)),
        ("token_merge", lambda: TokenMerge(0.9)),
        ("cache_interval", lambda: FeatureCache(0)),
        ("speed", lambda: resolve_speed("exact", token_merge=0.5)),
        ("lora_scale", lambda: check_lora_scale(9)),
        ("lora_scale", lambda: LoraChoice.parse(None, 2.0)),
        ("lora", lambda: LoraChoice.parse(tmp_path / "missing.safetensors")),
        ("learning_rate", lambda: TrainSettings.from_words(learning_rate=5.0)),
        ("ema_decay", lambda: DistillSettings.from_words(ema_decay=1.0)),
        ("sampler", lambda: DistillSettings.from_words(sampler="unipc")),
        ("teacher_lora_scale", lambda: LoraChoice.parse(None, 2.0, names=("teacher_lora", "teacher_lora_scale"))),
        ("batch_size", lambda: check_batch(0)),
        ("precision", lambda: require_finite_latents(torch.full((1,), math.nan), "fp16")),
        ("compile", lambda: raise_(compile_error(RuntimeError("inductor failed")))),
        ("overwrite", lambda: write_bytes_atomic(tmp_path / "exists.bin", b"y")),
        ("category", lambda: check_text_tower(Layout(tmp_path / "tree"))),
    ]


def test_the_librarys_errors_name_their_setting_and_no_flag(tmp_path: Path) -> None:
    def flag(name: str) -> str:
        return SETTINGS.flag(name) or "--" + name.replace("_", "-")

    for setting, call in _cases(tmp_path):
        with pytest.raises(OotdError) as raised:
            call()
        error = raised.value
        assert error.setting == setting, (setting, str(error))
        assert not FLAG.search(COMMAND.sub("", str(error))), str(error)
        cli = worded(error, flag)
        assert flag(setting) in cli and cli != str(error), (setting, cli)  # the CLI's words are its flags


def _below_the_front_ends() -> list[Path]:
    root = REPO / "ootd"
    return sorted(p for p in root.rglob("*.py") if p.relative_to(root).parts[0] not in FRONT_ENDS)


def _texts(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _named(call: ast.AST) -> str:
    func = call.func if isinstance(call, ast.Call) else None
    return getattr(func, "attr", None) or getattr(func, "id", None) or ""


def raised_texts(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string that can be part of a raised message: inside a `raise`, inside a call of an
    error type (`...Error(`, `.about(`), and the strings assigned to a name such a raise or call uses."""
    tree = ast.parse(source)
    messages = [n for n in ast.walk(tree) if isinstance(n, ast.Raise)
                or (isinstance(n, ast.Call) and (_named(n).endswith("Error") or _named(n) == "about"))]
    used = {name.id for node in messages for name in ast.walk(node) if isinstance(name, ast.Name)}
    found = [(node.lineno, text) for node in messages for text in _texts(node)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in used for t in node.targets):
            found += [(node.lineno, text) for text in _texts(node.value)]
    return sorted(set(found))


def test_the_scan_finds_a_flag_in_what_is_raised() -> None:
    source = ('hint = "use --mask"\nraise UsageError(f"bad {x}; {hint}")\n'
              'err = DeviceError.about("compile", "run without --compile")\n'
              'note = "--not-raised"\nraise CheckpointError("run `ootd download --list`")\n')
    flagged = [(line, FLAG.findall(COMMAND.sub("", text))) for line, text in raised_texts(source)]
    assert sorted((line, flags) for line, flags in flagged if flags) == [(1, ["--mask"]), (3, ["--compile"])]


def test_the_scan_covers_the_library_and_the_application_layer() -> None:
    scanned = {p.relative_to(REPO / "ootd").parts[0] for p in _below_the_front_ends()}
    assert {"app", "settings.py", "weights", "speedups", "tools", "training", "evaluation"} <= scanned
    assert not scanned & set(FRONT_ENDS)


def test_no_module_below_the_front_ends_raises_a_message_naming_a_flag() -> None:
    found = []
    for path in _below_the_front_ends():
        for line, text in raised_texts(path.read_text("utf-8")):
            flags = FLAG.findall(COMMAND.sub("", text))
            if flags:
                found.append(f"{path.relative_to(REPO)}:{line}: {flags[0]} in {text!r}")
    assert not found, ("errors below the front ends name command-line flags (name the setting: `{@mask_grow}`, see "
                       "ootd/errors.py):\n" + "\n".join(found))


def _app_cases(tmp_path: Path) -> list[tuple[str, str, Callable[[], object]]]:
    """(command whose words apply, setting, a call of the application layer that refuses it)."""
    from types import SimpleNamespace

    from ootd.app.batch.cluster import ClusterOptions
    from ootd.app.batch.pairs import collect_pairs
    from ootd.app.evaluate.matching import PhotoIndex
    from ootd.app.evaluate.preservation import PreservationOptions
    from ootd.app.evaluate.run import EvalOptions
    from ootd.app.train.checkpoints import check_resumable
    from ootd.app.train.layouts import viton_rows
    from ootd.app.train.prepare import PrepareOptions
    from ootd.app.tryon.loader import check_checkpoints_present
    from ootd.app.tryon.naming import template_fields
    from ootd.app.tryon.outputs import prepare_output_dir, refuse_existing
    from ootd.training.settings import TrainSettings

    (tmp_path / "exists.png").write_bytes(b"x")
    (tmp_path / "people").mkdir(exist_ok=True)
    settings = TrainSettings.from_words()
    saved = SimpleNamespace(state={"settings": {**{name: getattr(settings, name)
                                                    for name in TrainSettings.RESUME_FIXED}, "rank": 99}})
    return [
        ("run", "name", lambda: template_fields("{person")),
        ("run", "name", lambda: template_fields("{person}")),
        ("run", "overwrite", lambda: refuse_existing([tmp_path / "exists.png"])),
        ("run", "output", lambda: prepare_output_dir(tmp_path / "exists.png")),
        ("run", "checkpoints", lambda: check_checkpoints_present(tmp_path / "missing", [], False)),
        ("batch", "workers", lambda: ClusterOptions(workers=0).validate()),
        ("batch", "gpus_per_worker", lambda: ClusterOptions(gpus_per_worker=-1.0).validate()),
        ("batch", "address", lambda: ClusterOptions(address="bogus::").validate()),
        ("batch", "garments", lambda: collect_pairs(None, tmp_path / "people", None, "upper")),
        ("batch", "category", lambda: collect_pairs(None, tmp_path / "people", tmp_path / "people")),
        ("eval", "unpaired", lambda: EvalOptions.from_words(unpaired=True, pairs_csv=tmp_path / "p.csv")),
        ("eval", "truth", lambda: PhotoIndex(tmp_path / "missing")),
        ("eval", "people", lambda: PreservationOptions.from_words(people=tmp_path / "missing")),
        ("prepare", "split", lambda: PrepareOptions(tmp_path, tmp_path, tmp_path, split=1.0)),
        ("prepare", "pairs", lambda: viton_rows(tmp_path / "people")),
        ("train", "resume", lambda: check_resumable(saved, settings)),  # type: ignore[arg-type]
    ]


def test_the_application_layers_errors_name_their_setting_and_each_command_words_it(tmp_path: Path) -> None:
    from ootd.cli import batch, run, train
    from ootd.cli import eval as evaluate
    from ootd.cli.errors import FlagNames

    words = {"run": FlagNames.of(run.run_command), "batch": FlagNames.of(batch.batch_command),
             "eval": FlagNames.of(evaluate.eval_command), "prepare": FlagNames.of(train.prepare_command),
             "train": FlagNames.of(train.run_command)}
    assert (words["batch"]("people"), words["batch"]("garments"), words["train"]("learning_rate")) == (
        "--models", "--cloths", "--lr")  # a command's own flags, its other names for them too
    for command, setting, call in _app_cases(tmp_path):
        with pytest.raises(OotdError) as raised:
            call()
        error = raised.value
        assert error.setting == setting, (setting, str(error))
        assert not FLAG.search(COMMAND.sub("", str(error))), str(error)
        cli = worded(error, words[command])
        assert words[command](setting) in cli, (setting, cli)  # the command's words are its flags
    refused = _app_cases(tmp_path)[-1][2]
    with pytest.raises(OotdError) as raised:
        refused()
    assert worded(raised.value, words["train"]).startswith("--resume continues a run with other settings: "
                                                            "--rank 99 (now ")


def test_out_of_memory_hints_name_only_the_front_ends_own_flags() -> None:
    from ootd.app.console import oom_hint

    script = {"samples": "--sample", "resolution": "--resolution"}.get  # run/run_ootd.py's words
    assert oom_hint({"--sample", "--resolution", "--step"}, script) == "; try --resolution 384x512 or fewer --sample"
    assert oom_hint({"--samples", "--precision"}, lambda name: "--" + name.replace("_", "-")) == (
        "; try fewer --samples or --precision fp16")
    assert oom_hint(set(), script) == ""


def test_a_front_end_without_the_setting_gets_the_otherwise_words(tmp_path: Path) -> None:
    from ootd.app.tryon.loader import check_checkpoints_present
    from ootd.serve.forms import api_name

    with pytest.raises(OotdError) as raised:
        check_checkpoints_present(tmp_path / "missing", [], False)
    api = worded(raised.value, api_name)  # a request cannot choose the server's checkpoints: no remedy it lacks
    assert api.startswith("checkpoints folder ") and "ootd download --dest" in api and "pass" not in api, api


def test_an_error_keeps_its_setting_and_words_across_processes(tmp_path: Path) -> None:
    """A Ray worker's or replica's error reaches the driver pickled: it still names its setting, and the front end
    there words it as it would its own."""
    import pickle

    from ootd.cli.options import cli_name
    from ootd.serve.forms import api_name

    for setting, call in _cases(tmp_path)[:8]:
        with pytest.raises(OotdError) as raised:
            call()
        error = raised.value
        back = pickle.loads(pickle.dumps(error))
        assert (type(back), back.setting, str(back)) == (type(error), setting, str(error))
        assert worded(back, cli_name) == worded(error, cli_name) != str(error)
        assert worded(back, api_name) == worded(error, api_name)
