"""`ootd classify DIR`: the category `--category auto` would choose for every garment photo of a folder, with its
probability, and the ones it would refuse, so a catalogue can be reviewed before any try-on runs. Loads the
checkpoints' CLIP model only (ootd/app/tryon/autocategory.py); no diffusion model."""

from __future__ import annotations

import heapq
import json
from pathlib import Path
from typing import Annotated

import typer

from ootd.cli.errors import guarded_command
from ootd.cli.options import CLASSIFY, LOGGING_OPTIONS, JsonOpt, Shared, options_of, with_options

EPILOG = (
    "[bold]Examples[/bold]\n\n"
    "  ootd classify garments/\n\n"
    "  ootd classify garments/ --json > categories.jsonl   (one JSON object a line, then the counts)\n\n"
    "Each line: the file, the chosen category and its probability, every category's probability, and REFUSED "
    "where `--category auto` would refuse it (the lead over the second category under --category-margin): give "
    "those a category in the batch CSV."
)
CLASSIFY_OPTIONS = options_of(CLASSIFY)


@guarded_command
@with_options(CLASSIFY_OPTIONS, LOGGING_OPTIONS)
def classify_command(
    folder: Annotated[Path, typer.Argument(help="Folder of garment photos.", metavar="DIR", show_default=False)],
    json_out: JsonOpt = False,
    *,
    shared: Shared,
) -> None:
    """The category [bold]--category auto[/bold] would choose for each garment photo in DIR, and its probability."""
    from ootd.app.batch.folders import scan_images
    from ootd.app.tryon.autocategory import Review, review_garments
    from ootd.app.tryon.loader import models_for
    from ootd.errors import escaped

    config = shared.config(check=False)
    paths, unreadable = scan_images(folder, "garment")
    reviewed = review_garments(paths, models_for(config), config.category_margin) if paths else iter(())
    reviews = heapq.merge(reviewed, (Review(path, error=why) for path, why in unreadable), key=lambda r: r.path)
    counts = {"classified": 0, "refused": 0, "failed": 0}
    for review in reviews:
        counts["failed" if review.error else "refused" if review.refused else "classified"] += 1
        if json_out:
            typer.echo(json.dumps(review.json()))
            continue
        if review.error:
            typer.echo(f"{escaped(review.path)}: error: {escaped(review.error)}")
            continue
        found = review.classification
        mark = "  REFUSED (give it a category: `ootd run --category`, the batch CSV's column)" if review.refused else ""
        typer.echo(f"{escaped(review.path)}: {found.category.value} {found.probability:.2f} ({found.words()}){mark}")
    summary = ", ".join(f"{n} {what}" for what, n in counts.items())
    if json_out:
        typer.echo(json.dumps({"summary": counts, "margin": config.category_margin}))
    else:
        typer.echo(f"{sum(counts.values())} garments: {summary} (margin {config.category_margin:.2f})")
