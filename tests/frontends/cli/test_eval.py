"""`ootd eval` and `ootd batch --truth` as a user runs them: the table, --json, a batch folder's files, and every
failure as one line with its exit code and nothing written. The networks are the stand-ins of
tests/helpers/evaluation.py (declared in the output), except in the tests marked eval_stack, which run the eval
extra's real networks, randomly initialised (scripts/test_eval_stack.sh)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from ootd.evaluation import weights as eval_weights
from ootd.evaluation.weights import WeightsFile
from tests.helpers.cli import assert_one_line_error, invoke
from tests.helpers.evaluation import (
    STAND_IN,
    batch_folder,
    blurred,
    noise_image,
    require_eval_stack,
    stand_ins,
    write_photos,
)
from tests.helpers.fakes import images_tree

RUN = ["--steps", "1", "--resolution", "384x512"]


def folders(tmp_path: Path, count: int = 4, size: tuple[int, int] = (48, 64)) -> tuple[Path, Path]:
    photos = write_photos(tmp_path / "photos", [f"p{i}.png" for i in range(count)], size)
    results = tmp_path / "results"
    results.mkdir()
    for i, (name, image) in enumerate(photos.items()):
        blurred(image, i).save(results / name)
    return results, tmp_path / "photos"


def test_the_table_and_json(tmp_path: Path) -> None:
    results, photos = folders(tmp_path)
    noise_image(5).save(results / "extra.png")
    with stand_ins():
        shown = invoke("eval", results, "--truth", photos)
        data = json.loads(invoke("eval", results, "--truth", photos, "--json").stdout)
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    for fragment in ("evaluated 4 pairs", "at 48x64", "SSIM", "LPIPS", "FID", "KID", "±", "skipped 1",
                     "no photo named extra.png", f"warning: {STAND_IN}"):
        assert fragment in text, text
    assert data["pairs"] == 4 and data["stand_in"] == STAND_IN and data["written"] == []
    assert {"ssim", "lpips", "fid", "kid", "kid_std", "skipped", "worst_first"} <= data.keys()
    assert not (results / "eval.json").exists()  # not a batch folder: nothing written


def test_a_batch_folder_gets_its_files(tmp_path: Path) -> None:
    out, photos = batch_folder(tmp_path)
    with stand_ins():
        result = invoke("eval", out, "--truth", photos)
    assert result.exit_code == 0, result.output
    assert "matched 2 by batch report" in result.stdout and "written: " in result.stdout
    assert (out / "eval.json").is_file() and (out / "eval.html").is_file()


def this_torch_pins() -> tuple[str, str]:
    """torch pinned as installed here (its build label too) and the torchvision made for it, as pip's words."""
    from importlib.metadata import version

    from ootd.hardware.torch_builds import torchvision_for

    torch = version("torch")  # pip's view: PyPI's wheel has no label there, whatever torch.__version__ says
    label = f"+{torch.split('+')[1]}" if "+" in torch else ""
    return f"torch=={torch}", f"torchvision=={torchvision_for(torch)}{label}"


def test_without_the_eval_extra_ssim_and_the_command_for_this_torch(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The default install (no eval extra): SSIM, which needs no network, on every pair; for LPIPS, FID and KID
    one line with the exact command that installs them beside this torch (pinned as it is, its torchvision
    from the index it came from); the batch folder's files written with what was computed."""
    out, photos = batch_folder(tmp_path)
    monkeypatch.setitem(sys.modules, "lpips", None)  # as where it is not installed
    result = invoke("eval", out, "--truth", photos)
    assert result.exit_code == 0, result.output
    assert "evaluated 2 pairs" in result.stdout and re.search(r"SSIM   0\.\d{4}", result.stdout)
    assert "LPIPS  not computed (below)" in result.stdout and "FID, KID: not computed (below)" in result.stdout
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("not computed: LPIPS, FID and KID")]
    command = line.split(": ", 2)[-1].split("): ", 1)[1]
    assert command.startswith("python -m pip install ") and "[eval]" in command
    for pin in this_torch_pins():
        assert pin in command.split(), (pin, command)
    data = json.loads((out / "eval.json").read_text())
    assert data["lpips"] is None and data["fid"] is None and data["ssim"] > 0 and command in data["not_computed"]
    assert sorted(p.name for p in out.iterdir()) == ["batch_report.jsonl", "eval.html", "eval.json", "r0.png",
                                                      "r1.png"]
    unpaired = invoke("eval", out, "--truth", photos, "--unpaired")  # FID and KID are all it computes
    assert_one_line_error(unpaired, 3, "--unpaired computes FID and KID only", command)


def test_eval_on_the_core_install_alone(tmp_path: Path) -> None:
    """A process where none of the eval extra's packages (nor eval-math's torchmetrics) can be imported, as after
    `pip install -e .`: SSIM on every pair, the rest named with its command, exit 0."""
    import subprocess

    from tests.helpers import REPO

    results, photos = folders(tmp_path)
    code = ("import sys\n"
            "for name in ('torchmetrics', 'lpips', 'torch_fidelity', 'torchvision'): sys.modules[name] = None\n"
            "from ootd.cli import main\n"
            f"main(['eval', {str(results)!r}, '--truth', {str(photos)!r}])\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "evaluated 4 pairs" in done.stdout and re.search(r"SSIM   0\.\d{4}", done.stdout)
    assert "not computed: LPIPS, FID and KID: they need the eval extra" in done.stdout
    assert this_torch_pins()[0] in done.stdout and "internal error" not in done.stderr


def test_missing_weights_one_line_exit_1_nothing_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The published weights absent and not to be had (an address that leads nowhere): one line naming them,
    where they go and `ootd download --eval`; no number from other weights."""
    out, photos = batch_folder(tmp_path)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr("ootd.evaluation.networks.stack_problem", lambda: None)
    gone = WeightsFile("InceptionV3 FID weights", (tmp_path / "offline" / "weights-inception-6726825d.pth").as_uri())
    monkeypatch.setattr(eval_weights, "standard_weights", lambda: (gone,))
    result = invoke("eval", out, "--truth", photos)
    assert_one_line_error(result, 1, "weights-inception-6726825d.pth", "ootd download --eval",
                          str(tmp_path / "torch" / "hub" / "checkpoints"))
    assert sorted(p.name for p in out.iterdir()) == ["batch_report.jsonl", "r0.png", "r1.png"]


def test_a_missing_file_named_by_pairs_is_listed_not_a_traceback(tmp_path: Path) -> None:
    results, photos = folders(tmp_path)
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("p0.png,p0.png\np1.png,p1.png\ngone.png,p2.png\np3.png,nobody.png\n")
    with stand_ins():
        result = invoke("eval", results, "--truth", photos, "--pairs", pairs)
    assert result.exit_code == 0, result.output
    assert "evaluated 2 pairs" in result.stdout and "skipped 2" in result.stdout
    assert "gone.png: result: file not found" in result.stdout and "nobody.png: file not found" in result.stdout


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    results, photos = folders(tmp_path)
    with stand_ins():
        assert_one_line_error(invoke("eval", results, "--truth", tmp_path / "none"), 2, "not found")
        assert_one_line_error(invoke("eval", results, "--truth", photos, "--weights", "other"), 2,
                              "unknown metric weights 'other'")
        assert_one_line_error(invoke("eval", results, "--truth", photos, "--unpaired", "--pairs", photos / "x"), 2,
                              "--unpaired")
        (tmp_path / "lone").mkdir()
        noise_image(1).save(tmp_path / "lone" / "zed.png")
        assert_one_line_error(invoke("eval", tmp_path / "lone", "--truth", photos), 1, "nothing to evaluate",
                              "zed.png")


def test_batch_with_truth_adds_the_metrics(models, tmp_path: Path, tiny_tree: Path, example_images) -> None:  # noqa: ANN001
    models.fake()
    people, garments = images_tree(tmp_path, example_images, 2, 1)
    masks = tmp_path / "masks"
    masks.mkdir()
    for photo in people.iterdir():
        (masks / photo.name).write_bytes(example_images["mask"].read_bytes())
    out = tmp_path / "out"
    args = ["batch", "--models", people, "--cloths", garments, "-k", "upper", "--masks", masks,
            "--checkpoints", tiny_tree, "-o", out, *RUN, "--truth", people]
    with stand_ins():
        result = invoke(*args)
        again = invoke(*args, "--json")  # resumed: nothing to run, the metrics again
    assert result.exit_code == 0, result.output
    assert "evaluated 2 pairs" in result.stdout and "matched 2 by batch report" in result.stdout
    assert STAND_IN in result.stdout
    data = json.loads(again.stdout)
    assert data["evaluation"]["pairs"] == 2 and data["evaluation"]["stand_in"] == STAND_IN
    index = (out / "index.html").read_text()
    assert "Against the real photos" in index and 'href="eval.html"' in index
    assert json.loads((out / "eval.json").read_text())["pairs"] == 2


def test_batch_with_truth_without_the_extra_gives_ssim_and_a_missing_truth_stops_first(
        models, tmp_path: Path, tiny_tree: Path, example_images, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    models.fake()
    people, garments = images_tree(tmp_path, example_images, 1, 1)
    masks = tmp_path / "masks"
    masks.mkdir()
    for photo in people.iterdir():
        (masks / photo.name).write_bytes(example_images["mask"].read_bytes())
    monkeypatch.setitem(sys.modules, "torch_fidelity", None)
    out = tmp_path / "out"
    result = invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--masks", masks,
                    "--checkpoints", tiny_tree, "-o", out, *RUN, "--truth", people)
    assert result.exit_code == 0, result.output
    assert "evaluated 1 pairs" in result.stdout and "SSIM" in result.stdout
    assert "not computed: LPIPS, FID and KID" in result.stdout and this_torch_pins()[0] in result.stdout
    made = models.fake()
    missing = invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--checkpoints", tiny_tree,
                     "-o", tmp_path / "out2", *RUN, "--truth", tmp_path / "nowhere")
    assert_one_line_error(missing, 2, "--truth folder", "not found")
    assert made == {} and not (tmp_path / "out2").exists()


def test_batch_with_truth_and_missing_weights_stops_before_any_pair(models, tmp_path: Path,  # noqa: ANN001
                                                                    tiny_tree: Path, example_images,  # noqa: ANN001
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The seam of test_missing_weights_one_line_exit_1_nothing_written: the published weights absent and not to
    be had. The batch says so in one line before any model loads or any pair runs, and writes nothing."""
    made = models.fake()
    people, garments = images_tree(tmp_path, example_images, 1, 1)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr("ootd.evaluation.networks.stack_problem", lambda: None)
    gone = WeightsFile("InceptionV3 FID weights", (tmp_path / "offline" / "weights-inception-6726825d.pth").as_uri())
    monkeypatch.setattr(eval_weights, "standard_weights", lambda: (gone,))
    out = tmp_path / "out"
    result = invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--checkpoints", tiny_tree,
                    "-o", out, *RUN, "--truth", people)
    assert_one_line_error(result, 1, "weights-inception-6726825d.pth", "ootd download --eval",
                          str(tmp_path / "torch" / "hub" / "checkpoints"))
    assert made == {} and not out.exists()


# ---------------------------------------------------------------------------------------------- the real stack


@pytest.mark.eval_stack
def test_the_real_networks_randomly_initialised_end_to_end(tmp_path: Path) -> None:
    """torch-fidelity's InceptionV3 and lpips's AlexNet, randomly initialised (`--weights random`): the command
    runs, says so, and identical images give SSIM 1 and LPIPS 0."""
    require_eval_stack()
    photos = write_photos(tmp_path / "photos", [f"p{i}.png" for i in range(3)], (96, 128))
    same = tmp_path / "same"
    same.mkdir()
    for name, image in photos.items():
        image.save(same / name)
    result = invoke("eval", same, "--truth", tmp_path / "photos", "--weights", "random", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ssim"] == pytest.approx(1.0, abs=1e-6) and data["lpips"] == pytest.approx(0.0, abs=1e-6)
    assert data["fid"] == pytest.approx(0.0, abs=1e-3) and "randomly initialised" in data["stand_in"]
    assert data["networks"] == ["InceptionV3 pool features, 2048 (torch-fidelity)", "LPIPS v0.1, AlexNet (lpips)"]


@pytest.mark.eval_stack
def test_download_eval_fetches_the_packages_addresses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_eval_stack()
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    fetched = []
    monkeypatch.setattr(eval_weights, "_download", lambda url, path, prefix: fetched.append((url, prefix)) or
                        Path(path).write_bytes(b"w"))
    result = invoke("download", "--eval")
    assert result.exit_code == 0, result.output
    assert [url.rsplit("/", 1)[-1] for url, _ in fetched] == ["weights-inception-2015-12-05-6726825d.pth",
                                                               "alexnet-owt-7be5be79.pth"]
    assert fetched[1][1] == "7be5be79" and "2 file(s) fetched now" in result.stdout
    assert "0 file(s) fetched now" in invoke("download", "--eval").stdout
