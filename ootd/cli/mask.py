"""`ootd mask`: the automatic mask of a person photo (pose, parsing, mask, masked person), without the diffusion
models, to look at, fix in an editor and give back with `--mask`. The work is ootd/app/tryon/masking.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from ootd.cli.display import print_json
from ootd.cli.errors import guarded_command
from ootd.cli.options import INPUTS, LOGGING_OPTIONS, MASK, JsonOpt, Shared, choices, options_of, with_options
from ootd.errors import escaped
from ootd.settings import Category

logger = logging.getLogger("ootd.cli")

EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd mask --model person.jpg --category upper -o masks\n\n"
    "  (edit masks/person__upper__mask.png, then)  ootd run -m person.jpg -c shirt.jpg -k upper "
    "--mask masks/person__upper__mask.png\n\n"
    "Each file is listed with what it shows and its size: the mask and the masked person at --resolution, the "
    "pose and parsing pictures at the size their models work at."
)
# the shared options that change the mask (the same words as `ootd run`, so a run with them makes this mask)
MASK_OPTIONS = options_of(MASK)


@guarded_command
@with_options(MASK_OPTIONS, LOGGING_OPTIONS)
def mask_command(
    model: Annotated[Path, typer.Option("--model", "--person", "-m", help="Person photo.", metavar="PERSON",
                                        rich_help_panel=INPUTS, show_default=False)],
    category: Annotated[str, typer.Option("--category", "-k", help="upper, lower or dress.", rich_help_panel=INPUTS,
                                          show_default=False, metavar=choices(tuple(c.value for c in Category)))],
    json_out: JsonOpt = False,
    *,
    shared: Shared,
) -> None:
    """The mask a try-on would use: writes [bold]<person>__<category>__mask.png[/bold], the masked person, pose
    and parsing (framed like try-on results), to fix and pass back with [bold]ootd run --mask[/bold]."""
    from ootd.app.tryon.loader import models_for
    from ootd.app.tryon.masking import describe_mask_file
    from ootd.app.tryon.preflight import prepare_mask_job

    config = shared.config()  # the device and parsing provider as `ootd run` checks them
    job = prepare_mask_job(config, model, Category.parse(category))  # every check, in `ootd run`'s order
    outcome = job.run(models_for(config).preprocessor())
    targets = job.save(outcome)
    described = {kind: describe_mask_file(kind, outcome.images[kind]) for kind in targets}
    if json_out:
        print_json({"outputs": {k: str(p) for k, p in targets.items()}, "category": outcome.category.value,
                    "model_type": outcome.model_type.value, "person": str(model),
                    "files": {k: {"path": str(p), "size": list(outcome.images[k].size), "what": described[k]}
                              for k, p in targets.items()}})
        return
    shown = {kind: escaped(path) for kind, path in targets.items()}
    width = max(len(name) for name in shown.values())
    for kind, name in shown.items():
        typer.echo(f"{name:<{width}}  {described[kind]}")
