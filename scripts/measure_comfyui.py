"""What the ComfyUI node layer costs: one try-on through ComfyUI (its HTTP API, the ootd nodes, Load Image and Save
Image) against `ootd run` and the Python API (`TryOnPipeline.__call__`) with the same settings, the model load left
out; and a second prompt, the models kept.

    PYTHONPATH=. python scripts/measure_comfyui.py --comfyui .comfyui/ComfyUI [--checkpoints DIR] [--steps 20]

Run it with the Python that runs ComfyUI (.venv-comfyui: scripts/test_comfyui.sh makes it, and `ootd comfyui
install` must have been run). Without --checkpoints, full-size random-weight checkpoints of the hd model (about
9 GB) are written into a temporary folder first (scripts/make_tiny_checkpoints.py --full). Every side: the example
person, t-shirt and mask (no pose or parsing), 384x512, fp32, the same seed, the CPU, this machine's threads.

- ComfyUI, started headless on the CPU as the tests start it: prompt 1 loads the model, prompts 2 and 3 (other
  seeds) keep it. Per prompt: ComfyUI's own time (its /history timestamps), the node's total and load (its
  performance text), and the CPU seconds of ComfyUI's process.
- `ootd run --json`: its total and load (the run's own timing) and its CPU seconds, twice.
- the Python API: the pipeline loaded once in this process, then the same call twice, wall and CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measuring import ROOT, cpu_name

sys.path.insert(0, str(ROOT))
EXAMPLES = ROOT / "examples"
SEEDS = (1, 2, 3)
# the pipeline's own stages, as every front end reports them: what lies outside them is the front end's
STAGES = ("preprocess", "encode_person", "conditioning", "encode_garment", "garment_unet", "denoise", "decode")


def load_average() -> str:
    return " / ".join(Path("/proc/loadavg").read_text().split()[:3])


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (and its waited-for children) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def through_comfyui(comfyui: Path, checkpoints: Path, steps: int) -> list[dict[str, float]]:
    from tests.helpers.comfyui import api_workflow, for_tests, node_of, start_comfyui, stop_comfyui

    work = Path(tempfile.mkdtemp(prefix="ootd-measure-comfyui-"))
    from ootd.comfyui.install import example_inputs

    for name in ("input", "output", "temp", "user", "models/ootd"):
        (work / name).mkdir(parents=True, exist_ok=True)
    os.symlink(checkpoints, work / "models" / "ootd" / "measured")
    example_inputs(work / "input")
    paths = work / "extra_model_paths.yaml"
    paths.write_text(f"ootd_measure:\n  base_path: {work}\n  ootd: models/ootd\n")
    comfy = start_comfyui(comfyui, work, paths)
    rows = []
    try:
        for seed in SEEDS:
            prompt = for_tests(api_workflow("lora"), steps=steps, seed=seed)
            node_of(prompt, "OotdLoader").update(checkpoints="measured", lora="none", lora_scale=1.0)
            before = process_cpu(comfy.process.pid)
            done = comfy.run(prompt, timeout=7200)
            assert done.status == "success", done.messages
            text = done.text("6")
            parts = {name: float(value) / (1000 if unit == "ms" else 1)
                     for name, value, unit in re.findall(r"(\w+) ([\d.]+) (m?s)\b", text.splitlines()[2])}
            rows.append({"comfyui_s": done.seconds, "node_total_s": parts["total"], "load_s": parts.get("load", 0.0),
                         "stages_s": sum(parts.get(stage, 0.0) for stage in STAGES),
                         "cpu_s": process_cpu(comfy.process.pid) - before})
            print(f"ComfyUI seed {seed}: {rows[-1]}\n{text}", flush=True)
    finally:
        stop_comfyui(comfy)
    return rows


def through_ootd_run(checkpoints: Path, steps: int, out: Path) -> list[dict[str, float]]:
    rows = []
    for seed in SEEDS[:2]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            [sys.executable, "-m", "ootd", "run", "--person", str(EXAMPLES / "person.png"), "--cloth",
             str(EXAMPLES / "tshirt.png"), "--category", "upper", "--mask", str(EXAMPLES / "person_mask_upper.png"),
             "--checkpoints", str(checkpoints), "--resolution", "384x512", "--steps", str(steps), "--seed",
             str(seed), "--precision", "fp32", "--device", "cpu", "-o", str(out), "--overwrite", "--json"],
            capture_output=True, text=True, env={**os.environ, "OOTD_CPU_BF16": "0", "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stderr
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        timings = json.loads(done.stdout)["timings"]
        rows.append({"total_s": timings["total"], "load_s": timings.get("load", 0.0),
                     "stages_s": sum(timings.get(stage, 0.0) for stage in STAGES),
                     "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)})
        print(f"ootd run seed {seed}: {rows[-1]}", flush=True)
    return rows


def through_python_api(checkpoints: Path, steps: int) -> list[dict[str, float]]:
    os.environ["OOTD_CPU_BF16"] = "0"
    from ootd import Models

    start = time.perf_counter()
    pipe = Models.from_pretrained(checkpoints, device="cpu", dtype="fp32").pipeline("hd")
    print(f"Python API: loaded in {time.perf_counter() - start:.1f} s", flush=True)
    rows = []
    for seed in SEEDS[:2]:
        wall, cpu = time.perf_counter(), time.process_time()
        result = pipe(EXAMPLES / "person.png", EXAMPLES / "tshirt.png", "upper",
                      mask=EXAMPLES / "person_mask_upper.png", steps=steps, seed=seed, resolution="384x512")
        rows.append({"call_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                     "stages_s": sum(result.timings.stages.get(stage, 0.0) for stage in STAGES)})
        print(f"Python API seed {seed}: {rows[-1]}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comfyui", type=Path, required=True, help="the ComfyUI folder, ootd's nodes installed")
    parser.add_argument("--checkpoints", type=Path, help="default: full-size random weights written now")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    print(f"{cpu_name('?')}, {os.cpu_count()} CPUs; load average {load_average()} at the start", flush=True)
    with tempfile.TemporaryDirectory(prefix="ootd-measure-") as tmp:
        checkpoints = args.checkpoints
        if checkpoints is None:
            checkpoints = Path(tmp) / "full"
            subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_checkpoints.py"), str(checkpoints),
                            "--full", "--models", "hd"], check=True)
        comfy = through_comfyui(args.comfyui.resolve(), checkpoints.resolve(), args.steps)
        run = through_ootd_run(checkpoints, args.steps, Path(tmp) / "run")
        api = through_python_api(checkpoints, args.steps)
    report(comfy, run, api)


def listed(values: list[float], digits: int) -> str:
    return ", ".join(f"{value:.{digits}f}" for value in values)


def report(comfy: list[dict[str, float]], run: list[dict[str, float]], api: list[dict[str, float]]) -> None:
    """Whole times (as noisy as the machine), and what each front end spends outside the pipeline's stages in the
    same runs (the node layer's cost, steady whatever else the machine does)."""
    first, kept = comfy[0], comfy[1:]
    print(f"\nload average {load_average()} at the end")
    for name, rows, whole in (("ComfyUI prompt, model kept", kept, "comfyui_s"),
                              ("ootd run, its load left out", run, "total_s"), ("Python API call", api, "call_s")):
        walls = [row[whole] - row.get("load_s", 0.0) for row in rows]
        outside = [row[whole] - row.get("load_s", 0.0) - row["stages_s"] for row in rows]
        cpu = [row["cpu_s"] for row in rows]
        share = max(o / w for o, w in zip(outside, walls, strict=True))
        print(f"{name}: {listed(walls, 2)} s; CPU {listed(cpu, 1)} s; outside the pipeline's stages "
              f"{listed(outside, 3)} s ({share:.3%} at most)")
    print(f"prompt 1 (the model loaded): {first['comfyui_s']:.2f} s, of which the node's load {first['load_s']:.2f} s; "
          f"a later prompt / prompt 1: {min(row['comfyui_s'] for row in kept) / first['comfyui_s']:.2f}")

if __name__ == "__main__":
    main()
