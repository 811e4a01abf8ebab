"""Benchmark: the report of a tiny run, the original formulation, FLOP counting, the CLI and GPU scripts."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ootd.app.tryon.config import RunConfig, build_config
from ootd.errors import UsageError
from ootd.settings import parse_resolution
from ootd.tools.bench.architectures import TINY
from ootd.tools.bench.drivers import BenchOptions, run_bench
from ootd.tools.bench.flops import count_step_flops
from ootd.tools.bench.matrix import run_matrix
from ootd.tools.bench.profiling import PeakMemory
from ootd.tools.bench.reference import original_formulation
from tests.helpers import REPO


def bench_config(**words: object) -> RunConfig:
    """A one-sample, one-step 384x512 benchmark configuration on the CPU (seed 0), built as `ootd bench` builds it."""
    given = {"device": "cpu", "resolution": "384x512", "samples": 1, "steps": 1, "seed": 0, "attention": "sdpa",
             **words}
    return build_config(checkpoints=Path("."), **given)


@pytest.fixture(scope="module")
def report() -> dict:
    return run_bench(bench_config(), random_weights="tiny",
                     options=BenchOptions(compare_original=True, count_flops=True, flops_samples=4,
                                          flops_resolution=parse_resolution("384x512")))


def test_report_is_well_formed(report: dict) -> None:
    for key in ("machine", "versions", "config", "load_seconds", "plan", "plan_text", "ours", "original", "ratio",
                "memory", "flops", "images_max_abs_diff"):
        assert key in report, key
    json.dumps(report, default=str)
    for label in ("ours", "original"):
        run = report[label]
        for stage in ("conditioning", "encode", "garment_unet", "denoise", "decode", "total", "wall", "s_per_it"):
            assert run[stage] > 0, (label, stage)
        assert len(run["steps"]) == 1 and all(s > 0 for s in run["steps"])
        assert run["cpu"] > 0 and len(run["stages"]["cpu"]["denoise"]) == 1
        assert run["peak_memory"] > 0
    assert report["load_seconds"] > 0
    assert all(report["ratio"][k] > 0 for k in ("step", "call", "step_cpu", "call_cpu"))
    mem = report["memory"]
    assert mem["estimated_peak"] == report["plan"]["estimate"]["peak"] and mem["measured_peak"] > 0
    assert set(mem["stages"]) == {"conditioning", "encode", "garment_unet", "denoise", "decode"}
    assert report["plan"]["fits"]


def test_original_formulation_gives_the_same_pictures(report: dict) -> None:
    """Person queries against [person; garment] keys (ours) = full 2N attention keeping N (the original)."""
    assert report["images_max_abs_diff"] < 2e-2


def test_flops_ours_fewer(report: dict) -> None:
    flops = report["flops"]
    assert 0 < flops["ours_step"] < flops["original_step"]
    # garment UNet: ours on [garment, zeros], stopping after its last captured block, with folded
    # cross-attention; the original on 2 x 4 samples, all of it
    assert 0.5 * flops["original_garment_unet"] < 4 * flops["ours_garment_unet"] < flops["original_garment_unet"]
    assert flops["ratio_step"] == pytest.approx(flops["original_step"] / flops["ours_step"])


def test_flops_of_the_released_architecture_on_meta() -> None:
    """The figures the issue quotes: about 33.8 vs 52.7 TFLOP per step (4 samples, 768x1024, guidance); ours is
    33.2 with cross-attention folded into its projections (0.6 TFLOP of query and output projections less)."""
    flops = count_step_flops(num_samples=4, resolution=(768, 1024))
    assert flops["ours_step"] / 1e12 == pytest.approx(33.23, abs=0.02)
    assert flops["original_step"] / 1e12 == pytest.approx(52.69, abs=0.02)
    assert flops["by_op"]["ours_step"]["convolution"] == flops["by_op"]["original_step"]["convolution"]
    # garment UNet at batch 2: the original's full run 6.25 TFLOP; ours stops early and folds
    assert flops["original_garment_unet"] / 4 / 1e12 == pytest.approx(6.25, abs=0.01)
    assert flops["ours_garment_unet"] / 1e12 == pytest.approx(5.63, abs=0.01)


def test_original_formulation_restores_the_unet() -> None:
    from diffusers import UNet2DConditionModel

    from ootd.method.fusion import TryOnFusion, transformer_blocks

    unet = UNet2DConditionModel(in_channels=8, **TINY.unet)
    TryOnFusion(unet)
    before = {k: type(v) for k, v in unet.attn_processors.items()}
    blocks = transformer_blocks(unet)
    with original_formulation(unet, {name: torch.zeros(1, 4, 32) for name in blocks}):
        assert all("forward" in vars(b) for b in blocks.values())
    assert {k: type(v) for k, v in unet.attn_processors.items()} == before
    assert not any("forward" in vars(b) for b in blocks.values())


def test_peak_memory_meter() -> None:
    meter = PeakMemory(torch.device("cpu"))
    meter.reset()
    big = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB
    assert meter.read() >= 64 << 20
    del big
    assert meter.current() > 0


def test_matrix_skips_what_cannot_run() -> None:
    out = run_matrix(bench_config(), random_weights="tiny", dtypes=("fp32", "fp16"), attentions=("flash", "chunked"),
                     original=False, count_flops=False, warmup=False)
    assert [(r["dtype"], r["attention"]) for r in out["runs"]] == [("fp32", "chunked")]
    run = out["runs"][0]
    assert run["ours"]["s_per_it"] > 0 and "original" not in run
    assert run["memory"]["estimated_peak"] > 0
    reasons = {(s["dtype"], s.get("attention")) for s in out["skipped"]}
    assert ("fp32", "flash") in reasons and ("fp16", None) in reasons  # no flash-attn, no fp16 on CPU


def test_matrix_speed_variants_rerun_the_first_backend() -> None:
    out = run_matrix(bench_config(), random_weights="tiny", dtypes=("fp32",),
                     attentions=("flash", "chunked", "sdpa"), original=False, count_flops=False, warmup=False,
                     speed_variants=("channels_last",))
    runs = [(r["attention"], r["channels_last"], r["compile"]) for r in out["runs"]]
    assert runs == [("chunked", False, False), ("sdpa", False, False), ("chunked", True, False)]
    with pytest.raises(UsageError, match="unknown speed variants"):
        run_matrix(bench_config(), random_weights="tiny", speed_variants=("turbo",))


def test_cli_plan_only_json(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("bench_pipeline", REPO / "scripts" / "bench_pipeline.py")
    assert spec is not None and spec.loader is not None
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main(["--plan-only", "--device", "cpu", "--samples", "4", "--max-memory-gib", "12", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["budget_bytes"] == 12 * 2**30 and plan["request"]["num_samples"] == 4
    assert plan["fits"] and plan["offload"] == "none"


def test_gpu_check_script_is_valid_bash() -> None:
    script = REPO / "scripts" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "pip install" not in text and "--matrix" in text


def test_speed_options_apply_to_ours_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """--channels-last changes ours; the original formulation still runs in the default layout, eagerly."""
    from ootd.tools.bench import reference

    layouts: list[bool] = []
    stock: list[bool] = []
    real = reference._OriginalRun.__call__

    seen: list = []

    def spy(run, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        components = run.c
        conv = components.unet_vton.conv_in.weight
        layouts.append(conv.is_contiguous() and components.unet_vton._compiled_call_impl is None)
        # stock processors (no folded cross-attention) on the garment UNet and the VAE, as the original
        processors = [*components.unet_garm.attn_processors.values(), *components.vae.attn_processors.values()]
        stock.append(all(type(p).__name__ == "AttnProcessor2_0" for p in processors))
        seen.append(components)
        return real(run, *args, **kwargs)

    monkeypatch.setattr(reference._OriginalRun, "__call__", spy)
    out = run_bench(bench_config(channels_last=True), random_weights="tiny",
                    options=BenchOptions(compare_original=True, step_repeats=1))
    assert out["config"]["channels_last"] is True and out["config"]["compile"] is False
    assert layouts == [True] and stock == [True]
    # ours keeps its own processors afterwards
    assert all(type(p).__name__ == "AttentionProcessor" for p in seen[0].unet_garm.attn_processors.values())
    assert out["steps_compare"]["max_abs_diff"] < 1e-3
    assert out["images_max_abs_diff"] < 2e-2


@pytest.mark.slow
def test_speed_options_script_on_tiny_weights() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_speed_options.py"), "--random-weights", "tiny",
                           "--resolution", "384x512", "--samples", "1", "--repeats", "1", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out["variants"]) == {"default", "channels_last"}
    assert all(v["median_wall"] > 0 for v in out["variants"].values())
    assert out["variants"]["channels_last"]["max_abs_diff_vs_first"] < 1e-3
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_speed_options.py"), "--variants", "turbo"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bad.returncode == 2 and "variants must be among" in bad.stderr


@pytest.mark.slow
def test_speed_modes_script_on_tiny_weights(tmp_path: Path) -> None:
    out, scratch = tmp_path / "modes.json", tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_speed_modes.py"), "--kind", "tiny",
                           "--resolution", "384x512", "--samples", "1", "--steps", "3", "--extrapolate", "20",
                           "--modes", "exact-fp32,exact-fp32,fast-fp32,tome0.5-fp32@2", "--original-steps", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "TMPDIR": str(scratch)})
    assert proc.returncode == 0, proc.stderr
    assert not [p for p in scratch.iterdir() if p.name.startswith("ootd-")]  # its pictures went with it
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"]["name"] for r in rows] == ["exact-fp32", "exact-fp32", "fast-fp32", "tome0.5-fp32@2"]
    assert rows[1]["diff_from_first"]["max_pixel"] == 0  # the same mode twice: the same images
    assert rows[2]["diff_from_first"]["max_pixel"] > 0 and rows[3]["diff_from_first"] is None
    assert rows[2]["mode"]["cache_interval"] == 3 and rows[2]["mode"]["token_merge"] == 0.5
    assert rows[0]["original"]["steps"] and all(r["whole_20"] > 0 for r in rows)
    assert "| original formulation fp32 |" in proc.stdout
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_speed_modes.py"), "--modes", "turbo-fp32"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bad.returncode != 0 and "bad mode 'turbo-fp32'" in bad.stderr and "Traceback" not in bad.stderr


def test_vae_script_attention_and_bad_input(tmp_path: Path) -> None:
    script = str(REPO / "scripts" / "bench_vae.py")
    proc = subprocess.run([sys.executable, script, "attention", "--resolution", "64x64", "--repeats", "1"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert [line.split(":")[0] for line in proc.stdout.splitlines()] == [
        f"attention 64 tokens, one head of 512, {k}" for k in ("default", "flash", "math")]
    bad = subprocess.run([sys.executable, script, "time", "--weights", str(tmp_path)], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and "no weights in" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_weights_mmap_script_on_a_tiny_unet() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_weights_mmap.py"), "--tiny", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"before", "loaded", "start_up", "all_read", "channels_last", "weights_mib"}
    assert 0 < out["before"] <= out["all_read"]


@pytest.mark.slow
def test_components_script_cross_attention_and_bad_input() -> None:
    script = str(REPO / "scripts" / "bench_components.py")
    proc = subprocess.run([sys.executable, script, "cross-attention", "--resolution", "384x512", "--batch", "1",
                           "--repeats", "1", "--threads", "1"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if "max abs diff" in line]
    assert len(rows) == 4  # three levels and the middle block
    assert all(float(line.rsplit(" ", 1)[1]) < 1e-4 for line in rows)  # the fold gives the same numbers
    assert "one step's cross-attention at 384x512, batch 1" in proc.stdout
    bad = subprocess.run([sys.executable, script, "cross-attention", "--resolution", "100x3"], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and "unknown resolution" in bad.stderr and "Traceback" not in bad.stderr
    zero = subprocess.run([sys.executable, script, "vae-encode", "--repeats", "0"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert zero.returncode == 2 and "at least 1" in zero.stderr and "Traceback" not in zero.stderr


def test_speed_modes_reach_the_call_and_its_plan_uses_the_given_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's pipeline plans each call with the budget the report shows (not with what is free beside the
    models), and the speed modes reach the call."""

    from ootd.pipeline import TryOnPipeline

    calls: list[dict] = []

    original_call = TryOnPipeline.__call__

    def spy(pipe, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        result = original_call(pipe, *args, **kwargs)
        calls.append({"budget": pipe.plan.budget_bytes, "max_memory": pipe.max_memory, "modes": result.modes})
        return result

    monkeypatch.setattr(TryOnPipeline, "__call__", spy)
    budget = 7 << 30
    out = run_bench(bench_config(steps=2, max_memory=f"{budget}", cache_interval=2, token_merge=0.5),
                    random_weights="tiny")
    assert out["plan"]["budget_bytes"] == budget
    assert [(c["budget"], c["max_memory"]) for c in calls] == [(budget, budget)]
    modes = calls[0]["modes"]
    assert (modes.feature_cache.interval, modes.token_merge.ratio) == (2, 0.5) and modes.label() == "custom"


def test_vae_profile_splits_a_call_into_parts_that_add_up() -> None:
    """Per kind of module and resolution, exclusive CPU times that add up to the call; each variant's output
    against the first (itself: 0) and bf16's rounding visible."""
    from diffusers import AutoencoderKL

    from ootd.tools.bench.vae_profile import Variant, profile_table, profile_vae

    torch.manual_seed(0)
    vae = AutoencoderKL(**TINY.vae).eval().requires_grad_(False)
    image = torch.rand(1, 3, 64, 48) * 2 - 1
    variants = [Variant.parse(v) for v in ("fp32-nchw", "bf16-nhwc")]
    report = profile_vae(vae, image, variants, log=lambda line: None)
    for name in ("fp32-nchw", "bf16-nhwc"):
        for stage in ("encode", "decode"):
            run = report["variants"][name][stage]
            assert {"conv3x3", "groupnorm", "silu", "attention"} <= set(run["by_kind"]), run["by_kind"]
            assert any(key.startswith("conv3x3 @48x64") for key in run["cpu"]), run["cpu"]
            assert sum(run["cpu"].values()) == pytest.approx(run["total_cpu"], rel=1e-6, abs=1e-6)
            assert run["page_faults"] >= 0
    first, bf16 = report["variants"]["fp32-nchw"], report["variants"]["bf16-nhwc"]
    assert first["decode"]["vs_first"]["max_abs"] == 0 and first["encode"]["vs_first"]["max_abs"] == 0
    assert 0 < bf16["decode"]["vs_first"]["max_abs"] < 0.5 and "max_pixel" in bf16["decode"]["vs_first"]
    lines = profile_table(report)
    assert any(line.startswith("| **total** |") for line in lines) and any("groupnorm" in line for line in lines)
    with pytest.raises(ValueError, match="bad variant"):
        Variant.parse("fp64-nchw")


def test_bench_stage_table_with_the_original_in_its_own_precision() -> None:
    """Ours in bf16 against the original formulation on fp32 models of its own, per stage, with the ratio."""
    from ootd.cli.bench import stage_table
    from ootd.settings import PrecisionName

    report = run_bench(bench_config(precision="bf16"), random_weights="tiny",
                       options=BenchOptions(compare_original=True, original_precision=PrecisionName.FP32))
    assert report["config"]["dtype"].endswith("bfloat16") and report["config"]["original_dtype"] == "torch.float32"
    assert report["ours"]["stage_cpu"]["decode"] > 0 and report["original"]["stage_cpu"]["encode"] > 0
    lines = stage_table(report)
    assert lines[0].split() == ["stage", "ours", "(bfloat16)", "original", "(float32)", "original", "/", "ours"]
    rows = {line.split("  ")[0]: line for line in lines[1:]}
    assert list(rows) == ["conditioning", "VAE encodes", "garment UNet", "denoising step (median)", "VAE decode",
                          "whole call"]
    assert all(" s (" in row and "x (" in row and "x CPU)" in row for row in rows.values()), lines
    with pytest.raises(UsageError, match="models of its own"):
        run_bench(bench_config(), random_weights="tiny",
                  options=BenchOptions(compare_original=True, original_precision=PrecisionName.BF16, step_repeats=1))


@pytest.mark.parametrize("distill", [False, True])
def test_training_bench_gives_wall_and_cpu_seconds_per_step(distill: bool) -> None:
    """`ootd train bench`: each step's wall and process-CPU seconds, the thread count, the peak and the estimate."""
    from ootd.tools.bench.training import bench_training
    from ootd.training.settings import DistillSettings, TrainSettings

    kind = DistillSettings if distill else TrainSettings
    out = bench_training("tiny", parse_resolution("384x512"), kind.from_words(batch_size=1), 2).to_json()
    assert out["kind"] == ("distill" if distill else "fine-tune")
    assert len(out["step_seconds"]) == len(out["step_cpu_seconds"]) == 2
    assert all(s > 0 for s in out["step_cpu_seconds"]) and out["median_step_cpu_seconds"] > 0
    assert out["threads"] == torch.get_num_threads()
    assert out["peak_rss"] >= out["baseline_rss"] > 0 and out["estimate"] > 0
