"""What the nodes take from the rest of ootd, without ComfyUI: their setting inputs derived from the declarations
(ootd/comfyui/inputs.py; each widget's bounds as ootd checks them, a widget left at its default as the setting
left out), the library's messages in the node's words, and the shared models (ootd/comfyui/backend.py): room asked
for before a load, every model counted by the host, loaded once, released when the host asks and loaded again
after, kept when another fails to load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ootd.app.tryon.config import build_config
from ootd.app.tryon.settings import CLASSIFY_NODE, LOADER_NODE, MASK_NODE, NODE, NODES, SETTINGS
from ootd.comfyui import backend
from ootd.comfyui.backend import ModelChoice, make_handle
from ootd.comfyui.inputs import Widget, config_words, node_errors, node_name, widgets
from ootd.errors import CheckpointError, NoPersonError, OotdError, UnsupportedError, UsageError, worded
from ootd.settings import Category, ModelType

DEFAULTS = {node: {one.name: one.default for one in widgets(node)} for node in NODES}


def keywords(node: str = NODE, **values: Any) -> dict[str, Any]:
    """A node's `build_config` keywords with its widgets at their defaults but `values` (the loader's checkpoints
    folder aside: the tests give it)."""
    words = config_words(node, {**DEFAULTS[node], **values})
    words.pop("checkpoints", None)
    return words


def test_every_declared_setting_of_a_node_is_its_input_and_nothing_else() -> None:
    for node in NODES:
        assert [one.name for one in widgets(node)] == [one.name for one in SETTINGS.offered_by(node)], node
    assert [one.name for one in widgets(NODE)] == ["samples", "steps", "scale", "seed", "resolution", "scheduler",
                                                   "speed", "fit", "output_size", "keep_unmasked", "feather"]
    assert {one.name for one in widgets(MASK_NODE)} == {"mask_grow", "resolution", "fit"}
    assert [one.name for one in widgets(CLASSIFY_NODE)] == ["category_margin"]
    assert {"model_type", "precision", "attention", "lora", "lora_scale"} <= {w.name for w in widgets(LOADER_NODE)}
    for node in NODES:
        for one in widgets(node):
            assert one.tooltip and "--" not in one.tooltip and "{" not in one.tooltip, one


NUMBERS = [(node, one) for node in (NODE, MASK_NODE, CLASSIFY_NODE, LOADER_NODE) for one in widgets(node)
           if one.kind in ("int", "float")]


@pytest.mark.parametrize(("node", "one"), NUMBERS, ids=[f"{node}-{one.name}" for node, one in NUMBERS])
def test_each_bound_is_ootds_own(node: str, one: Widget, tiny_tree: Path, tmp_path: Path) -> None:
    """A value at each bound of a widget runs; one past it is refused by ootd itself, naming the input."""
    extra: dict[str, Any] = {"keep_unmasked": True} if one.name == "feather" else {}
    if one.name == "lora_scale":  # a scale needs an adapter file (chosen, not read, when the config is built)
        (tmp_path / "a.safetensors").write_bytes(b"x")
        extra["lora"] = str(tmp_path / "a.safetensors")
    past = 1 if one.kind == "int" else one.step
    for value in (one.low, one.high):
        build_config(checkpoints=tiny_tree, **keywords(node, **extra, **{one.name: value}))
    for value in (one.low - past, one.high + past):
        with pytest.raises(UsageError) as refused:
            build_config(checkpoints=tiny_tree, **keywords(node, **extra, **{one.name: value}))
        assert worded(refused.value, node_name).startswith(f"input {one.name} "), str(refused.value)


def test_every_choice_is_a_word_ootd_takes(tiny_tree: Path) -> None:
    for node in NODES:
        for one in widgets(node):
            for word in one.choices:
                build_config(checkpoints=tiny_tree, **keywords(node, **{one.name: word}))
    assert widgets(LOADER_NODE)[0].choices == ("auto", "hd", "dc")  # auto: hd for upper, dc otherwise
    assert keywords(LOADER_NODE, model_type="auto")["model_type"] is None


def test_widgets_left_at_their_defaults_are_the_settings_defaults(tiny_tree: Path) -> None:
    for node in (NODE, MASK_NODE, CLASSIFY_NODE):
        ours = build_config(checkpoints=tiny_tree, **{**keywords(node), "seed": 5})
        assert ours == build_config(checkpoints=tiny_tree, seed=5), node
    assert keywords(speed="exact", output_size="working", feather=4) == {**keywords(), "seed": 0}
    # left out: steps, scale and scheduler are then a few-step adapter's own (else 20, 2.0, unipc, as shown)
    assert {name for name, word in keywords().items() if word is None} == {"steps", "scale", "scheduler", "speed",
                                                                          "output_size", "feather"}


def test_feather_counts_with_keep_unmasked_and_is_refused_without_it(tiny_tree: Path) -> None:
    kept = build_config(checkpoints=tiny_tree, **keywords(feather=9, keep_unmasked=True))
    assert kept.photo.keep_unmasked and kept.photo.feather == 9 and kept.photo.at_photo_size
    with pytest.raises(UsageError) as refused, node_errors():
        build_config(checkpoints=tiny_tree, **keywords(feather=9))
    assert str(refused.value).startswith("input feather is the seam of input keep_unmasked")


def test_the_librarys_messages_in_a_nodes_words(tiny_tree: Path) -> None:
    from ootd.app.tryon.autocategory import check_margin
    from ootd.app.tryon.loader import check_checkpoints_present
    from ootd.settings import check_model_category

    raised = []
    for fail in (lambda: check_model_category(ModelType.HD, Category.DRESS),
                 lambda: check_checkpoints_present(tiny_tree / "nowhere", [], need_preprocess=False),
                 lambda: build_config(checkpoints=tiny_tree, feather=3),
                 lambda: build_config(checkpoints=tiny_tree, category_margin=2)):
        with pytest.raises(OotdError) as caught:
            fail()
        raised.append(worded(caught.value, node_name))
    assert raised[0] == "the hd model only does upper-body garments; use input model_type dc for category dress"
    # the checkpoints are chosen from ComfyUI's folders: neither a flag's DIR nor $OOTD_CHECKPOINTS
    assert raised[1] == f"checkpoints folder {tiny_tree / 'nowhere'} does not exist; run `ootd download --dest " \
                        f"{tiny_tree / 'nowhere'}`"
    assert raised[2].startswith("input feather is the seam of input keep_unmasked")
    assert raised[3] == "input category_margin must be from 0 up to (not including) 1, got 2"
    found = type("Found", (), {"margin": 0.01, "ranked": [(Category.UPPER, 0.34), (Category.DRESS, 0.33)]})()
    with pytest.raises(UsageError) as caught:
        check_margin(found, 0.2, "garment")
    assert "give it with input category upper, dress or lower" in worded(caught.value, node_name)


def test_a_node_error_is_one_line_of_ootds_own_class() -> None:
    """A message's own class (PersonNotFound is made from its parts) reaches ComfyUI as its ootd.errors class,
    worded for the node: the mask node offers its own way around a photo without a person."""
    from ootd.app.tryon.masking import no_person_error
    from ootd.comfyui.jobs import MASK_REMEDY

    for remedy, words in ((None, "or give a mask image with input mask)"),
                          (MASK_REMEDY, "ComfyUI's mask editor and give it to a try-on's input mask)")):
        with pytest.raises(NoPersonError) as caught, node_errors():
            error = no_person_error("person")
            raise error.with_remedy(remedy) if remedy else error
        assert type(caught.value) is NoPersonError and str(caught.value).endswith(words), str(caught.value)
        assert str(caught.value).startswith("no person detected in person (")


class Host:
    """A host that records what it is asked, and can take a model back as ComfyUI would."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.held: dict[str, Callable[[], None]] = {}

    def make_room(self, nbytes: int) -> None:
        self.calls.append(("make_room", nbytes))

    def hold(self, name: str, nbytes: int, release: Callable[[], None], device: str | None = None) -> str:
        self.calls.append(("hold", name))
        self.held[name] = release
        return name

    def drop(self, token: object) -> None:
        self.calls.append(("drop", token))
        self.held.pop(str(token), None)

    def take_back(self, name: str) -> None:
        self.held.pop(name)()


def test_models_load_once_with_room_made_first_and_go_when_the_host_asks(tiny_tree: Path, models) -> None:  # noqa: ANN001
    models.fake()
    host = Host()
    handle = make_handle(ModelChoice.of(tiny_tree), host)
    config = handle.run_config(**keywords(resolution="384x512"))
    shared = handle.models
    first = shared.pipeline(ModelType.HD, config)
    assert [kind for kind, _ in host.calls] == ["make_room", "hold"] and host.calls[0][1] > 0
    assert shared.pipeline(ModelType.HD, config) is first and len(host.calls) == 2  # kept: no second load
    assert handle.models is shared  # every node of the same choice shares them
    dc = shared.pipeline(ModelType.DC, config)  # both model types stay (an outfit needs both)
    assert sorted(shared.owner.held()) == ["dc", "hd"] and sorted(host.held) == ["ootd dc", "ootd hd"]
    host.take_back("ootd hd")  # ComfyUI needs the memory: that model goes, the other stays
    assert "hd" not in shared.held and not shared.owner.holds(ModelType.HD)
    assert shared.owner.held() == ["dc"] and shared.pipeline(ModelType.DC, config) is dc
    shared.pipeline(ModelType.HD, config)
    assert shared.loads == {"hd": 2, "dc": 1}
    backend.forget(handle.choice)  # ootd releases on its own: the host forgets the models
    assert host.calls[-2:] == [("drop", "ootd dc"), ("drop", "ootd hd")] and host.held == {}
    assert shared.owner.held() == []


def test_pose_parsing_and_the_classifier_are_the_owners_and_counted_by_the_host(tiny_tree: Path, models) -> None:  # noqa: ANN001
    """Every model the nodes use comes from the one owner (ootd/models/), pose + parsing handed to the pipelines
    too, and each is counted by the host once."""
    from tests.helpers.synthetic import synthetic_preprocessor

    models.fake(preprocessor=synthetic_preprocessor())
    host = Host()
    shared = make_handle(ModelChoice.of(tiny_tree), host).models
    preprocessor = shared.preprocessor()
    assert shared.preprocessor() is preprocessor is shared.owner.preprocessor()
    shared.pipeline(ModelType.HD, shared.config)
    assert sorted(host.held) == ["ootd hd", "ootd pose+parsing"] and shared.loads == {"preprocessor": 1, "hd": 1}
    host.take_back("ootd pose+parsing")
    assert shared.owner.held() == ["hd"]
    backend.forget(ModelChoice.of(tiny_tree))


def test_a_loader_choice_is_checked_before_anything_loads(tiny_tree: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        make_handle(ModelChoice.of(tiny_tree / "nowhere"), Host())
    with pytest.raises(UnsupportedError):
        make_handle(ModelChoice.of(tiny_tree, **keywords(LOADER_NODE, precision="fp16")), Host())  # on the CPU
    with pytest.raises(UsageError, match="^input lora .*none.safetensors: not found$"), node_errors():
        make_handle(ModelChoice.of(tiny_tree, lora=tiny_tree / "none.safetensors"), Host())
    with pytest.raises(UsageError, match="^input lora_scale needs input lora"), node_errors():
        make_handle(ModelChoice.of(tiny_tree, **keywords(LOADER_NODE, lora_scale=0.5)), Host())


def test_a_failed_load_keeps_the_models_loaded_before_and_loads_once_repaired(tiny_tree: Path,
                                                                              tmp_path: Path) -> None:
    """On a copy of the tiny tree with the dc try-on UNet damaged: the dc load fails with its error (the node's),
    and again at the next prompt; the hd pipeline loaded before stays loaded (the same object, still counted by
    the host, not loaded again); once the file is repaired in place, the next prompt loads dc."""
    import shutil

    from ootd.weights.layout import Layout

    tree = tmp_path / "checkpoints"
    shutil.copytree(tiny_tree, tree)
    weights = Layout(tree).unet_vton(ModelType.DC) / "diffusion_pytorch_model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    host = Host()
    handle = make_handle(ModelChoice.of(tree), host)
    config = handle.run_config(**keywords(resolution="384x512"))
    shared = handle.models
    hd = shared.pipeline(ModelType.HD, config)
    for _ in range(2):  # the user queues the prompt again before fixing the file: the same error
        with pytest.raises(CheckpointError, match="cannot load the try-on UNet"), node_errors():
            shared.pipeline(ModelType.DC, config)
    assert handle.models is shared and shared.pipeline(ModelType.HD, config) is hd
    assert shared.owner.held() == ["hd"] and list(host.held) == ["ootd hd"]
    assert ("drop", "ootd hd") not in host.calls
    weights.write_bytes(good)  # repaired: the next prompt loads it, beside the one loaded before
    dc = shared.pipeline(ModelType.DC, config)
    assert dc.model_type is ModelType.DC and shared.pipeline(ModelType.HD, config) is hd
    assert sorted(shared.owner.held()) == ["dc", "hd"] and sorted(host.held) == ["ootd dc", "ootd hd"]
    assert shared.loads == {"hd": 1, "dc": 1}
    backend.forget(handle.choice)
