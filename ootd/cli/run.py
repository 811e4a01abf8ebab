"""`ootd run`: one person, one garment -> one PNG per sample, named by --name (`<person>__<garment>__<i>.png`).

Every check runs first, in the one order of ootd/app/tryon/job.py (options, input images, checkpoints present,
output folder and names, memory budget, a person in the photo), so a mistake fails in one line before minutes of
model loading; then the job runs on the loaded pipeline and saves its files.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ootd.cli.display import Display, plan_lines, print_json, show_progress
from ootd.cli.errors import guarded_command
from ootd.cli.options import (
    CATEGORY_METAVAR,
    INPUTS,
    LOGGING_OPTIONS,
    OUTPUTS,
    RUN_OPTIONS,
    GridOpt,
    JsonOpt,
    checked_config,
    with_options,
)

logger = logging.getLogger("ootd.cli")

EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd run --model person.jpg --cloth shirt.jpg --category upper\n\n"
    "  ootd run -m person.jpg -c skirt.png --category lower --samples 4 --steps 30 --seed 42 -o results\n\n"
    "  ootd run -m person.jpg -c shirt.jpg --category upper --mask mask.png --resolution 384x512 --json\n\n"
    "  ootd run -m person.jpg -c shirt.jpg -k upper --seed 7 --grid --name \"{person}__{garment}__{seed}__{i}\"\n\n"
    "  ootd run -m person.jpg -c garment.jpg --category auto\n\n"
    "  ootd run -m person.jpg -c top.jpg -c trousers.jpg --category auto --seed 7"
)


@with_options(RUN_OPTIONS, LOGGING_OPTIONS)
@guarded_command
def run_command(
    model: Annotated[Path, typer.Option("--model", "--person", "-m", help="Person photo.", metavar="PERSON",
                                        rich_help_panel=INPUTS, show_default=False)],
    cloth: Annotated[list[Path], typer.Option("--cloth", "--garment", "-c", metavar="GARMENT",
                                              help="Garment photo; twice for an outfit (an upper and a lower "
                                              "garment, in either order).", rich_help_panel=INPUTS,
                                              show_default=False)],
    category: Annotated[list[str], typer.Option("--category", "-k", metavar=CATEGORY_METAVAR,
                                                help="upper, lower, dress (also upperbody, lowerbody, dresses, "
                                                "0, 1, 2) or auto (classified from the photo); once, or once per "
                                                "--cloth.", rich_help_panel=INPUTS, show_default=False)],
    mask: Annotated[list[Path] | None, typer.Option("--mask", metavar="FILE",
                                                    help="Mask image (white = repaint); skips pose and parsing. "
                                                    "One per --cloth.", rich_help_panel=INPUTS,
                                                    show_default=False)] = None,
    json_out: JsonOpt = False,
    grid: GridOpt = False,
    explain: Annotated[bool, typer.Option("--explain", help="Print the device, precision, attention and memory "
                                          "plan before running.", rich_help_panel=OUTPUTS)] = False,
    **options: Any,
) -> None:
    """Dress one person in one garment (or an outfit of two): writes [bold]<person>__<garment>__<i>.png[/bold] per
    sample (see --name)."""
    from dataclasses import replace

    from ootd.app.tryon.autocategory import release_classifier, resolve_category
    from ootd.settings import AUTO_CATEGORY

    started = time.perf_counter()
    config = replace(checked_config(options), grid=grid)
    masks = list(mask or [])
    words = _category_words(category, cloth, masks)
    t = time.perf_counter()
    chosen = [resolve_category(word, path, str(path), config.checkpoints, config.category_margin)
              for word, path in zip(words, cloth, strict=True)]
    classified = {"classify": time.perf_counter() - t} if AUTO_CATEGORY in words else {}
    release_classifier()  # not resident while the try-on runs (the memory plan does not count it)
    if len(cloth) == 2:
        _run_outfit(model, cloth, chosen, masks, config, started, options, json_out, classified)
        return
    _run_one(model, cloth[0], chosen[0], masks[0] if masks else None, config, started, options, json_out, explain,
             classified)


def _category_words(category: list[str], cloth: list[Path], masks: list[Path]) -> list[Any]:
    """One category word per garment (a single --category applies to every garment), checked."""
    from ootd.errors import UsageError
    from ootd.settings import parse_category_word

    if len(cloth) > 2:
        raise UsageError(f"at most two --cloth (an upper and a lower garment), got {len(cloth)}")
    if len(cloth) == 1:  # one garment: a repeated option's last value wins, as for every other option
        category, masks[:] = category[-1:], masks[-1:]
    if len(category) not in (1, len(cloth)):
        raise UsageError(f"give one --category, or one per --cloth ({len(cloth)}), got {len(category)}")
    if masks and len(masks) != len(cloth):
        raise UsageError(f"give one --mask per --cloth ({len(cloth)}), or none, got {len(masks)}")
    words = [parse_category_word(word) for word in category]
    return words * len(cloth) if len(words) == 1 else words


def _run_one(model: Path, cloth: Path, chosen: tuple[Any, float | None], mask: Path | None, config: Any,
             started: float, options: dict[str, Any], json_out: bool, explain: bool,
             classified: dict[str, float]) -> None:
    from ootd.app.tryon.job import prepare_job
    from ootd.app.tryon.loader import PipelineLoader
    from ootd.app.tryon.outputs import describe_pipeline, peak_memory
    from ootd.app.tryon.request import TryOnRequest

    request = TryOnRequest(model, cloth, chosen[0], mask, category_p=chosen[1])
    loader = PipelineLoader(config)
    random_seed = options["seed"] is None
    timings: dict[str, Any] = dict(classified)
    with Display(show_progress(options["quiet"], json_out)) as display:
        # 1. every check (cheap first; pose + parsing, seconds, before the diffusion models, minutes)
        t = time.perf_counter()
        job = prepare_job(config, request, loader, progress=display)
        if job.person_mask is not None:
            timings["pose_parsing"] = time.perf_counter() - t
        if not json_out:
            note = f" (random; pass --seed {config.sampling.seed} to reproduce)" if random_seed else ""
            logger.info("seed %d%s", config.sampling.seed, note)
        # 2. the heavy part
        display("load", 0, 1)
        t = time.perf_counter()
        pipe = loader.get(job.model_type, progress=display if display.enabled else None)  # a bar per component
        timings["load"] = time.perf_counter() - t
        if not display.enabled:
            display("load", 1, 1)
        if explain and not json_out:
            _explain(pipe, describe_pipeline(pipe, config), config, auto=bool(classified))
        outcome = job.run(pipe, progress=display)
        t = time.perf_counter()
        images, intermediates = job.save(outcome)
        timings["save"] = time.perf_counter() - t

    timings.update(outcome.timings())
    timings["save"] = timings.pop("save")  # in the order things happened
    timings["total"] = time.perf_counter() - started
    _report(outcome, config, images, intermediates, timings, peak_memory(pipe), random_seed, json_out, explain)


def _run_outfit(model: Path, cloth: list[Path], chosen: list[tuple[Any, float | None]], masks: list[Path],
                config: Any, started: float, options: dict[str, Any], json_out: bool,
                classified: dict[str, float]) -> None:
    """Two garments: the lower (dc) then the upper on its result (ootd/app/tryon/outfit.py)."""
    from ootd.app.tryon.autocategory import category_words
    from ootd.app.tryon.loader import PipelineLoader
    from ootd.app.tryon.outfit import Garment, prepare_outfit
    from ootd.app.tryon.outputs import peak_memory

    garments = [Garment(path, category, masks[i] if masks else None, p)
                for i, (path, (category, p)) in enumerate(zip(cloth, chosen, strict=True))]
    loader = PipelineLoader(config)
    random_seed = options["seed"] is None
    with Display(show_progress(options["quiet"], json_out)) as display:
        job = prepare_outfit(config, model, garments, loader)
        outcome = job.run(loader.get, progress=display)
        images, intermediates = job.save(outcome)
    timings = {**classified, **outcome.timings(), "total": time.perf_counter() - started}
    record = job.record(outcome, 0)
    passes = [{key: record[f"{name}_{key}"] for key in ("garment", "category", "category_p", "model_type", "seed",
                                                        "mask")} for name in ("lower", "upper")]
    if json_out:
        print_json({"outputs": [str(p) for p in images],
                    "intermediates": {k: str(p) for k, p in intermediates.items()},
                    "seed": config.sampling.seed, "seed_random": random_seed, "person": str(model),
                    "passes": passes, "pose_parsing_runs": job.parses, "loads": dict(loader.loads),
                    "timings": timings, "peak_memory": peak_memory(loader.current)})
        return
    for path in [*images, *intermediates.values()]:
        typer.echo(str(path))
    note = f" (random; pass --seed {config.sampling.seed} to reproduce)" if random_seed else ""
    typer.echo(f"seed: {config.sampling.seed}{note}; passes: lower seed {passes[0]['seed']}, upper seed "
               f"{passes[1]['seed']}")
    shown = [category_words(job.first.category, job.first.category_p),
             category_words(job.upper.category, job.upper.category_p)]
    typer.echo(f"outfit: {job.first.name('garment')} {shown[0]} with {passes[0]['model_type']}, then "
               f"{Path(job.upper.name or '').name} {shown[1]} with {passes[1]['model_type']}")
    typer.echo(f"time: {timing_line(timings)}")


def _report(outcome: Any, config: Any, images: list[Path], intermediates: dict[str, Path], timings: dict[str, Any],
            memory: dict[str, Any], random_seed: bool, json_out: bool, explain: bool) -> None:
    """The summary: paths, seed and time as lines, or everything as JSON."""
    from ootd.app.tryon.autocategory import category_words
    from ootd.app.tryon.outputs import settings_json

    result, info, request = outcome.result, outcome.info, outcome.request
    if json_out:
        summary = {
            "outputs": [str(p) for p in images],
            "intermediates": {k: str(p) for k, p in intermediates.items()},
            "seed": result.seed, "seed_random": random_seed,
            "person": request.label("person"), "garment": request.label("garment"),
            "mask": request.label("mask") if request.mask is not None else None,
            "category": request.category.value, "model_type": outcome.model_type.value,
            "category_source": "auto" if request.category_p is not None else "given",
            "category_p": request.category_p,
            "device": info.get("device"), "precision": info.get("precision"), "attention": info.get("attention"),
            "timings": timings, "peak_memory": memory, "settings": settings_json(result.settings),
            "plan": info.get("plan"),
        }
        if explain:
            summary["describe"] = info
        print_json(summary)
        return
    for path in [*images, *intermediates.values()]:
        typer.echo(str(path))
    note = f" (random; pass --seed {result.seed} to reproduce)" if random_seed else ""
    typer.echo(f"seed: {result.seed}{note}")
    if request.category_p is not None:  # a given category is not repeated back
        typer.echo(f"category: {category_words(request.category, request.category_p)}")
    from ootd.speedups.modes import speed_summary

    speed = speed_summary(result.settings or {})
    typer.echo(f"time: {timing_line(timings)} on {info.get('device')}, "
               f"{info.get('precision_word') or info.get('precision')}, "
               f"attention {attention_word(info.get('attention'))}" + (f", {speed}" if speed else ""))


def timing_line(timings: dict[str, Any]) -> str:
    """`12.3 s (load 5.1 s, ..., other 0.1 s)`: every stage that took time, plus what no stage covers, so the
    parts add up to the total."""
    from ootd.app.tryon.outputs import format_seconds

    parts = {name: value for name, value in timings.items() if name != "total" and isinstance(value, float)}
    other = timings["total"] - sum(parts.values())
    if other >= 0.0005:
        parts["other"] = other
    stages = ", ".join(f"{name} {format_seconds(value)}" for name, value in parts.items())
    return f"{format_seconds(timings['total'])} ({stages})"


def attention_word(described: Any) -> str:
    """The backend that ran, without the dispatch trace (`auto: sdpa > chunked > math (used: sdpa x 17)` ->
    `sdpa`); the full description is in --json and --explain."""
    text = str(described or "unknown")
    if "(used:" in text:
        used = text.split("(used:", 1)[1].rstrip(") ")
        return ", ".join(part.split(" x ")[0].strip() for part in used.split(","))
    return text.split(":", 1)[0]


def _explain(pipe: Any, info: dict[str, Any], config: Any, auto: bool = False) -> None:
    """--explain: what was chosen, and the memory plan for this call when the pipeline makes one."""
    for key in ("device", "arch", "precision", "attention"):
        if info.get(key):
            typer.echo(f"{key}: {info[key]}")
    plan = info.get("plan")
    make_plan = getattr(getattr(pipe, "residency", None), "make_plan", None)
    if callable(make_plan):
        sampling = config.sampling
        try:
            plan = make_plan(sampling.resolution.size, sampling.num_samples, sampling.guidance)
        except Exception as exc:  # explaining must not stop the run
            logger.debug("make_plan failed: %s", exc)
    if callable(getattr(plan, "explain", None)):  # a memory Plan explains itself, headline included
        typer.echo(plan.explain())
    elif plan:
        typer.echo("memory plan:")
        for line in plan_lines(plan):
            typer.echo(line)
    else:
        typer.echo("memory plan: not available (this build's pipeline does not describe one)")
    if auto:
        _explain_classifier(config)


def _explain_classifier(config: Any) -> None:
    """--explain with --category auto: what the classifier's text tower costs, from the CLIP folder's config."""
    from transformers import CLIPConfig

    from ootd.memory.sizes import classifier_lines, clip_text_parameters
    from ootd.weights.layout import Layout

    try:
        parameters = clip_text_parameters(CLIPConfig.from_pretrained(Layout(config.checkpoints).clip).to_dict())
    except Exception as exc:  # explaining must not stop the run (the classifier already ran)
        logger.debug("classifier size: %s", exc)
        return
    for line in classifier_lines(parameters):
        typer.echo(line)
