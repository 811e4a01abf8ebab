"""Small training sets for `ootd train` tests: the same pairs in the three layouts prepare reads, and a prepared
cache (masks given, so no pose or parsing runs)."""

from __future__ import annotations

import shutil
from pathlib import Path

from PIL import Image, ImageOps

from ootd.settings import ModelType
from ootd.weights.fewstep import FewStep

RESOLUTION = "384x512"
SD15_BETAS = (0.00085, 0.012, 1000)  # the released scheduler's scaled-linear betas: start, end, steps


def photos(folder: Path, example_images: dict[str, Path]) -> dict[str, Path]:
    """Two people (the example and its mirror image), two garments, the two people's masks."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {"p1": folder / "p1.png", "p2": folder / "p2.png", "g1": folder / "g1.png", "g2": folder / "g2.png",
           "m1": folder / "m1.png", "m2": folder / "m2.png"}
    shutil.copy(example_images["person"], out["p1"])
    shutil.copy(example_images["tshirt"], out["g1"])
    shutil.copy(example_images["mask"], out["m1"])
    with Image.open(example_images["person"]) as im:
        ImageOps.mirror(im).save(out["p2"])
    with Image.open(example_images["mask"]) as im:
        ImageOps.mirror(im).save(out["m2"])
    with Image.open(example_images["tshirt"]) as im:
        im.rotate(8, fillcolor=(250, 250, 250)).save(out["g2"])
    return out


PAIRS = (("p1", "g1"), ("p2", "g2"), ("p2", "g1"))  # person, garment: three pairs, two people


def three_layouts(root: Path, example_images: dict[str, Path]) -> dict[str, Path]:
    """The same three upper-body pairs as a VITON-HD folder, a Dress Code folder and a pairs CSV."""
    src = photos(root / "src", example_images)
    viton, dress = root / "viton", root / "dresscode" / "upper_body" / "images"
    for sub in ("image", "cloth"):
        (viton / sub).mkdir(parents=True)
    dress.mkdir(parents=True)
    lines, dress_lines, rows = [], [], ["person,garment,category"]
    for n, (p, g) in enumerate(PAIRS):
        shutil.copy(src[p], viton / "image" / f"{n:05d}_00.png")
        shutil.copy(src[g], viton / "cloth" / f"{n:05d}_00.png")
        lines.append(f"{n:05d}_00.png {n:05d}_00.png")
        shutil.copy(src[p], dress / f"{n:06d}_0.png")
        shutil.copy(src[g], dress / f"{n:06d}_1.png")
        dress_lines.append(f"{n:06d}_0.png\t{n:06d}_1.png")
        rows.append(f"src/{p}.png,src/{g}.png,upper")
    (viton / "train_pairs.txt").write_text("\n".join(lines) + "\n")
    (root / "dresscode" / "upper_body" / "train_pairs.txt").write_text("\n".join(dress_lines) + "\n")
    (root / "pairs.csv").write_text("\n".join(rows) + "\n")
    return {"viton-hd": viton, "dress-code": root / "dresscode", "csv": root / "pairs.csv"}


def masked_csv(root: Path, example_images: dict[str, Path], extra_rows: tuple[str, ...] = ()) -> Path:
    """The three pairs with their masks given (prepare then needs no pose or parsing), plus `extra_rows`."""
    photos(root / "src", example_images)
    masks = {"p1": "m1", "p2": "m2"}
    rows = ["person,garment,category,mask", *[f"src/{p}.png,src/{g}.png,upper,src/{masks[p]}.png" for p, g in PAIRS],
            *extra_rows]
    path = root / "pairs.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def prepared_cache(root: Path, tiny_tree: Path, example_images: dict[str, Path], split: float = 0.5) -> Path:
    """A prepared cache of the three pairs at 384x512 (one person held out with `split` 0.5)."""
    from ootd.app.train.prepare import PrepareOptions, prepare
    from ootd.settings import parse_resolution

    data = masked_csv(root / "data", example_images)
    cache = root / "cache"
    prepare(PrepareOptions(data, cache, tiny_tree, resolution=parse_resolution(RESOLUTION), split=split))
    return cache


def few_step(tree: Path, model_type: ModelType = ModelType.HD, base: str | None = None, steps: int = 4,
             scheduler: str = "lcm") -> FewStep:
    """A few-step adapter's header entry: distilled from `tree`'s weights (or the `base` given)."""
    from ootd.settings import SchedulerName
    from ootd.weights.fewstep import weights_sha256

    return FewStep(SchedulerName(scheduler), steps, 0.0, 2.0, base or weights_sha256(tree, model_type))


def few_step_adapters(tree: Path, folder: Path) -> dict[str, Path]:
    """Three trained stand-in adapters of `tree`: a few-step one of these weights (`few`, 4 lcm steps), one of
    other weights (`other`) and a plain one (`plain`)."""
    return {"few": write_adapter(tree, folder / "few.safetensors", True, sampling=few_step(tree)),
            "other": write_adapter(tree, folder / "other.safetensors", True, sampling=few_step(tree, base="0" * 64)),
            "plain": write_adapter(tree, folder / "plain.safetensors", True)}


def write_adapter(tree: Path, path: Path, trained: bool, model_type: ModelType = ModelType.HD, rank: int = 4,
                  sampling: FewStep | None = None) -> Path:
    """An adapter for the tree's try-on and garment UNets: fresh (B zero) or with random B (a trained stand-in);
    with `sampling`, a few-step adapter's header (the tensors are a stand-in: nothing was distilled)."""
    import torch
    from diffusers import UNet2DConditionModel

    from ootd.training.adapters import add_lora, lora_state, target_modules
    from ootd.weights.lora import adapter_bytes

    base = tree / "ootd" / f"ootd_{model_type.value}" / "checkpoint-36000"
    state = {}
    for name in ("unet_vton", "unet_garm"):
        unet = UNet2DConditionModel.from_pretrained(base / name)
        add_lora(unet, target_modules(unet), rank, rank, seed=1)
        if trained:
            torch.manual_seed(2)
            for key, param in unet.named_parameters():
                if ".lora_B." in key:
                    param.data.normal_(0, 0.5)
        state[name] = lora_state(unet)
    path.write_bytes(adapter_bytes(state, model_type, rank, rank, sampling))
    return path


def entry_inputs(pipe: object, cache: Path, key: str, resolution: str = RESOLUTION) -> tuple[object, object]:
    """A cached pair as the pipeline's `generate` takes it (person and garment inputs), from the entry's tensors
    alone: a training pair keeps no photos in the cache (the person picture is a grey stand-in, which `generate`
    does not read)."""
    import torch
    from PIL import Image

    from ootd.imaging.framing import FitInfo
    from ootd.pipeline_types import GarmentInputs, PersonInputs, Timings
    from ootd.settings import Category, parse_resolution
    from ootd.training.cache import read_entry

    tensors = read_entry(cache, key)
    res, dtype = parse_resolution(resolution), pipe.precision.unet  # type: ignore[attr-defined]
    mask = Image.fromarray(tensors["mask"].numpy(), mode="L")
    blank = Image.new("RGB", mask.size, (128, 128, 128))
    fit = FitInfo("stretch", mask.size, mask.size, (0, 0, *mask.size))
    person = PersonInputs(Category.UPPER, res, blank, mask, blank, fit, {}, tensors["masked"][None].to(dtype=dtype),
                          tensors["target"][None].to(dtype=dtype), Timings())
    prompt = tensors["prompt"][None].to(dtype=dtype)
    with torch.inference_mode():
        features = pipe.garment_features(tensors["garment"][None].to(dtype=dtype), prompt)  # type: ignore[attr-defined]
    return person, GarmentInputs(Category.UPPER, res, blank, prompt, features, Timings())
