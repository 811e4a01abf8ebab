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
    PreservationOpt,
    ReviewAboveOpt,
    Shared,
    preservation_choice,
    with_options,
)
from ootd.errors import escaped

if TYPE_CHECKING:
    from ootd.app.tryon.config import RunConfig
    from ootd.app.tryon.inputs import JobInputs
    from ootd.app.tryon.job import JobOutcome
    from ootd.app.tryon.preservation import PairPreservation, PreservationChoice
    from ootd.models import Models
    from ootd.pipeline import TryOnPipeline
    from ootd.pipeline_types import RunInfo, Timings
    from ootd.settings import SamplingSettings

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
    preservation: PreservationOpt = True,
    review_above: ReviewAboveOpt = None,
    *,
    shared: Shared,
) -> None:
    """Dress one person in one garment (or an outfit of two): writes [bold]<person>__<garment>__<i>.png[/bold] per
    sample (see --name)."""
    from ootd.app.tryon.loader import models_for
    from ootd.pipeline_types import Timings

    started = time.perf_counter()
    config = shared.config()
    measure = preservation_choice(preservation, review_above)
    inputs = _inputs(model, cloth, category, list(mask or []))
    models = models_for(config)  # every model of this run; the classifier goes when the try-on's pipeline loads
    timings = Timings()  # the run's stages in the order they happened, the job's among them
    resolved = _classified(inputs, config, models, timings)
    with Display(show_progress(shared.quiet, json_out)) as display:
        tried = _try_on(config, resolved, models, display, timings, log_seed=not json_out,
                        explain=explain and not json_out, auto=resolved is not inputs)
        kept = _measured(measure, tried, resolved, models, timings)
    total = time.perf_counter() - started
    if json_out:
        summary = _summary(tried, models, timings, total, shared.random_seed, explain)
        print_json({**summary, "preservation": kept.to_json()} if kept is not None else summary)
        return
    _report(tried.outcome, tried.images, tried.intermediates, timings, total, shared.random_seed, kept)


def _classified(inputs: JobInputs, config: RunConfig, models: Models, timings: Timings) -> JobInputs:
    """The inputs with `auto` categories classified (timed) by the owner's classifier, which goes when the
    try-on's pipeline loads (the memory plan does not count it)."""
    from ootd.app.tryon.autocategory import resolve_inputs

    t = time.perf_counter()
    resolved = resolve_inputs(inputs, models, config.category_margin)
    if resolved is not inputs:
        timings.add("classify", time.perf_counter() - t)
    return resolved


@dataclass
class _Tried:
    """A finished `ootd run`: the job's outcome and the files it wrote."""

    outcome: JobOutcome
    images: list[Path]
    intermediates: dict[str, Path]


def _try_on(config: RunConfig, inputs: JobInputs, models: Models, display: Display, timings: Timings, *,
            log_seed: bool, explain: bool, auto: bool) -> _Tried:
    """Every check (cheap first; pose + parsing, seconds, before the diffusion models, minutes), then the job on
    its models (each loaded when its first pass runs, a bar per component, its time counted), then its files;
    `timings` filled in the order things happened."""
    from ootd.app.tryon.outputs import describe_pipeline
    from ootd.app.tryon.preflight import prepare_job

    t = time.perf_counter()
    job = prepare_job(config, inputs, models, progress=display)
    if job.parses:
        timings.add("pose_parsing", time.perf_counter() - t)
    if log_seed:
        seed = config.sampling.seed
        logger.info("seed %d%s", seed, f" (random; pass --seed {seed} to reproduce)" if config.seed_random else "")
    with models.timed() as loading:
        first = models.pipeline(job.model_type, config.lora, progress=display)
        if explain:
            _explain(first, describe_pipeline(first, config), config, auto=auto)
        outcome = job.run(models, progress=display)
    timings.add("load", loading.seconds)
    timings.extend(outcome.timings())
    t = time.perf_counter()
    images, intermediates = job.save(outcome)
    timings.add("save", time.perf_counter() - t)
    return _Tried(outcome, images, intermediates)


def _measured(measure: PreservationChoice, tried: _Tried, inputs: JobInputs, models: Models, timings: Timings
              ) -> PairPreservation | None:
    """What the results changed of the person photo (docs/preservation.md), from the parse the job made its masks
    from (else the owner's pose and parsing models, the ones the masks come from), timed; None with
    --no-preservation. It never fails the run."""
    from ootd.app.tryon.preservation import measure_made

    if not measure.on:
        return None
    t = time.perf_counter()
    kept = measure_made(tried.images, inputs, models.preprocessor, measure.review_above, tried.outcome.parse)
    timings.add("preservation", time.perf_counter() - t)
    return kept


def _summary(tried: _Tried, models: Models, timings: Timings, total: float, random_seed: bool,
             explain: bool) -> dict[str, Any]:
    """`--json`: the files, the seed, what was tried on, where and how it ran, and the time each stage took."""
    from ootd.app.tryon.outputs import peak_memory

    outcome = tried.outcome
    ran = outcome.ran
    summary = {"outputs": [str(p) for p in tried.images],
               "intermediates": {k: str(p) for k, p in tried.intermediates.items()},
               "seed": outcome.job.config.sampling.seed, "seed_random": random_seed, **outcome.describe(),
               "device": ran.device, "precision": ran.precision, "attention": ran.attention,
               "loads": models.loads, "timings": timings.to_json(4, total=total),
               "peak_memory": peak_memory(models.device), "plan": ran.plan}
    if explain:
        summary["describe"] = ran.to_json()
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


def _report(outcome: JobOutcome, images: list[Path], intermediates: dict[str, Path], timings: Timings, total: float,
            random_seed: bool, kept: PairPreservation | None = None) -> None:
    """The summary as lines: paths, what they changed of the photo, seed (and each pass's), what was classified or
    combined, and time."""
    from ootd.app.tryon.autocategory import category_words
    from ootd.app.tryon.outputs import attention_used

    job, record, ran = outcome.job, outcome.record(0), outcome.ran
    for path in [*images, *intermediates.values()]:
        typer.echo(escaped(path))
    if kept is not None:
        typer.echo(escaped(f"preservation: {kept.line()}"))
    seed = job.config.sampling.seed
    note = f" (random; pass --seed {seed} to reproduce)" if random_seed else ""
    seeds = ", ".join(f"{p.name} seed {p.sampling.seed}" for p in record.passes)
    passes = f"; passes: {seeds}" if seeds else ""
    typer.echo(f"seed: {seed}{note}{passes}")
    for line in record.garment_lines(category_words):  # an outfit's passes, or a classified garment's category
        typer.echo(escaped(line))
    speed = record.speed_summary()
    typer.echo(f"time: {timing_line(timings, total)} on {ran.device}, {ran.precision_word or ran.precision}, "
               f"attention {attention_used(ran.attention)}" + (f", {speed}" if speed else ""))


def timing_line(timings: Timings, total: float) -> str:
    """`12.3 s (load 5.1 s, ..., other 0.1 s)`: every stage that took time, plus what no stage covers, so the
    parts add up to the total."""
    from ootd.app.tryon.outputs import format_seconds

    parts = dict(timings.stages)
    other = total - sum(parts.values())
    if other >= 0.0005:
        parts["other"] = other
    stages = ", ".join(f"{name} {format_seconds(value)}" for name, value in parts.items())
    return f"{format_seconds(total)} ({stages})"


def _explain(pipe: TryOnPipeline, ran: RunInfo, config: RunConfig, auto: bool = False) -> None:
    """--explain: what was chosen, and the memory plan for this call when the pipeline makes one."""
    for key, value in (("device", ran.device), ("arch", ran.arch), ("precision", ran.precision),
                       ("attention", ran.attention)):
        if value:
            typer.echo(f"{key}: {value}")
    typer.echo(evaluations_line(config.sampling))
    plan: Any = ran.plan
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


def evaluations_line(sampling: SamplingSettings) -> str:
    """What a picture costs in try-on UNet evaluations: the steps, times two with image guidance."""
    per_step = "2 (image guidance: a conditional and an unconditional pass)" if sampling.guidance else "1 (no guidance)"
    return (f"denoising: {sampling.steps} {sampling.scheduler.value} steps x {per_step} = "
            f"{sampling.unet_evaluations} try-on UNet evaluations a picture")


def _explain_classifier(config: RunConfig) -> None:
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
