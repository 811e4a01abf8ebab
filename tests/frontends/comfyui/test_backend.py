"""What the nodes take from the rest of ootd (ootd/comfyui/backend.py), without ComfyUI: each setting's bounds as
ootd checks them, the node's widgets as `build_config` keywords, the library's messages in the node's words, and
the shared models: room asked for before a load, every model counted by the host, loaded once, released when
the host asks and loaded again after."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ootd.app.tryon.config import build_config
from ootd.comfyui import backend
from ootd.comfyui.backend import MARGIN, MASK_SETTINGS, TRYON_SETTINGS, ModelChoice, make_handle, node_words
from ootd.errors import CheckpointError, OotdError, UnsupportedError, UsageError
from ootd.settings import Category, ModelType

DEFAULTS = {setting.name: setting.default for setting in TRYON_SETTINGS}


def keywords(**values: Any) -> dict[str, Any]:
    return backend.tryon_keywords({**DEFAULTS, **values})


@pytest.mark.parametrize("setting", [s for s in TRYON_SETTINGS if s.kind in ("int", "float")], ids=lambda s: s.name)
def test_each_bound_is_ootds_own(setting: backend.Setting, tiny_tree: Path) -> None:
    """A value at each bound runs; one past it is refused by ootd itself (the bounds cannot drift apart)."""
    extra = {"keep_unmasked": True} if setting.name == "feather" else {}
    past = 1 if setting.kind == "int" else 0.01
    for value in (setting.low, setting.high):
        build_config(checkpoints=tiny_tree, **keywords(**extra, **{setting.name: value}))
    for value in (setting.low - past, setting.high + past):
        with pytest.raises(UsageError):
            build_config(checkpoints=tiny_tree, **keywords(**extra, **{setting.name: value}))


def test_every_choice_is_a_word_ootd_takes(tiny_tree: Path) -> None:
    for setting in (*TRYON_SETTINGS, *MASK_SETTINGS):
        for word in setting.choices:
            build_config(checkpoints=tiny_tree, **keywords(**{setting.name: word}))
    for words, _ in backend.LOADER_CHOICES.values():
        assert len(set(words)) == len(words)
    with pytest.raises(UsageError):
        build_config(checkpoints=tiny_tree, category_margin=MARGIN.high + 0.01)


def test_feather_counts_only_with_keep_unmasked(tiny_tree: Path) -> None:
    plain = build_config(checkpoints=tiny_tree, **keywords(feather=9, output_size="working"))
    assert not plain.photo.keep_unmasked and plain.photo.feather == 4
    kept = build_config(checkpoints=tiny_tree, **keywords(feather=9, keep_unmasked=True, output_size="working"))
    assert kept.photo.keep_unmasked and kept.photo.feather == 9 and kept.photo.at_photo_size


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
        raised.append(node_words(str(caught.value)))
    assert raised[0] == "the hd model only does upper-body garments; use input model_type dc for category dress"
    assert raised[1].endswith("or set the ootd Loader's checkpoints_path")
    assert raised[2].startswith("input feather is the seam of input keep_unmasked")
    assert raised[3] == "input margin must be from 0 up to (not including) 1, got 2"
    outside_commands = [re.sub(r"`[^`]*`", "", words) for words in raised]  # `ootd download --dest` is a command
    assert all("--" not in words for words in outside_commands), raised
    found = type("Found", (), {"margin": 0.01, "ranked": [(Category.UPPER, 0.34), (Category.DRESS, 0.33)]})()
    with pytest.raises(UsageError) as caught:
        check_margin(found, 0.2, "garment")
    assert "give it with input category upper, dress or lower" in node_words(str(caught.value))


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
    handle = make_handle(ModelChoice(tiny_tree), host)
    config = handle.run_config(**keywords(resolution="384x512"))
    shared = handle.models
    first = shared.pipeline(ModelType.HD, config)
    assert [kind for kind, _ in host.calls] == ["make_room", "hold"] and host.calls[0][1] > 0
    assert shared.pipeline(ModelType.HD, config) is first and len(host.calls) == 2  # kept: no second load
    assert handle.models is shared  # every node of the same choice shares them
    dc = shared.pipeline(ModelType.DC, config)  # both model types stay (an outfit needs both)
    assert shared.owner.held() == ["hd", "dc"] and sorted(host.held) == ["ootd dc", "ootd hd"]
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
    shared = make_handle(ModelChoice(tiny_tree), host).models
    preprocessor = shared.preprocessor()
    assert shared.preprocessor() is preprocessor is shared.owner.preprocessor()
    shared.pipeline(ModelType.HD, shared.config)
    assert sorted(host.held) == ["ootd hd", "ootd pose+parsing"] and shared.loads == {"preprocessor": 1, "hd": 1}
    host.take_back("ootd pose+parsing")
    assert shared.owner.held() == ["hd"]
    backend.forget(ModelChoice(tiny_tree))


def test_a_loader_choice_is_checked_before_anything_loads(tiny_tree: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        make_handle(ModelChoice(tiny_tree / "nowhere"), Host())
    with pytest.raises(UnsupportedError):
        make_handle(ModelChoice(tiny_tree, precision="fp16"), Host())  # fp16 on the CPU
    with pytest.raises(UsageError, match="input lora"):
        try:
            make_handle(ModelChoice(tiny_tree, lora=tiny_tree / "none.safetensors"), Host())
        except OotdError as exc:
            raise type(exc)(node_words(str(exc))) from None


def test_a_failed_load_is_tried_again_by_the_next_prompt(tiny_tree: Path, models) -> None:  # noqa: ANN001
    """A loader remembers a failed load for the rest of a run; in ComfyUI the user fixes the file and queues the
    prompt again, so the next prompt loads anew."""
    from tests.helpers.fakes import FakePipe

    tries: list[ModelType] = []

    def load(model_type: ModelType) -> FakePipe:
        tries.append(model_type)
        if len(tries) == 1:
            raise CheckpointError("unet_vton: truncated file")
        return FakePipe(model_type)

    models.use(load)
    handle = make_handle(ModelChoice(tiny_tree, attention="sdpa"), Host())
    config = handle.run_config(**keywords(resolution="384x512"))
    with pytest.raises(CheckpointError, match="truncated"):
        handle.models.pipeline(ModelType.HD, config)
    assert handle.models.pipeline(ModelType.HD, config).model_type is ModelType.HD
    assert len(tries) == 2 and handle.models.loads == {"hd": 1}
    backend.forget(handle.choice)
