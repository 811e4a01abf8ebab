"""Everyday use of `ootd` through the CLI: progress and messages (plain per-pair lines, --log-file, errors above
the bars, the decode bar), the timing line and JSON, library noise, cheap checks first, exit codes, help."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ootd.cli import run as cli_run
from ootd.errors import CheckpointError
from ootd.models import build
from ootd.pipeline_types import RunInfo
from tests.helpers import REPO
from tests.helpers.cli import assert_hints_are_its_options, assert_one_line_error, invoke
from tests.helpers.fakes import FakePipe, images_tree

RUN = ["--steps", "1", "--resolution", "384x512"]


def masks_for(people: Path, example_images: dict[str, Path]) -> Path:
    """A masks folder with a two-tone mask named like each person photo."""
    import shutil

    masks = people.parent / "masks"
    masks.mkdir(exist_ok=True)
    for photo in people.iterdir():
        shutil.copy(example_images["mask"], masks / photo.name)
    return masks


def run_args(example_images: dict[str, Path], tiny_tree: Path, out: Path, mask: bool = True) -> list[object]:
    masked = ["--mask", example_images["mask"]] if mask else []
    return ["run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper", *masked,
            "--checkpoints", tiny_tree, "-o", out, "--seed", "3", *RUN]


# ---------------------------------------------------------------------------------------------- 11. exit codes


@pytest.mark.parametrize(("extra", "env", "fragments"), [
    (["--device", "gpu"], None, ("unknown device 'gpu'",)),
    ([], {"OOTD_DEVICE": "gpu"}, ("unknown device 'gpu'", "OOTD_DEVICE")),
])  # a precision the device cannot run is exit 3: tests/frontends/cli/test_edges.py
def test_device_and_precision_mistakes_are_usage_errors(models, tmp_path: Path, tiny_tree: Path, example_images,  # noqa: ANN001
                                                        monkeypatch: pytest.MonkeyPatch, extra, env, fragments) -> None:  # noqa: ANN001
    models.forbid()
    result = invoke(*run_args(example_images, tiny_tree, tmp_path / "out"), *extra, env=env)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert all(f in lines[0] for f in fragments), lines[0]
    if env is None:
        assert "OOTD_DEVICE" not in lines[0]


def test_batch_checks_the_device_once_before_any_pair(models, tmp_path: Path, tiny_tree: Path, example_images,  # noqa: ANN001
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    models.forbid()
    people, garments = images_tree(tmp_path, example_images, 2, 2)
    result = invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--masks",
                    masks_for(people, example_images),
                    "--checkpoints", tiny_tree, "-o", tmp_path / "out", *RUN, env={"OOTD_DEVICE": "gpu"})
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown device 'gpu'" in lines[0] and "OOTD_DEVICE" in lines[0]


def test_output_naming_a_file_is_a_usage_error(models, tmp_path: Path, tiny_tree: Path, example_images,  # noqa: ANN001
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    models.fake()
    afile = tmp_path / "results.png"
    afile.write_bytes(b"x")
    for command in (run_args(example_images, tiny_tree, afile),
                    ["batch", "--models", tmp_path, "--cloths", tmp_path, "-k", "upper", "-o", afile]):
        result = invoke(*command)
        assert result.exit_code == 2, result.output
        assert "is not a folder" in result.stderr and len(result.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------- 8. summary


class WarningPipe(FakePipe):
    """A pipeline whose memory planning warns on every call, as the real one does when --max-memory is tight."""

    def generate(self, person, garment, settings, progress=None, **kwargs):  # noqa: ANN001, ANN003, ANN201
        for _ in range(2):
            logging.getLogger("ootd.memory.planner").warning("estimated peak 3 GiB exceeds the memory budget 1 GiB")
        time.sleep(0.1)  # as long as the stage times FakePipe reports (0.07 s), so they fit in the total
        return super().generate(person, garment, settings, progress, **kwargs)


def test_timing_line_adds_up_plain_attention_and_json_numbers(models, tmp_path: Path, tiny_tree: Path, example_images,  # noqa: ANN001
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    models.use(WarningPipe)
    monkeypatch.setattr("ootd.app.tryon.passes.describe_pipeline",
                        lambda pipe, config: RunInfo("cpu", "fp32", "auto: sdpa > chunked > math (used: sdpa x 17)"))
    result = invoke(*run_args(example_images, tiny_tree, tmp_path / "a"), "--max-memory", "1GiB")
    assert result.exit_code == 0, result.output
    line = next(x for x in result.stdout.splitlines() if x.startswith("time: "))
    assert line.endswith("on cpu, fp32, attention sdpa"), line  # no dispatch trace
    stages = dict(re.findall(r"(\w+) ([\d.]+ m?s)", line.split("(", 1)[1]))
    for stage in ("load", "preprocess", "encode_person", "conditioning", "garment_unet", "denoise", "decode", "save"):
        assert stage in stages, (stage, line)

    def seconds(text: str) -> float:
        number, unit = text.split()
        return float(number) / (1000 if unit == "ms" else 1)

    total = seconds(re.match(r"time: ([\d.]+ m?s)", line).group(1))
    assert abs(sum(seconds(v) for v in stages.values()) - total) <= 0.001 * len(stages) + 0.05 * total
    assert result.stderr.count("exceeds the memory budget") == 1  # warned once

    as_json = invoke(*run_args(example_images, tiny_tree, tmp_path / "b"), "--json")
    settings = json.loads(as_json.stdout)["settings"]
    assert settings["steps"] == 1 and settings["seed"] == 3 and settings["model_type"] == "hd"


def test_an_outfits_time_line_has_a_single_runs_shape_and_json_timings_are_rounded(
        models, tmp_path: Path, tiny_tree: Path, example_images, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    models.use(WarningPipe)
    monkeypatch.setattr("ootd.app.tryon.passes.describe_pipeline",
                        lambda pipe, config: RunInfo("cpu", "fp32", "auto: sdpa > chunked > math (used: sdpa x 17)"))
    x = example_images
    outfit = ["run", "-m", x["person"], "-c", x["tshirt"], "-c", x["trousers"], "-k", "upper", "-k", "lower",
              "--mask", x["mask"], "--mask", x["mask"], "--checkpoints", tiny_tree, "--steps", "1",
              "--resolution", "384x512", "--seed", "3"]
    result = invoke(*outfit, "-o", tmp_path / "a")
    assert result.exit_code == 0, result.output
    line = next(x for x in result.stdout.splitlines() if x.startswith("time: "))
    assert line.endswith("on cpu, fp32, attention sdpa"), line
    stages = dict(re.findall(r"(\w+) ([\d.]+ m?s)", line.split("(", 1)[1]))
    assert {"load", "save", "denoise", "decode"} <= set(stages), line  # both models' loads in `load`
    for args in (outfit, run_args(example_images, tiny_tree, tmp_path / "c")):
        timings = json.loads(invoke(*args, "-o", tmp_path / "b", "--json", "--overwrite").stdout)["timings"]
        values = [v for value in timings.values() for v in (value if isinstance(value, list) else [value])]
        assert values and all(round(v, 4) == v for v in values), timings  # to a tenth of a millisecond


# ---------------------------------------------------------------------------------------------- 9. noise


def test_verbose_keeps_library_noise_out_unless_debug(models, tmp_path: Path, tiny_tree: Path, example_images,  # noqa: ANN001
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[bool] = []

    def noisy_load(model_type):  # noqa: ANN001, ANN202
        library = logging.getLogger("transformers.modeling_utils")
        shown.append(library.isEnabledFor(logging.WARNING))
        library.warning("\x1b[1mCLIPVisionModel LOAD REPORT\x1b[0m")
        return FakePipe(model_type)

    models.use(noisy_load)
    verbose = invoke(*run_args(example_images, tiny_tree, tmp_path / "a"), "-v")
    assert verbose.exit_code == 0 and "debug: saved" in verbose.stderr
    assert "LOAD REPORT" not in verbose.stderr and "\x1b[" not in verbose.stderr
    debug = invoke(*run_args(example_images, tiny_tree, tmp_path / "b"), "-v", "--debug")
    assert debug.exit_code == 0
    assert shown == [False, True]  # load reports only with --debug


# ---------------------------------------------------------------------------------------------- 10. cheap first


def test_no_person_is_found_before_the_diffusion_models_load(models, tmp_path: Path, tiny_tree: Path, example_images,  # noqa: ANN001
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny tree's random pose weights find nobody: that is said before any diffusion model loads."""
    models.forbid()
    result = invoke(*run_args(example_images, tiny_tree, tmp_path / "out", mask=False))
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: no person detected in {example_images['person']}")
    assert "--mask" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert_hints_are_its_options(result, ["run"])


def test_batch_stops_once_when_the_model_cannot_load(models, tmp_path: Path, tiny_tree: Path, example_images,  # noqa: ANN001
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def broken(model_type):  # noqa: ANN001, ANN202
        calls.append(model_type)
        raise CheckpointError("unet_vton (hd) weights: truncated file")

    models.use(broken)
    people, garments = images_tree(tmp_path, example_images, 2, 2)
    result = invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--masks",
                    masks_for(people, example_images),
                    "--checkpoints", tiny_tree, "-o", tmp_path / "out", *RUN)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot load the hd model" in lines[0] and "truncated" in lines[0], lines
    assert len(calls) == 1


# ---------------------------------------------------------------------------------------------- 7. progress


def test_batch_plain_lines_and_log_file_when_not_a_terminal(models, tmp_path: Path, tiny_tree: Path, example_images,  # noqa: ANN001
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    models.fake()
    people, garments = images_tree(tmp_path, example_images, 1, 2)
    log = tmp_path / "logs" / "batch.log"
    result = invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--masks",
                    masks_for(people, example_images),
                    "--checkpoints", tiny_tree, "-o", tmp_path / "out", "--log-file", log, *RUN)
    assert result.exit_code == 0, result.output
    lines = result.stderr.strip().splitlines()  # CliRunner's stderr is no terminal, as under nohup
    assert [line.split()[:2] for line in lines] == [["[1/2]", "ok"], ["[2/2]", "ok"]], lines
    assert all(" in " in line and str(tmp_path / "out") in line and ".png" in line for line in lines)
    logged = log.read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in logged] == lines  # date, time, then the same line
    quiet = invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--masks",
                    masks_for(people, example_images),
                   "--checkpoints", tiny_tree, "-o", tmp_path / "out2", "-q", *RUN)
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_batch_ends_with_the_contact_sheets_address(models, tmp_path: Path, tiny_tree: Path, example_images,  # noqa: ANN001
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The last line is index.html as a file:// address (absolute, spaces encoded), whatever the working folder."""
    from urllib.parse import unquote, urlparse

    models.fake()
    people, garments = images_tree(tmp_path, example_images, 1, 1)
    monkeypatch.chdir(tmp_path)
    args = ["batch", "--models", people, "--cloths", garments, "-k", "upper", "--masks",
            masks_for(people, example_images), "--checkpoints", tiny_tree, "-o", "my results", *RUN]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("contact sheet: file:///") and " " not in last.removeprefix("contact sheet: "), last
    address = urlparse(last.removeprefix("contact sheet: "))
    assert Path(unquote(address.path)) == tmp_path / "my results" / "index.html"
    summary = json.loads(invoke(*args, "--json").stdout)
    assert summary["index"] == address.geturl()


def test_batch_error_line_names_the_row_once(models, tmp_path: Path, tiny_tree: Path, example_images,  # noqa: ANN001
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    models.fake()
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text(f"{example_images['person']},{example_images['trousers']},lower,{example_images['mask']}\n")
    result = invoke("batch", csv_file, "--model-type", "hd", "--checkpoints", tiny_tree, "-o", tmp_path / "out",
                    *RUN)
    assert result.exit_code == 1
    error = next(line for line in result.stderr.splitlines() if line.startswith("error: "))
    assert error.count("pairs.csv line 1") == 1, error


def test_errors_print_above_live_bars_and_decode_gets_its_bar(models, tmp_path: Path, tiny_tree: Path,  # noqa: ANN001
                                                               example_images, monkeypatch: pytest.MonkeyPatch) -> None:
    """With bars on a terminal: an error line is printed by the bars' console (a line of its own above them,
    not glued to a bar), and the decode stage starts its own bar when the last step ends."""
    from ootd.cli import batch as cli_batch
    from ootd.cli import display as cli_display

    models.fake(fail_generate=CheckpointError("bad pair"), fail_on_call=2)
    monkeypatch.setattr(cli_batch, "show_progress", lambda quiet, json_out: True)
    calls: list[tuple] = []
    printed: list[str] = []
    real_call, real_print = cli_display.Display.__call__, cli_display.Display.print

    def record(self, stage, done, total):  # noqa: ANN001, ANN202
        calls.append((stage, done, total))
        return real_call(self, stage, done, total)

    def record_print(self, message):  # noqa: ANN001, ANN202
        printed.append(message)
        assert self._progress is not None  # the live bars' own console prints it
        return real_print(self, message)

    monkeypatch.setattr(cli_display.Display, "__call__", record)
    monkeypatch.setattr(cli_display.Display, "print", record_print)
    people, garments = images_tree(tmp_path, example_images, 1, 2)
    result = invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--masks",
                    masks_for(people, example_images),
                    "--checkpoints", tiny_tree, "-o", tmp_path / "out", *RUN)
    assert result.exit_code == 1
    assert len(printed) == 1 and printed[0].startswith("error: ") and "bad pair" in printed[0]
    first_denoise_end = calls.index(("denoise", 1, 1))
    assert calls[first_denoise_end + 1] == ("decode", 0, 1)


def test_display_rate_eta_and_clean_error_line() -> None:
    """The bars show a rate and an ETA; a message printed while they are live is a line of its own."""
    import io

    from rich.console import Console

    from ootd.cli.display import Display

    buffer = io.StringIO()
    display = Display(True, Console(file=buffer, force_terminal=True, width=100))
    display.__enter__()
    display("denoise", 0, 4)
    display("denoise", 2, 4)
    display.print("error: something broke")
    display._progress.refresh()
    text = buffer.getvalue()
    display.__exit__(None, None, None)
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert re.search(r"(^|[\r\n])error: something broke\n", plain), plain  # at a line start, not after a bar
    assert "step" in plain and "eta" in plain


# ---------------------------------------------------------------------------------------------- 12. help


@pytest.mark.slow
def test_help_shows_choices_no_bool_has_examples_completion_fits_80_columns() -> None:
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(REPO), "TERM": "dumb"}
    commands = [["run"], ["batch"], ["mask"], ["serve"], ["download"], ["doctor"], ["checkpoints"],
                ["checkpoints", "verify"], ["bench"]]
    for command in commands:
        shown = subprocess.run([sys.executable, "-m", "ootd", *command, "--help"], capture_output=True, text=True,
                               env=env, check=True).stdout
        assert "<bool>" not in shown, command
        assert "Example" in shown, command
        assert max(len(line) for line in shown.splitlines()) <= 80, command
    run_help = subprocess.run([sys.executable, "-m", "ootd", "run", "--help"], capture_output=True, text=True,
                              env={**env, "COLUMNS": "120"}, check=True).stdout  # at 80 a long metavar folds
    for choice in ("[pad|crop|stretch]", "[upper|lower|dress|auto]", "[hd|dc]"):
        assert choice in run_help
    top = subprocess.run([sys.executable, "-m", "ootd", "--help"], capture_output=True, text=True, env=env).stdout
    assert "--install-completion" in top


# ---------------------------------------------------------------------------------------------- 15. scripts


def test_multi_gpu_passes_category_masks_and_device(tmp_path: Path) -> None:
    env = {**os.environ, "DRY_RUN": "1", "OOTD": "ootd", "GPUS": "0,1", "GPU_VAR": "CUDA_VISIBLE_DEVICES",
           "CATEGORY": "lower", "MASKS": "masks", "DEVICE": "cuda:0", "OUT": str(tmp_path / "o")}
    csv_mode = subprocess.run(["bash", str(REPO / "scripts" / "multi_gpu.sh"), "pairs.csv"], env=env,
                              capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(csv_mode) == 2 and all("--category lower" in line and "--masks masks" in line for line in csv_mode)
    (tmp_path / "people").mkdir()
    (tmp_path / "garments").mkdir()
    folders = subprocess.run(["bash", str(REPO / "scripts" / "multi_gpu.sh"), str(tmp_path / "people"),
                              str(tmp_path / "garments")], env={**env, "DEVICE": "cuda:1"},
                             capture_output=True, text=True, check=True).stdout.splitlines()
    assert all(f"--models {tmp_path / 'people'}" in line and "--device cuda:1" in line for line in folders)
    assert not any("--quiet" in line for line in folders)  # the shard logs get one line per pair


def test_run_reports_decode_after_denoise(models, tmp_path: Path, tiny_tree: Path, example_images,  # noqa: ANN001
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    models.fake()
    calls: list[tuple] = []

    class Recorder:
        def __init__(self, enabled: bool) -> None:
            self.enabled = enabled

        def __enter__(self):  # noqa: ANN204
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def __call__(self, stage: str, done: int, total: int) -> None:
            calls.append((stage, done, total))

        def print(self, message: str) -> None:
            pass

    monkeypatch.setattr(cli_run, "Display", Recorder)
    result = invoke(*run_args(example_images, tiny_tree, tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert calls[calls.index(("denoise", 1, 1)) + 1] == ("decode", 0, 1)


# ---------------------------------------------------------------------------------------------- 13. checkpoints


def test_checkpoints_in_the_per_user_folder_work_from_any_folder(tmp_path: Path, tiny_tree: Path, example_images,  # noqa: ANN001
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    if sys.platform in ("win32", "darwin"):
        pytest.skip("the XDG data folder is the Linux per-user location")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("OOTD_CHECKPOINTS", raising=False)
    user = tmp_path / "data" / "ootd" / "checkpoints"
    user.parent.mkdir(parents=True)
    user.symlink_to(tiny_tree, target_is_directory=True)
    elsewhere = tmp_path / "somewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no ./checkpoints here
    verify = invoke("checkpoints", "verify", "--quick", "--json")
    assert verify.exit_code == 0, verify.output
    assert json.loads(verify.stdout)["root"] == str(user)
    seen = []  # what the model owner hands to the real loading: its own arguments are the subject here
    monkeypatch.setattr(build, "read_components", lambda root, model_type, precision, progress: seen.append(root))
    monkeypatch.setattr(build, "build_pipeline", lambda components, model_type, runtime, **_: components()
                        or FakePipe(model_type))
    result = invoke("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper", "--mask",
                    example_images["mask"], "-o", tmp_path / "out", *RUN)
    assert result.exit_code == 0, result.output
    assert seen == [user]


def test_download_reports_size_checks_disk_and_leaves_nothing_empty(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import huggingface_hub

    from ootd.weights import download

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    files = [SimpleNamespace(rfilename="checkpoints/ootd/vae/diffusion_pytorch_model.bin", size=3 * 2**30),
             SimpleNamespace(rfilename="checkpoints/ootd/ootd_dc/checkpoint-36000/unet_vton/x.safetensors",
                             size=9 * 2**30)]  # the other model type: not counted for --models hd
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda self, repo, **kw: SimpleNamespace(siblings=files))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("downloaded"))
    monkeypatch.setattr(download.shutil, "disk_usage", lambda path: SimpleNamespace(free=2**30, total=2**31, used=0))
    dest = tmp_path / "new" / "checkpoints"
    result = invoke("download", "--dest", dest, "--models", "hd")
    assert result.exit_code == 1
    assert "levihsu/OOTDiffusion: 3.00 GiB to fetch" in result.stderr and "1.00 GiB free" in result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: not enough free disk space") and "3.00 GiB" in error
    assert not dest.exists()


def test_download_offline_is_short_and_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    dest = tmp_path / "ck"
    result = invoke("download", "--dest", dest, "--models", "hd")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "offline" in lines[0] and len(lines[0]) < 250 + len(str(dest)), lines
    assert not dest.exists()
    listed = invoke("download", "--dest", dest, "--models", "hd", "--list")
    assert listed.exit_code == 0 and not dest.exists()
    assert f"https://huggingface.co/levihsu/OOTDiffusion/resolve/main/checkpoints/ootd/vae/diffusion_pytorch_model.bin -> {dest / 'ootd' / 'vae' / 'diffusion_pytorch_model.bin'}" in listed.stdout  # noqa: E501


# ---------------------------------------------------------------------------------------------- 15. bench, plan


def test_bench_matrix_honours_precision_and_attention_and_prints_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from ootd.tools.bench import matrix

    result = invoke("bench", "--random-weights", "tiny", "--matrix", "--precision", "fp32", "--attention", "sdpa",
                    "--device", "cpu", "--resolution", "384x512", "-n", "1", "--steps", "1", "-q")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].split() == ["precision", "attention", "options", "s/it", "call", "s", "peak", "GiB", "estimate",
                                "GiB"]
    assert len(lines) == 2 and lines[1].split()[:3] == ["fp32", "sdpa", "-"], lines

    asked = {}
    monkeypatch.setattr(matrix, "run_matrix", lambda config, **kw: asked.update(kw) or {"runs": [], "skipped": []})
    assert invoke("bench", "--random-weights", "tiny", "--matrix", "-q").exit_code == 0
    assert set(asked["dtypes"]) == {"fp32", "fp16", "bf16"}
    assert set(asked["attentions"]) == {"flash", "sdpa", "chunked", "math"}  # every backend, not a subset


def test_run_json_includes_the_memory_plan(tmp_path: Path, tiny_tree: Path, example_images, use_tiny_hd) -> None:  # noqa: ANN001
    result = invoke(*run_args(example_images, tiny_tree, tmp_path / "out"), "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert plan and plan["estimate"]["peak"] > 0


@pytest.fixture
def use_tiny_hd(models, pipe_hd):  # noqa: ANN001, ANN201
    models.use(pipe_hd)
    return pipe_hd


# ---------------------------------------------------------------------------------------------- 14. released?


def test_verify_and_doctor_say_a_tiny_tree_is_not_the_released_one(tiny_tree: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    table = invoke("checkpoints", "verify", tiny_tree, "--quick")
    assert table.exit_code == 0, table.output  # a warning, not a failure: tests run on such trees
    last = table.stdout.strip().splitlines()[-1]
    assert "not the released OOTDiffusion models" in last and "text_encoder hidden_size 32" in last
    as_json = json.loads(invoke("checkpoints", "verify", tiny_tree, "--json").stdout)
    assert as_json["ok"] is True and as_json["released"] is False
    assert any(d.startswith("unet_garm (hd) block_out_channels") for d in as_json["architecture"])

    from ootd.hardware import device

    monkeypatch.setattr(device, "_cpu_info", lambda: device.DeviceInfo(type="cpu", total_memory=8 << 30,
                                                                       free_memory=6 << 30))
    doctor = invoke("doctor", "--checkpoints", tiny_tree, "--no-kernels", "--quick", "--json")
    assert doctor.exit_code == 0, doctor.output
    report = json.loads(doctor.stdout)
    items = {(i["section"], i["item"]): i for i in report["items"]}
    assert items[("checkpoints", "architecture")]["status"] == "warn" and report["released"] is False
    ram = items[("memory", "RAM")]  # this CPU machine, 6 GiB free: short of a 768x1024 try-on
    assert ram["status"] == "warn" and "needs about" in ram["detail"] and "384x512" in ram["fix"]
    plain = invoke("doctor", "--checkpoints", tiny_tree, "--no-kernels", "--quick")
    assert "try-ons can run, but not with the released models" in plain.stdout


def test_released_dimensions_and_parameter_counts_pass(tmp_path: Path, tiny_tree: Path) -> None:
    """A tree whose configs carry the released dimensions is recognised; a parameter count that differs is not."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from ootd.weights.architecture import compare_to_released, safetensors_params
    from ootd.weights.released import RELEASED_UNET_CONFIG, RELEASED_VAE_CONFIG

    root = tmp_path / "ck"
    shutil.copytree(tiny_tree, root)
    for weights in root.rglob("*"):
        if weights.suffix in (".safetensors", ".bin"):
            weights.unlink()

    def edit(path: Path, **values: object) -> None:
        config = json.loads(path.read_text())
        config.update(values)
        path.write_text(json.dumps(config))

    unet = {k: list(RELEASED_UNET_CONFIG[k]) if isinstance(RELEASED_UNET_CONFIG[k], tuple) else RELEASED_UNET_CONFIG[k]
            for k in ("block_out_channels", "layers_per_block", "cross_attention_dim")}
    for model in ("hd", "dc"):
        base = root / "ootd" / f"ootd_{model}" / "checkpoint-36000"
        edit(base / "unet_garm" / "config.json", **unet, in_channels=4)
        edit(base / "unet_vton" / "config.json", **unet, in_channels=8)
    edit(root / "ootd" / "vae" / "config.json", block_out_channels=list(RELEASED_VAE_CONFIG["block_out_channels"]),
         latent_channels=4, layers_per_block=2)
    edit(root / "ootd" / "text_encoder" / "config.json", hidden_size=768, num_hidden_layers=12, intermediate_size=3072)
    clip = json.loads((root / "clip-vit-large-patch14" / "config.json").read_text())
    clip.setdefault("vision_config", {}).update(hidden_size=1024, num_hidden_layers=24)
    clip["projection_dim"] = 768
    (root / "clip-vit-large-patch14" / "config.json").write_text(json.dumps(clip))
    assert compare_to_released(root) == []

    weights = root / "ootd" / "ootd_hd" / "checkpoint-36000" / "unet_garm" / "diffusion_pytorch_model.safetensors"
    save_file({"a": torch.zeros(3, 5), "b": torch.zeros(7)}, str(weights))
    assert safetensors_params(weights) == 22
    diffs = compare_to_released(root, ["hd"])
    assert [(d.component, d.what, d.found) for d in diffs] == [("unet_garm (hd)", "parameters", 22)]


def test_an_empty_folder_lists_the_released_file_names(tmp_path: Path) -> None:
    result = invoke("checkpoints", "verify", tmp_path, "--models", "hd", "--json")
    assert result.exit_code == 1
    paths = {f["component"]: f["path"] for f in json.loads(result.stdout)["files"]}
    assert paths["text_encoder weights"].endswith("text_encoder/pytorch_model.bin")
    assert paths["vae weights"].endswith("vae/diffusion_pytorch_model.bin")
    assert paths["unet_vton (hd) weights"].endswith("unet_vton/diffusion_pytorch_model.safetensors")
    assert paths["CLIP image encoder weights"].endswith("clip-vit-large-patch14/model.safetensors")


def test_loading_reports_progress_per_component(tmp_path: Path, tiny_tree: Path, example_images,  # noqa: ANN001
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """At a terminal the loading bar moves per component (the real loader on the tiny tree)."""
    import torch

    from ootd.weights.loading import load_components

    ticks: list[tuple] = []
    dtypes = dict.fromkeys(("unet", "vae", "text_encoder", "image_encoder"), torch.float32)
    load_components(tiny_tree, "hd", dtypes, progress=lambda *tick: ticks.append(tick))
    assert ticks == [("load", k, 8) for k in range(1, 9)]

    handed: list[object] = []  # what the owner hands to the real loading: its own arguments are the subject here
    monkeypatch.setattr(cli_run, "show_progress", lambda quiet, json_out: True)
    monkeypatch.setattr(build, "read_components",
                        lambda root, model_type, precision, progress: handed.append(progress))
    monkeypatch.setattr(build, "build_pipeline", lambda components, model_type, runtime, **_: components()
                        or FakePipe(model_type))
    result = invoke(*run_args(example_images, tiny_tree, tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert handed and callable(handed[0])  # the display itself


def test_a_missing_checkpoint_is_named_as_given_by_every_command(tmp_path: Path, example_images,  # noqa: ANN001
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`--checkpoints relck` (relative, empty): classify, run (--category auto too) and mask name the folder as
    the user gave it, not one of them an absolute path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "relck").mkdir()
    (tmp_path / "garments").mkdir()
    (tmp_path / "garments" / "g.png").write_bytes(example_images["tshirt"].read_bytes())
    person, cloth, mask = example_images["person"], example_images["tshirt"], example_images["mask"]
    commands = {
        "classify": ["classify", "garments", "--checkpoints", "relck"],
        "run": ["run", "--model", person, "--cloth", cloth, "-k", "upper", "--checkpoints", "relck", "-o", "o1"],
        "run auto": ["run", "--model", person, "--cloth", cloth, "-k", "auto", "--mask", mask, "--checkpoints",
                     "relck", "-o", "o2"],
        "mask": ["mask", "--model", person, "-k", "upper", "--checkpoints", "relck", "-o", "o3"],
    }
    for name, args in commands.items():
        line = assert_one_line_error(invoke(*args), 1, " relck/", "--dest relck")
        assert str(tmp_path) not in line, (name, line)
