"""`ootd run`: one person, one garment -> one PNG per sample, named by --name (`<person>__<garment>__<i>.png`).

Every check runs first, in the one order of ootd/app/tryon/job.py (options, input images, checkpoints present,
output folder and names, memory budget, a person in the photo), so a mistake fails in one line before minutes of
model loading; then the job runs on the loaded pipeline and saves its files.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ootd.cli.display import Display, plan_lines, print_json, show_progress
from ootd.cli.errors import guarded_command
from ootd.cli.options import (
    CATEGORY_METAVAR,
    INPUTS,
    LOGGING_OPTIONS,
    OUTPUTS,
    RUN_OPTIONS,
    JsonOpt,
    Shared,
    with_options,
)
from ootd.errors import escaped

if TYPE_CHECKING:
    from ootd.app.tryon.config import RunConfig
    from ootd.app.tryon.inputs import JobInputs
    from ootd.app.tryon.job import JobOutcome
    from ootd.app.tryon.loader import PipelineLoader

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


@guarded_command
@with_options(RUN_OPTIONS, LOGGING_OPTIONS)
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
    explain: Annotated[bool, typer.Option("--explain", help="Print the device, precision, attention and memory "
                                          "plan before running.", rich_help_panel=OUTPUTS)] = False,
    *,
    shared: Shared,
) -> None:
    """Dress one person in one garment (or an outfit of two): writes [bold]<person>__<garment>__<i>.png[/bold] per
    sample (see --name)."""
    from ootd.app.tryon.loader import PipelineLoader

    started = time.perf_counter()
    config = shared.config()
    inputs = _inputs(model, cloth, category, list(mask or []))
    timings: dict[str, Any] = {}
    resolved = _classified(inputs, config, timings)
    loader = PipelineLoader(config)
    with Display(show_progress(shared.quiet, json_out)) as display:
        tried = _try_on(config, resolved, loader, display, timings, log_seed=not json_out,
                        explain=explain and not json_out, auto=resolved is not inputs)
    timings["total"] = time.perf_counter() - started
    if json_out:
        print_json(_summary(tried, loader, timings, shared.random_seed, explain))
        return
    _report(tried.outcome, tried.images, tried.intermediates, timings, shared.random_seed)


def _classified(inputs: JobInputs, config: RunConfig, timings: dict[str, Any]) -> JobInputs:
    """The inputs with `auto` categories classified (timed), the classifier released before the try-on models load
    (the memory plan does not count it)."""
    from ootd.app.tryon.autocategory import release_classifier, resolve_inputs

    t = time.perf_counter()
    resolved = resolve_inputs(inputs, config.checkpoints, config.category_margin)
    if resolved is not inputs:
        timings["classify"] = time.perf_counter() - t
    release_classifier()
    return resolved


@dataclass
class _Tried:
    """A finished `ootd run`: the job's outcome and the files it wrote."""

    outcome: JobOutcome
    images: list[Path]
    intermediates: dict[str, Path]


def _try_on(config: RunConfig, inputs: JobInputs, loader: PipelineLoader, display: Display,
            timings: dict[str, Any], *, log_seed: bool, explain: bool, auto: bool) -> _Tried:
    """Every check (cheap first; pose + parsing, seconds, before the diffusion models, minutes), then the job on
    its models (each loaded when its first pass runs, its time counted), then its files; `timings` filled in the
    order things happened."""
    from ootd.app.tryon.outputs import describe_pipeline
    from ootd.app.tryon.preflight import prepare_job

    t = time.perf_counter()
    job = prepare_job(config, inputs, loader, progress=display)
    if job.parses:
        timings["pose_parsing"] = time.perf_counter() - t
    if log_seed:
        seed = config.sampling.seed
        logger.info("seed %d%s", seed, f" (random; pass --seed {seed} to reproduce)" if config.seed_random else "")
    pipe_for = _timed_loader(loader, display, timings)
    first = pipe_for(job.model_type)
    if explain:
        _explain(first, describe_pipeline(first, config), config, auto=auto)
    outcome = job.run(pipe_for, progress=display)
    t = time.perf_counter()
    images, intermediates = job.save(outcome)
    save = time.perf_counter() - t
    timings.update(outcome.timings())
    timings["save"] = save
    return _Tried(outcome, images, intermediates)


def _timed_loader(loader: PipelineLoader, display: Display, timings: dict[str, Any]) -> Any:
    """The loader's `get`, each model's load shown and its time added to `timings["load"]`."""

    def pipe_for(model_type: Any) -> Any:
        if loader.holds(model_type):
            return loader.get(model_type)
        display("load", 0, 1)
        t = time.perf_counter()
        pipe = loader.get(model_type, progress=display if display.enabled else None)  # a bar per component
        timings["load"] = timings.get("load", 0.0) + time.perf_counter() - t
        if not display.enabled:
            display("load", 1, 1)
        return pipe

    return pipe_for


def _summary(tried: _Tried, loader: PipelineLoader, timings: dict[str, Any], random_seed: bool,
             explain: bool) -> dict[str, Any]:
    """`--json`: the files, the seed, what was tried on, where and how it ran, and the time each stage took."""
    from ootd.app.tryon.outputs import peak_memory, rounded

    outcome = tried.outcome
    info = outcome.info
    summary = {"outputs": [str(p) for p in tried.images],
               "intermediates": {k: str(p) for k, p in tried.intermediates.items()},
               "seed": outcome.job.config.sampling.seed, "seed_random": random_seed, **outcome.describe(),
               "device": info.get("device"), "precision": info.get("precision"), "attention": info.get("attention"),
               "loads": dict(loader.loads), "timings": rounded(timings), "peak_memory": peak_memory(loader.current),
               "plan": info.get("plan")}
    if explain:
        summary["describe"] = info
    return summary


def _inputs(model: Path, cloth: list[Path], category: list[str], masks: list[Path]) -> Any:
    """What the options ask to try on: one category word per garment (a single --category applies to every
    garment), each parsed here, once."""
    from ootd.app.tryon.inputs import GarmentInput, JobInputs
    from ootd.errors import UsageError
    from ootd.settings import parse_category_word

    if len(cloth) > 2:
        raise UsageError(f"at most two --cloth (an upper and a lower garment), got {len(cloth)}")
    if len(cloth) == 1:  # one garment: a repeated option's last value wins, as for every other option
        category, masks = category[-1:], masks[-1:]
    if len(category) not in (1, len(cloth)):
        raise UsageError(f"give one --category, or one per --cloth ({len(cloth)}), got {len(category)}")
    if masks and len(masks) != len(cloth):
        raise UsageError(f"give one --mask per --cloth ({len(cloth)}), or none, got {len(masks)}")
    words = [parse_category_word(word) for word in category]
    words = words * len(cloth) if len(words) == 1 else words
    return JobInputs.of(model, [GarmentInput(path, word, masks[i] if masks else None)
                                for i, (path, word) in enumerate(zip(cloth, words, strict=True))])


def _report(outcome: Any, images: list[Path], intermediates: dict[str, Path], timings: dict[str, Any],
            random_seed: bool) -> None:
    """The summary as lines: paths, seed (and each pass's), what was classified or combined, and time."""
    from ootd.app.tryon.autocategory import category_words
    from ootd.app.tryon.outputs import attention_used

    job, record, info = outcome.job, outcome.record(0), outcome.info
    for path in [*images, *intermediates.values()]:
        typer.echo(escaped(path))
    seed = job.config.sampling.seed
    note = f" (random; pass --seed {seed} to reproduce)" if random_seed else ""
    seeds = ", ".join(f"{p.name} seed {p.sampling.seed}" for p in record.passes)
    passes = f"; passes: {seeds}" if seeds else ""
    typer.echo(f"seed: {seed}{note}{passes}")
    for line in record.garment_lines(category_words):  # an outfit's passes, or a classified garment's category
        typer.echo(escaped(line))
    speed = record.speed_summary()
    typer.echo(f"time: {timing_line(timings)} on {info.get('device')}, "
               f"{info.get('precision_word') or info.get('precision')}, "
               f"attention {attention_used(info.get('attention'))}" + (f", {speed}" if speed else ""))


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
