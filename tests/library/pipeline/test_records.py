"""The typed records a call returns: where and how it ran (`RunInfo`) and its seconds (`Timings`), given as JSON
with the keys and in the order `--json`, the batch summary and the API have always had."""

from __future__ import annotations

import pytest

from ootd.pipeline_types import RunInfo, Timings


def test_timings_add_up_and_keep_the_answers_shape() -> None:
    call = Timings({"preprocess": 0.1, "encode_person": 0.2, "denoise": 1.0, "decode": 0.3}, [0.5, 0.5])
    reused = Timings({"preprocess": 0.1, "encode_person": 0.2, "denoise": 2.0, "decode": 0.25}, [1.0, 1.0])
    job = Timings()
    job.add("load", 3.0)
    job.extend(call)
    job.extend(reused, leave_out=("preprocess", "encode_person"))  # a person prepared by an earlier pair
    job.add("save", 0.123456)
    assert list(job.stages) == ["load", "preprocess", "encode_person", "denoise", "decode", "save"]
    assert job.stages["denoise"] == 3.0 and job.stages["preprocess"] == 0.1 and job.steps == [0.5, 0.5, 1.0, 1.0]
    assert job.total == pytest.approx(3.0 + 0.1 + 0.2 + 3.0 + 0.55 + 0.123456)
    answer = job.to_json(4, total=9.87654321)
    assert list(answer) == ["load", "preprocess", "encode_person", "denoise", "steps", "decode", "save", "total"]
    assert answer["save"] == 0.1235 and answer["total"] == 9.8765 and answer["steps"] == [0.5, 0.5, 1.0, 1.0]
    assert list(Timings({"load": 1.0}, [0.1]).to_json()) == ["load", "steps"]  # no denoise stage: steps last


def test_run_info_gives_the_keys_each_kind_of_pipeline_gave() -> None:
    stand_in = RunInfo("cpu", "fp32", "auto", threads=2, device_name="cpu", arch="cpu")
    assert stand_in.to_json() == {"device": "cpu", "device_name": "cpu", "arch": "cpu", "precision": "fp32",
                                  "attention": "auto", "threads": 2}
    described = RunInfo("cuda:0 (GPU)", "bf16", "sdpa", threads=8, device_name="GPU", arch="sm_89", vendor="nvidia",
                        model_type="hd", precision_word="bf16", precision_by_component={"unet": "bfloat16"},
                        channels_last=False, vae_channels_last=False, compile=False, quantize="none",
                        described=True)
    assert list(described.to_json()) == [
        "device", "device_name", "arch", "vendor", "model_type", "precision", "precision_word", "attention",
        "channels_last", "vae_channels_last", "compile", "quantize", "parsing_providers", "plan",
        "precision_by_component", "threads"]
    assert described.to_json()["plan"] is None and described.to_json()["parsing_providers"] is None


def test_a_call_returns_how_it_ran(pipe_hd, example_images) -> None:  # noqa: ANN001
    result = pipe_hd(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"],
                     steps=1, resolution=(384, 512), seed=1)
    ran = result.ran
    assert isinstance(ran, RunInfo) and ran.described and ran.device == "cpu" and ran.precision == "fp32"
    assert ran.plan is not None and ran.plan == pipe_hd.plan.to_dict() and ran.model_type == "hd"
    assert isinstance(result.timings, Timings) and len(result.timings.steps) == 1
    assert list(result.timings.stages) == ["preprocess", "encode_person", "conditioning", "encode_garment",
                                           "garment_unet", "denoise", "decode"]
