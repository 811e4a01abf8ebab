"""A result file measured against the photo it was made from (ootd/app/tryon/preservation.py), on pictures the tiny
pipeline made through `ootd run` (the synthetic pose and parsing, tests/helpers/synthetic.py: a person whose face,
hands and background are known rectangles): a copy of the photo with one region altered is change there and
nowhere else; a result made with --keep-unmasked is unchanged outside the seam; the region the parse lacks is
absent; the typed value of the Python API gives the figures of the saved file."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ootd.app.tryon.preservation import (
    Measured,
    PairPreservation,
    ParseCache,
    PreservationError,
    measure_pair,
    measure_result,
)
from ootd.app.tryon.provenance import read_record
from ootd.imaging.atomic import save_png_atomic
from ootd.models import use_models
from tests.helpers.cli import invoke
from tests.helpers.synthetic import synthetic_preprocessor

RUN = ["--steps", "1", "--resolution", "384x512", "--seed", "3"]
# where the synthetic parse puts each region at 384x512 (tests/helpers/synthetic.py `person_labels`): the example
# photo is 3:4, so at the working size the frame is the photo resized, no padding
FACE = (slice(55, 120), slice(167, 217))
HANDS = (slice(300, 325), slice(100, 130))  # the right arm below its wrist pushed out from the elbow
BACKGROUND = (slice(0, 25), slice(0, 384))
EDITS = {"face": FACE, "hands": HANDS, "background": BACKGROUND}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, tiny_tree: Path, pipe_hd, example_images) -> dict:  # noqa: ANN001
    """One result at the working size (the example's mask given) and one kept outside its automatic mask."""
    root = tmp_path_factory.mktemp("preservation")
    pre = synthetic_preprocessor()
    with ExitStack() as stack:
        stack.enter_context(use_models(lambda model_type: pipe_hd, lambda: pre))
        for name, extra in (("working", ["--mask", example_images["mask"]]), ("kept", ["--keep-unmasked"])):
            result = invoke("run", "-m", example_images["person"], "-c", example_images["tshirt"], "-k", "upper",
                            "--checkpoints", tiny_tree, "-o", root / name, *RUN, *extra)
            assert result.exit_code == 0, result.output
    return {"root": root, "pre": pre, "working": next((root / "working").glob("*__0.png")),
            "kept": next((root / "kept").glob("*__0.png"))}


def cache(made: dict) -> ParseCache:
    return ParseCache(lambda: made["pre"])


def masks(example_images: dict[str, Path]) -> dict[str, Path]:
    return {example_images["mask"].name: example_images["mask"]}


def copy_with_record(source: Path, image: Image.Image, path: Path, **changes: str) -> Path:
    """`image` saved with the record of `source` (a result ootd made), some of its words changed."""
    return save_png_atomic(image, path, {**read_record(source), **changes})


def framed_photo(example_images: dict[str, Path]) -> np.ndarray:
    """The photo as the try-on framed it at 384x512, worked out here: a 3:4 photo is only resized (the pipeline's
    framing resizes with Pillow's default filter)."""
    with Image.open(example_images["person"]) as im:
        assert im.size[0] * 4 == im.size[1] * 3
        return np.asarray(im.convert("RGB").resize((384, 512)))


@pytest.mark.parametrize("name", sorted(EDITS))
def test_a_copy_with_one_region_altered_changed_that_region_only(name: str, made: dict, example_images,  # noqa: ANN001
                                                                 tmp_path: Path) -> None:
    altered = framed_photo(example_images).copy()
    altered[EDITS[name]] = 255 - altered[EDITS[name]]
    path = copy_with_record(made["working"], Image.fromarray(altered), tmp_path / "r.png")
    figures = measure_result(path, example_images["person"], cache(made), masks(example_images))
    assert figures.size == (384, 512)
    region = figures.region(name)
    changed = sum((part.changed or 0.0) * part.pixels for part in (region.kept, region.redrawn))
    edited = altered[EDITS[name]].shape[0] * altered[EDITS[name]].shape[1]
    assert 0.5 * edited < round(changed) <= edited, region  # all of it but the seam's and the mid-greys
    for other in figures.regions:
        if other.name != name and not other.absent:
            assert other.kept.changed in (None, 0.0) and other.redrawn.changed in (None, 0.0), other
            assert other.kept.delta_e in (None, 0.0), other
    untouched = copy_with_record(made["working"], Image.fromarray(framed_photo(example_images)), tmp_path / "u.png")
    assert measure_result(untouched, example_images["person"], cache(made), masks(example_images)).score == 0.0


def test_a_region_the_parse_lacks_is_absent(made: dict, example_images) -> None:  # noqa: ANN001
    figures = measure_result(made["working"], example_images["person"], cache(made), masks(example_images))
    legs = figures.region("legs")  # the synthetic person wears trousers down to the shoes: no bare legs
    assert legs.absent and legs.kept.changed is None and figures.to_json()["regions"]["legs"] == {"absent": True}
    assert not figures.region("face").absent


def test_a_result_kept_outside_its_mask_is_unchanged_outside_the_seam(made: dict, example_images) -> None:  # noqa: ANN001
    figures = measure_result(made["kept"], example_images["person"], cache(made))
    with Image.open(example_images["person"]) as photo:
        assert figures.size == photo.size
    assert figures.seam == 4  # the default feather at 1024 px high
    for region in figures.regions:
        if region.kept.pixels:
            assert region.kept.changed == 0.0 and region.kept.delta_e == 0.0, region
    assert figures.score == 0.0 and figures.summary() == "unchanged outside the mask"
    # the tiny model's noise is inside the mask: what was redrawn there is measured as changed
    assert any((r.redrawn.changed or 0.0) > 0 for r in figures.regions)


def test_a_result_that_cannot_be_measured_says_why_in_one_line(made: dict, example_images, tmp_path: Path) -> None:  # noqa: ANN001
    plain = tmp_path / "plain.png"
    Image.new("RGB", (384, 512)).save(plain)
    other = tmp_path / "other.png"
    Image.open(example_images["person"]).convert("RGB").resize((600, 600)).save(other)
    cases = {
        plain: (example_images["person"], "not a result of ootd's"),
        made["working"]: (other, "not the photo it was made from"),
    }
    for result, (photo, words) in cases.items():
        with pytest.raises(PreservationError, match=words) as raised:
            measure_result(result, photo, cache(made), masks(example_images))
        assert "\n" not in str(raised.value)
    with pytest.raises(PreservationError, match="person_mask_upper.png, which is not found"):
        measure_result(made["working"], example_images["person"], cache(made), {})
    pair = measure_pair([made["working"], tmp_path / "gone.png"], example_images["person"], cache(made),
                        masks(example_images), review_above=0.5)
    assert pair.results[0].figures is not None and "not found" in (pair.results[1].problem or "")
    assert pair.review == (pair.score > 0.5)
    assert PairPreservation.from_json(pair.to_json()).summary() == pair.summary()


def test_nobody_found_is_said_once_and_remembered(made: dict, example_images) -> None:  # noqa: ANN001
    from ootd.errors import NoPersonError

    calls = []

    class Nobody:
        def parse(self, image: Image.Image) -> None:
            calls.append(1)
            raise NoPersonError("nobody")

    parses = ParseCache(lambda: Nobody())
    for _ in range(2):
        with pytest.raises(PreservationError, match="nobody found in the photo"):
            measure_result(made["kept"], example_images["person"], parses)
    assert len(calls) == 1


def test_the_python_api_gives_the_figures_of_the_saved_file(made: dict, example_images, pipe_hd,  # noqa: ANN001
                                                            tmp_path: Path) -> None:
    result = pipe_hd(example_images["person"], example_images["tshirt"], "upper", mask=example_images["mask"],
                     steps=1, seed=3, resolution="384x512")
    typed = result.preservation(example_images["person"], made["pre"])
    assert len(typed) == 1
    saved = copy_with_record(made["working"], result.images[0], tmp_path / "api.png")
    from_file = measure_result(saved, example_images["person"], cache(made), masks(example_images))
    assert typed[0].to_json() == from_file.to_json()
    assert Measured(str(saved), from_file).to_json()["summary"] == from_file.summary()
