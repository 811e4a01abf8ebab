"""The golden harness: every front end run on the tiny checkpoints with fixed seeds, and a manifest of what each
wrote (every PNG's pixels and text record, every JSON answer without its timings), so two versions of ootd can be
compared file for file on one machine (the numbers of random tiny weights differ between CPUs, not between runs).

    python -m tests.golden OUT.json [--no-ray]       # the manifest of this checkout
    python -m tests.golden --compare A.json B.json   # what differs (exit 1 if anything does)

Covers `ootd run` (one garment with a given and an automatic mask, `--category auto`, outfits with given and
automatic masks), `ootd mask`, `ootd batch` (local and Ray: single and outfit rows), `run/run_ootd.py`, and
`ootd serve` (local and Ray Serve: one garment and an outfit). Automatic masks use the synthetic pose and parsing
of tests/helpers/synthetic.py (the tiny tree's random ones find nobody); the Ray paths use given masks (their
workers load from the checkpoints).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("OOTD_CPU_BF16", "0")  # as the test suite: the same precision on every CPU

from tests.helpers import EXAMPLES, REPO  # noqa: E402

VOLATILE = {"timings", "seconds", "load_seconds", "peak_memory", "describe", "plan", "started", "pid", "worker",
            "replica", "queue", "run", "total", "wall", "id", "position"}


def _png_entry(data: bytes) -> dict[str, Any]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        text = {str(k): str(v) for k, v in im.info.items() if isinstance(v, str)}
        return {"mode": im.mode, "size": list(im.size), "pixels": hashlib.sha256(im.tobytes()).hexdigest(),
                "text": text}


def _scrub(value: Any, roots: list[str]) -> Any:
    """A JSON answer without what changes from run to run (timings, ids) or with the temporary folder."""
    if isinstance(value, dict):
        return {k: _scrub(v, roots) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_scrub(v, roots) for v in value]
    if isinstance(value, str):
        for root, name in roots:
            value = value.replace(root, name)
        if value.startswith("data:image/png;base64,"):
            return _png_entry(base64.b64decode(value.split(",", 1)[1]))
        return value
    return value


def _folder(manifest: dict[str, Any], key: str, folder: Path) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.suffix in (".png", ".jpg"):
            rel = path.relative_to(folder).as_posix()
            data = path.read_bytes()
            entry = _png_entry(data) if path.suffix == ".png" else {"sha256": hashlib.sha256(data).hexdigest()}
            manifest[f"{key}/{rel}"] = entry


def _cli(*args: Any) -> Any:
    from typer.testing import CliRunner

    from ootd import cli

    result = CliRunner().invoke(cli.app, [str(a) for a in args])
    if result.exit_code != 0:
        raise SystemExit(f"ootd {' '.join(map(str, args))} failed: {result.output[-2000:]}")
    return result


def _json(text: str) -> Any:
    return json.loads(text[text.index("{"):])


@contextmanager
def _models(tree: Path) -> Any:
    from ootd.models import Keep, Models, ModelSource, use_models
    from tests.helpers.synthetic import synthetic_preprocessor

    preprocessor = synthetic_preprocessor()
    owner = Models.from_pretrained(tree, device="cpu", keep=Keep(pipelines=2),
                                   source=ModelSource(preprocessor=lambda: preprocessor))
    owner.preprocessor()  # held first: handed to the pipelines as they load (their description names it)
    pipes = {m: owner.pipeline(m) for m in ("hd", "dc")}
    with use_models(lambda model_type: pipes[str(getattr(model_type, "value", model_type))],
                    lambda: preprocessor):
        yield pipes, preprocessor


def _inputs(root: Path) -> dict[str, Path]:
    from PIL import Image, ImageDraw

    person = Image.open(EXAMPLES / "person.png")
    lower = Image.new("L", person.size, 0)
    w, h = person.size
    ImageDraw.Draw(lower).rectangle([w // 4, h // 2, 3 * w // 4, h - h // 10], fill=255)
    paths = {"person": EXAMPLES / "person.png", "tshirt": EXAMPLES / "tshirt.png",
             "trousers": EXAMPLES / "trousers.png", "upper_mask": EXAMPLES / "person_mask_upper.png",
             "lower_mask": root / "lower_mask.png", "tshirt2": root / "tshirt2.png"}
    lower.save(paths["lower_mask"])
    shutil.copy(paths["tshirt"], paths["tshirt2"])
    return paths


COMMON = ("--resolution", "384x512", "--steps", "2", "--device", "cpu")


def run_local(manifest: dict[str, Any], tree: Path, root: Path, x: dict[str, Path]) -> None:
    """Every front end in this process, with the tiny pipelines and the synthetic preprocessor."""
    roots = [(str(root), "<root>"), (str(EXAMPLES), "<examples>"), (str(tree), "<tree>")]
    with _models(tree):
        cases = {
            "run_mask": ("-m", x["person"], "-c", x["tshirt"], "-k", "upper", "--mask", x["upper_mask"],
                         "--samples", "2", "--seed", "7", "--save-intermediates", "--grid"),
            "run_auto_mask": ("-m", x["person"], "-c", x["trousers"], "-k", "lower", "--seed", "8",
                              "--save-intermediates"),
            "run_auto_category": ("-m", x["person"], "-c", x["tshirt"], "-k", "auto", "--category-margin", "0",
                                  "--mask", x["upper_mask"], "--model-type", "dc", "--seed", "9"),
            "run_outfit_masks": ("-m", x["person"], "-c", x["tshirt"], "-c", x["trousers"], "-k", "upper", "-k",
                                 "lower", "--mask", x["upper_mask"], "--mask", x["lower_mask"], "--samples", "2",
                                 "--seed", "10", "--save-intermediates"),
            "run_outfit_auto": ("-m", x["person"], "-c", x["trousers"], "-c", x["tshirt"], "-k", "lower", "-k",
                                "upper", "--seed", "11", "--save-intermediates"),
            "run_outfit_dc": ("-m", x["person"], "-c", x["tshirt"], "-c", x["trousers"], "-k", "upper", "-k",
                              "lower", "--model-type", "dc", "--seed", "12"),
        }
        for name, args in cases.items():
            out = root / name
            result = _cli("run", *args, *COMMON, "--checkpoints", tree, "-o", out, "--json")
            manifest[f"{name}/json"] = _scrub(_json(result.stdout), roots)
            _folder(manifest, name, out)
        out = root / "mask"
        result = _cli("mask", "-m", x["person"], "-k", "upper", "--resolution", "384x512", "--device", "cpu",
                      "--checkpoints", tree, "-o", out, "--json")
        manifest["mask/json"] = _scrub(_json(result.stdout), roots)
        _folder(manifest, "mask", out)

        pairs = root / "pairs.csv"
        pairs.write_text(
            f"person,garment,category,mask\n{x['person']},{x['tshirt']},upper,{x['upper_mask']}\n"
            f"{x['person']},{x['trousers']},lower,\n"
            f"{x['person']},{x['tshirt']};{x['trousers']},upper;lower,{x['upper_mask']};{x['lower_mask']}\n"
            f"{x['person']},{x['trousers']};{x['tshirt2']},lower;upper,\n")
        out = root / "batch"
        result = _cli("batch", pairs, *COMMON, "--checkpoints", tree, "--seed", "13", "--save-intermediates", "-o", out,
                      "--json")
        manifest["batch/json"] = _scrub(_json(result.stdout), roots)
        manifest["batch/report"] = [_scrub(json.loads(line), roots)
                                    for line in (out / "batch_report.jsonl").read_text().splitlines()]
        _folder(manifest, "batch", out)

        sys.path.insert(0, str(REPO / "run"))
        import run_ootd

        out = root / "run_ootd"
        code = run_ootd.main(["--model_path", str(x["person"]), "--cloth_path", str(x["tshirt"]), "--sample", "2",
                              "--step", "2", "--seed", "14", "--resolution", "384x512", "--device", "cpu",
                              "--checkpoints", str(tree), "--output_dir", str(out)])
        assert code == 0, code
        _folder(manifest, "run_ootd", out)
        _serve(manifest, tree, x, "serve", roots)


def _serve(manifest: dict[str, Any], tree: Path, x: dict[str, Path], key: str, roots: list, ray: Any = None) -> None:
    from fastapi.testclient import TestClient

    from ootd.app.tryon.config import build_config
    from ootd.serve.app import create_app

    config = build_config(checkpoints=tree, device="cpu")
    workdir = Path(tempfile.mkdtemp())
    engine = ray.engine() if ray is not None else None
    forms = {
        "one_mask": ({"category": "upper", "seed": "20", "steps": "2", "resolution": "384x512", "samples": "2"},
                     {"person": x["person"], "garment": x["tshirt"], "mask": x["upper_mask"]}),
        "outfit_masks": ({"category": "upper", "category2": "lower", "seed": "22", "steps": "2",
                          "resolution": "384x512"},
                         {"person": x["person"], "garment": x["tshirt"], "mask": x["upper_mask"],
                          "garment2": x["trousers"], "mask2": x["lower_mask"]}),
    }
    if ray is None:
        forms["one_auto"] = ({"category": "lower", "seed": "21", "steps": "2", "resolution": "384x512"},
                             {"person": x["person"], "garment": x["trousers"]})
        forms["outfit_auto"] = ({"category": "lower", "category2": "upper", "seed": "23", "steps": "2",
                                 "resolution": "384x512"},
                                {"person": x["person"], "garment": x["trousers"], "garment2": x["tshirt"]})
    try:
        with TestClient(create_app(config, workdir, engine=engine), base_url="http://127.0.0.1") as client:
            for name, (data, files) in forms.items():
                opened = {role: (path.name, path.read_bytes(), "image/png") for role, path in files.items()}
                answer = client.post("/api/tryon", data=data, files=opened)
                if answer.status_code != 200:
                    raise SystemExit(f"serve {name}: {answer.status_code} {answer.text}")
                manifest[f"{key}/{name}"] = _scrub(answer.json(), roots)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_ray(manifest: dict[str, Any], tree: Path, root: Path, x: dict[str, Path]) -> None:
    """The Ray engines (their workers load the tiny tree; given masks: no synthetic preprocessor there)."""
    roots = [(str(root), "<root>"), (str(EXAMPLES), "<examples>"), (str(tree), "<tree>")]
    pairs = root / "ray_pairs.csv"
    rows = [f"{x['person']},{x['tshirt']},upper,{x['upper_mask']}",
            f"{x['person']},{x['trousers']},lower,{x['lower_mask']}"]
    if os.environ.get("GOLDEN_RAY_OUTFITS") == "1":
        rows.append(f"{x['person']},{x['tshirt']};{x['trousers']},upper;lower,{x['upper_mask']};{x['lower_mask']}")
    pairs.write_text("\n".join(rows) + "\n")
    out = root / "ray_batch"
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"
    result = _cli("batch", pairs, *COMMON, "--seed", "30", "-o", out, "--engine", "ray", "--workers", "1",
                  "--checkpoints", tree, "--json")
    manifest["ray_batch/json"] = _scrub(_json(result.stdout), roots)
    manifest["ray_batch/report"] = [_scrub(json.loads(line), roots)
                                    for line in (out / "batch_report.jsonl").read_text().splitlines()]
    _folder(manifest, "ray_batch", out)

    from ootd.app.tryon.config import build_config
    from ootd.serve.ray_engine import RayOptions, deployed

    config = build_config(checkpoints=tree, device="cpu")
    with deployed(config, RayOptions(replicas=1, gpus_per_replica=0)) as deployment:
        _serve(manifest, tree, x, "ray_serve", roots, ray=deployment)


def _make(root: Path) -> Path:
    sys.path.insert(0, str(REPO / "scripts"))
    from make_tiny_checkpoints import make_tiny_checkpoints

    return make_tiny_checkpoints(root / "checkpoints", seed=0)


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    problems = [f"only in the first: {k}" for k in sorted(a.keys() - b.keys())]
    problems += [f"only in the second: {k}" for k in sorted(b.keys() - a.keys())]
    for key in sorted(a.keys() & b.keys()):
        if a[key] != b[key]:
            problems.append(f"differs: {key}\n  first:  {json.dumps(a[key], sort_keys=True)[:1500]}\n"
                            f"  second: {json.dumps(b[key], sort_keys=True)[:1500]}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--compare", nargs=2, type=Path)
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args(argv)
    if args.compare:
        problems = compare(*(json.loads(p.read_text()) for p in args.compare))
        print("\n".join(problems) or f"identical: {len(json.loads(args.compare[0].read_text()))} entries")
        return 1 if problems else 0
    root = Path(tempfile.mkdtemp(prefix="ootd-golden-"))
    try:
        tree = _make(root)
        x = _inputs(root)
        manifest: dict[str, Any] = {}
        run_local(manifest, tree, root, x)
        if not args.no_ray:
            run_ray(manifest, tree, root, x)
        args.out.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        print(f"{len(manifest)} entries -> {args.out}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
