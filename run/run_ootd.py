#!/usr/bin/env python
"""The original OOTDiffusion `run/run_ootd.py` command line, running on ootd.

    python run/run_ootd.py --model_path person.jpg --cloth_path shirt.jpg --model_type hd --category 0 \\
        --scale 2.0 --step 20 --sample 4 --seed -1 --gpu_id 0

Same flags, same defaults and the same files as the original: `./images_output/out_<model_type>_<i>.png` and
`./images_output/mask.jpg` (the masked person). Like the original it replaces those files on every run (scripts
that read the fixed names keep working), but never silently: each replaced file is named on stderr. For
never-overwrite naming, use `ootd run`.

Differences that fix the original's defects: works on ROCm, CPU and MPS (`--gpu_id` picks a GPU only when there
is one); checkpoints are found from any working directory (`--checkpoints`, $OOTD_CHECKPOINTS, ./checkpoints,
then the repository's checkpoints/); "no person detected" is an error message, not an IndexError; files are
written atomically. Extensions: --checkpoints, --output_dir, --resolution, --device, --mask_path, --debug.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # runnable from a source checkout without installing
    sys.path.insert(1, str(REPO_ROOT))

logger = logging.getLogger("ootd.run_ootd")

OUTPUT_DIR = "images_output"  # the original's fixed folder (relative to the working directory)
OUTPUT_NAME = "out_{model}_{i}"  # its fixed file names: out_hd_0.png, ...


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="run ootd (the original run_ootd.py flags, on ootd)")
    parser.add_argument("--gpu_id", "-g", type=int, default=0, help="GPU index (ignored without a GPU)")
    parser.add_argument("--model_path", type=str, required=True, help="person photo")
    parser.add_argument("--cloth_path", type=str, required=True, help="garment photo")
    parser.add_argument("--model_type", type=str, default="hd", help="hd (upper body only) or dc")
    parser.add_argument("--category", "-c", type=str, default="0",
                        help="0 upperbody, 1 lowerbody, 2 dress (words accepted too)")
    parser.add_argument("--scale", type=float, default=2.0, help="image guidance scale")
    parser.add_argument("--step", type=int, default=20, help="denoising steps")
    parser.add_argument("--sample", type=int, default=4, help="number of images")
    parser.add_argument("--seed", type=int, default=-1, help="random seed; -1 draws one (and prints it)")
    extra = parser.add_argument_group("ootd extensions")
    extra.add_argument("--checkpoints", type=Path, default=None,
                       help="checkpoints folder (default: $OOTD_CHECKPOINTS, ./checkpoints, <repo>/checkpoints)")
    extra.add_argument("--output_dir", type=Path, default=Path(OUTPUT_DIR), help="output folder")
    extra.add_argument("--resolution", type=str, default="768x1024", help="768x1024 (original) or 384x512")
    extra.add_argument("--device", type=str, default=None, help="cpu, cuda:N or mps (overrides --gpu_id)")
    extra.add_argument("--mask_path", type=Path, default=None, help="use this mask instead of pose + parsing")
    extra.add_argument("--debug", action="store_true", help="print tracebacks")
    return parser


def default_checkpoints() -> Path:
    """$OOTD_CHECKPOINTS, else ./checkpoints if present, else the repository's checkpoints/ (the original
    only worked when started from its run/ folder)."""
    env = os.environ.get("OOTD_CHECKPOINTS")
    if env:
        return Path(env)
    here = Path("checkpoints")
    return here if here.is_dir() else REPO_ROOT / "checkpoints"


def _device(args: argparse.Namespace) -> str | None:
    if args.device:
        return args.device
    import torch

    if torch.cuda.is_available():
        return f"cuda:{args.gpu_id}"
    logger.info("no CUDA/ROCm GPU: --gpu_id %d ignored", args.gpu_id)
    return None


def _announce_replaced(paths: list[Path]) -> None:
    from ootd.errors import escaped

    for path in paths:
        if path.exists():
            print(f"replacing {escaped(path)} (fixed output names, as the original script)", file=sys.stderr)


def run(args: argparse.Namespace) -> None:
    from ootd.app.tryon.config import RunConfig
    from ootd.app.tryon.inputs import JobInputs
    from ootd.app.tryon.loader import models_for
    from ootd.app.tryon.preflight import prepare_job
    from ootd.errors import UsageError, escaped
    from ootd.imaging.atomic import write_atomic
    from ootd.settings import Category, FitMode, ModelType, SamplingSettings

    try:
        model_type = ModelType(args.model_type.strip().lower())
    except ValueError:
        raise UsageError(f"model_type must be 'hd' or 'dc', got {args.model_type!r}") from None
    category = Category.parse(args.category)
    if model_type is ModelType.HD and category is not Category.UPPER:
        raise UsageError("model_type 'hd' requires category 0 (upperbody); use --model_type dc")
    sampling = SamplingSettings.from_words(num_samples=args.sample, steps=args.step, guidance_scale=args.scale,
                                           seed=args.seed if args.seed >= 0 else None, resolution=args.resolution)
    checkpoints = args.checkpoints if args.checkpoints is not None else default_checkpoints()
    # "stretch": the original resizes both photos to 768x1024 whatever their shape; its fixed file names,
    # replaced on every run
    config = RunConfig(checkpoints=checkpoints, output=args.output_dir, sampling=sampling, model_type=model_type,
                       device=_device(args), fit=FitMode.STRETCH, overwrite=True, name_template=OUTPUT_NAME)
    models = models_for(config)  # every model of this run
    job = prepare_job(config, JobInputs.single(args.model_path, args.cloth_path, category, args.mask_path), models)
    outcome = job.run(models)
    mask_file = config.output / "mask.jpg"
    _announce_replaced([mask_file, *job.targets.images])
    masked = outcome.final[0].result.masked_person
    write_atomic(mask_file, lambda handle: masked.convert("RGB").save(handle, format="JPEG"), overwrite=True)
    images, _ = job.save(outcome)
    for path in (*images, mask_file):  # every file it wrote
        print(escaped(path))
    print(f"seed: {config.sampling.seed}")


# the settings and inputs ootd's messages name, as this script's flags call them
FLAGS = {"samples": "--sample", "steps": "--step", "scale": "--scale", "seed": "--seed", "resolution": "--resolution",
         "model_type": "--model_type", "category": "--category", "mask": "--mask_path", "checkpoints": "--checkpoints",
         "device": "--device", "output": "--output_dir"}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from ootd.app.console import console_logging, run_guarded

    flags = {flag for action in parser._actions for flag in action.option_strings}
    with console_logging(verbose=args.debug, quiet=False):
        return run_guarded(lambda: run(args), debug=args.debug, options=flags, name=FLAGS.get)


if __name__ == "__main__":
    sys.exit(main())
