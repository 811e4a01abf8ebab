"""What `--category auto` and outfits cost, on the CPU.

    PYTHONPATH=. python scripts/measure_outfits.py classify [--repeats 5]
    PYTHONPATH=. python scripts/measure_outfits.py outfit [--repeats 3]

classify: a CLIP ViT-L/14 with random weights (the released architecture, text and image towers, fp32) is written
to a temporary checkpoints folder; a fresh process then loads the classifier as `--category auto` does (text
tower, the per-category features, text tower dropped, image tower kept) and classifies the example garment
`--repeats` times. Prints the load and per-garment wall and CPU time and the process's peak resident memory
before and after. The random weights make the timing and memory real and the probabilities meaningless.

outfit: on the tiny random-weight tree (scripts/make_tiny_checkpoints.py), both pipelines loaded once: a two-pass
outfit (prepare_job with two garments + run + save) against the same two try-ons run one after the other as
separate jobs (prepare_job + run + save each, the second on the first's result). Pose and parsing are a STAND-IN
(tests/helpers/synthetic.py: the tiny tree's random pose network finds nobody), so the parse the outfit saves is
nearly free here; on real weights it is one pose + parsing (about a second on the CPU, docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXAMPLES = ROOT / "examples"


def uptime() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__() if Path("/proc/loadavg").exists() else "?"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_full_clip(root: Path) -> None:
    """A checkpoints folder holding only what the classifier reads: the CLIP folder and the tokenizer."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    from ootd.tools.bench.architectures import FULL, write_tokenizer

    size = write_tokenizer(root / "ootd" / "tokenizer")
    text = {**FULL.text, "bos_token_id": size - 2, "eos_token_id": size - 1, "pad_token_id": size - 1}
    torch.manual_seed(0)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=dict(FULL.vision), projection_dim=768))
    model.save_pretrained(root / "clip-vit-large-patch14", safe_serialization=True)
    CLIPImageProcessor().save_pretrained(root / "clip-vit-large-patch14")


CHILD = r"""
import json, sys, time
from pathlib import Path
def peak():  # VmHWM: this process's own peak (ru_maxrss keeps the parent's across exec)
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024
import torch  # noqa
from ootd.app.tryon.autocategory import load_classifier
from ootd.imaging.files import load_image
before = peak()
garment = load_image(sys.argv[2], "garment")
t, c = time.perf_counter(), time.process_time()
classifier = load_classifier(Path(sys.argv[1]))
load = (time.perf_counter() - t, time.process_time() - c)
after_load = peak()
runs = []
for _ in range(int(sys.argv[3])):
    t, c = time.perf_counter(), time.process_time()
    found = classifier.classify(garment)
    runs.append((time.perf_counter() - t, time.process_time() - c))
print(json.dumps({"load_s": load[0], "load_cpu_s": load[1], "classify_s": [r[0] for r in runs],
                  "classify_cpu_s": [r[1] for r in runs], "rss_before_mib": before, "rss_peak_mib": peak(),
                  "rss_after_load_mib": after_load, "threads": torch.get_num_threads(), "ranked": found.words()}))
"""


def classify(repeats: int) -> None:
    with tempfile.TemporaryDirectory(prefix="ootd-clip-full-") as tmp:
        t = time.perf_counter()
        write_full_clip(Path(tmp))
        print(f"wrote a random full-size CLIP ViT-L/14 in {time.perf_counter() - t:.1f} s")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", CHILD, tmp, str(EXAMPLES / "tshirt.png"), str(repeats)],
                             capture_output=True, text=True, env=env, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"load average (1, 5, 15 min): {uptime()}; torch threads {result['threads']}")
    print(f"classifier load (text tower + features + image tower): {result['load_s']:.2f} s wall, "
          f"{result['load_cpu_s']:.2f} s CPU")
    print(f"per garment: median {statistics.median(result['classify_s']) * 1000:.0f} ms wall, "
          f"{statistics.median(result['classify_cpu_s']) * 1000:.0f} ms CPU (runs: "
          f"{', '.join(f'{s * 1000:.0f}' for s in result['classify_s'])} ms)")
    print(f"peak RSS: {result['rss_before_mib']:.0f} MiB after imports, {result['rss_after_load_mib']:.0f} MiB after "
          f"the load, {result['rss_peak_mib']:.0f} MiB peak (classifier: +"
          f"{result['rss_peak_mib'] - result['rss_before_mib']:.0f} MiB)")
    print(f"(random weights: the probabilities mean nothing: {result['ranked']})")


def outfit(repeats: int) -> None:
    import importlib.util

    from ootd.app.tryon.config import RunConfig
    from ootd.app.tryon.inputs import GarmentInput, JobInputs
    from ootd.app.tryon.loader import models_for
    from ootd.app.tryon.passes import pass_seed
    from ootd.app.tryon.preflight import prepare_job
    from ootd.models import Models, use_models
    from ootd.settings import Category, ModelType, SamplingSettings, parse_resolution
    from tests.helpers.synthetic import synthetic_preprocessor

    spec = importlib.util.spec_from_file_location("make_tiny", ROOT / "scripts" / "make_tiny_checkpoints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory(prefix="ootd-outfit-") as tmp:
        tree = module.make_tiny_checkpoints(Path(tmp) / "tree", seed=0)
        pipes = {m: Models.from_pretrained(tree, device="cpu").pipeline(m.value) for m in ModelType}
        preprocessor = synthetic_preprocessor()
        sampling = SamplingSettings(steps=4, seed=7, resolution=parse_resolution("384x512"))
        person, top, trousers = EXAMPLES / "person.png", EXAMPLES / "tshirt.png", EXAMPLES / "trousers.png"

        def config(out: str, **kw) -> RunConfig:  # noqa: ANN003
            return RunConfig(checkpoints=tree, output=Path(tmp) / out, sampling=sampling, overwrite=True, **kw)

        def two_pass(n: int) -> tuple[float, float]:
            t, c = time.perf_counter(), time.process_time()
            models = models_for(config(f"o{n}"))
            outfit = JobInputs.of(person, [GarmentInput(top, Category.UPPER), GarmentInput(trousers, Category.LOWER)])
            job = prepare_job(config(f"o{n}"), outfit, models)
            job.save(job.run(models))
            assert job.parses == 1
            return time.perf_counter() - t, time.process_time() - c

        def separate(n: int) -> tuple[float, float]:
            t, c = time.perf_counter(), time.process_time()
            first_config = config(f"s{n}a", model_type=ModelType.DC)
            first_config = RunConfig(**{**first_config.__dict__,
                                        "sampling": SamplingSettings(steps=4, seed=pass_seed(7, "lower"),
                                                                     resolution=sampling.resolution)})
            models = models_for(first_config)
            job = prepare_job(first_config, JobInputs.single(person, trousers, Category.LOWER), models)
            images, _ = job.save(job.run(models))
            second_config = RunConfig(**{**config(f"s{n}b").__dict__,
                                         "sampling": SamplingSettings(steps=4, seed=pass_seed(7, "upper 0"),
                                                                      resolution=sampling.resolution)})
            job = prepare_job(second_config, JobInputs.single(images[0], top, Category.UPPER), models)
            job.save(job.run(models))
            return time.perf_counter() - t, time.process_time() - c

        with use_models(lambda m: pipes[m], lambda: preprocessor):
            two_pass(-1)
            separate(-1)  # warm-up
            rows = {"outfit": [], "separate": []}
            for n in range(repeats):
                rows["outfit"].append(two_pass(n))
                rows["separate"].append(separate(n))
    print(f"load average (1, 5, 15 min): {uptime()}; tiny tree, 384x512, 4 steps, pose+parsing: STAND-IN "
          f"(synthetic), pipelines loaded once (load time excluded)")
    for name, values in rows.items():
        print(f"{name}: median {statistics.median(v[0] for v in values):.2f} s wall, "
              f"{statistics.median(v[1] for v in values):.2f} s CPU ({', '.join(f'{v[0]:.2f}' for v in values)} s)")
    ratio = statistics.median(v[1] for v in rows["outfit"]) / statistics.median(v[1] for v in rows["separate"])
    print(f"outfit / two separate runs (CPU time): {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("classify", "outfit"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"peak RSS of this process so far: {peak_rss_mib():.0f} MiB")
    (classify if args.what == "classify" else outfit)(args.repeats)


if __name__ == "__main__":
    main()
