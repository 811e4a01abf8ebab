"""The ootd nodes, in ComfyUI's V3 node schema (`comfy_api.latest`), category `ootd`:

    ootd Loader            checkpoints (ComfyUI's models/ootd, extra_model_paths.yaml, or a folder path), model
                           type, precision, attention, an adapter of `ootd train` -> OOTD_MODEL (nothing loads yet)
    ootd Try-On            OOTD_MODEL, person and garment IMAGEs, an optional MASK (1 = repaint), category, the
                           settings of the HTTP API's form (same names), an optional second garment (an outfit)
                           -> the pictures (IMAGE, one per sample), each garment's MASK, what ran (STRING)
    ootd Mask              OOTD_MODEL, person IMAGE, category, mask_grow -> MASK (to edit and feed back) and a
                           preview
    ootd Garment Category  OOTD_MODEL, garment IMAGE, category_margin -> the category `auto` chooses, its
                           probabilities

Each node's setting inputs are the settings declared as offered by it (ootd/comfyui/inputs.py); its own inputs
are the pictures, masks, categories and the model handle. Each node turns its tensors into pictures
(ootd/comfyui/tensors.py), does ootd's work on them (ootd/comfyui/jobs.py) and turns the pictures back. An ootd
error reaches ComfyUI as the node's error: its one line, worded with the node's input names. Imported only inside
ComfyUI.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import folder_paths
from comfy_api.latest import ComfyExtension, io, ui

from ootd.app.tryon.settings import CLASSIFY_NODE, LOADER_NODE, MASK_NODE, NODE
from ootd.comfyui import backend, jobs, tensors
from ootd.comfyui.host import ComfyHost, Steps, device_word
from ootd.comfyui.inputs import AUTO, Widget, config_words, node_errors, widgets
from ootd.errors import OotdError
from ootd.settings import Category

CATEGORY = "ootd"
MODELS_FOLDER = "ootd"  # ComfyUI/models/ootd, and the `ootd:` key of extra_model_paths.yaml
PATH_OPTION = "(checkpoints_path)"
NO_LORA = "none"
CATEGORIES = (*(c.value for c in Category), AUTO)
OotdModel = io.Custom("OOTD_MODEL")

folder_paths.add_model_folder_path(MODELS_FOLDER, os.path.join(folder_paths.models_dir, MODELS_FOLDER),
                                   is_default=True)


def checkpoint_folders() -> dict[str, Path]:
    """Every folder of ComfyUI's `ootd` model paths that holds the released layout (`ootd/model_index.json`):
    the path itself, or a folder inside it, by name."""
    found: dict[str, Path] = {}
    for base in map(Path, folder_paths.get_folder_paths(MODELS_FOLDER)):
        candidates = [base, *sorted(p for p in base.iterdir() if p.is_dir())] if base.is_dir() else []
        for folder in candidates:
            if (folder / "ootd" / "model_index.json").is_file():
                found.setdefault(folder.name, folder)
    return found


def adapters() -> list[str]:
    """The `.safetensors` files of ComfyUI's loras folders (an adapter of `ootd train` is one)."""
    return [name for name in folder_paths.get_filename_list("loras") if name.endswith(".safetensors")]


def widget(one: Widget) -> io.Input:
    """A setting as a V3 widget input, with its bounds, default and tooltip (from its declaration)."""
    if one.kind == "choice":
        return io.Combo.Input(one.name, options=list(one.choices), default=one.default, tooltip=one.tooltip)
    if one.kind == "bool":
        return io.Boolean.Input(one.name, default=one.default, tooltip=one.tooltip)
    if one.kind == "float":
        return io.Float.Input(one.name, default=one.default, min=one.low, max=one.high, step=one.step,
                              tooltip=one.tooltip)
    if one.kind == "int":
        return io.Int.Input(one.name, default=one.default, min=one.low, max=one.high, tooltip=one.tooltip,
                            control_after_generate=one.seed or None)
    return io.String.Input(one.name, default=one.default, tooltip=one.tooltip)  # a path or a word


def picked(one: Widget) -> list[io.Input]:
    """The loader's file settings as ComfyUI's pickers of its model folders (the checkpoints, with a path of
    one's own beside them; the adapters); another setting as its widget."""
    if one.name == "checkpoints":
        folders = list(checkpoint_folders())
        return [io.Combo.Input("checkpoints", options=[*folders, PATH_OPTION], default=(folders or [PATH_OPTION])[0],
                               tooltip="a folder of the released layout in ComfyUI/models/ootd (or the `ootd:` "
                                       "paths of extra_model_paths.yaml); ootd download fetches it"),
                io.String.Input("checkpoints_path", default="", tooltip="a checkpoints folder anywhere: used "
                                "instead of `checkpoints` when given")]
    if one.name == "lora":
        return [io.Combo.Input("lora", options=[NO_LORA, *adapters()], default=NO_LORA,
                               tooltip="an adapter written by `ootd train` (in ComfyUI/models/loras), merged into "
                                       "the models when they load")]
    return [widget(one)]


class OotdLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="OotdLoader", display_name="ootd Loader", category=CATEGORY,
            description="Where ootd's models are and how they run on ComfyUI's device. Nothing loads here: each "
                        "model loads when a try-on first needs it and stays loaded for every later prompt, until "
                        "ComfyUI needs the memory.",
            inputs=[put for one in widgets(LOADER_NODE) for put in picked(one)],
            outputs=[OotdModel.Output(display_name="model", tooltip="ootd's models, shared by every node using "
                                                                    "this loader")],
        )

    @classmethod
    def execute(cls, checkpoints: str, checkpoints_path: str, lora: str | None = None, **settings: Any
                ) -> io.NodeOutput:
        with node_errors():
            root = cls.checkpoints_root(checkpoints, checkpoints_path)
            words = config_words(LOADER_NODE, settings)
            if lora is not None:
                words["lora"] = None if lora == NO_LORA else Path(folder_paths.get_full_path_or_raise("loras", lora))
            choice = backend.ModelChoice.of(root, device_word(), **words)
            handle = backend.make_handle(choice, ComfyHost())
        return io.NodeOutput(handle, ui=ui.PreviewText(handle.describe()))

    @classmethod
    def fingerprint_inputs(cls, checkpoints: str, checkpoints_path: str, lora: str = NO_LORA, **others: Any) -> Any:
        """Run again (a fresh check) when the chosen files change on disk, not only when the inputs do."""
        try:
            root = cls.checkpoints_root(checkpoints, checkpoints_path)
            adapter = None if lora == NO_LORA else folder_paths.get_full_path("loras", lora)
            files = [root / "ootd" / "model_index.json", *([Path(adapter)] if adapter else [])]
            return tuple(f.stat().st_mtime_ns if f.exists() else None for f in files)
        except (OSError, OotdError):
            return None  # execute says why

    @staticmethod
    def checkpoints_root(checkpoints: str, checkpoints_path: str) -> Path:
        if checkpoints_path.strip():
            return Path(checkpoints_path.strip()).expanduser()
        folders = checkpoint_folders()
        if checkpoints not in folders:
            raise OotdError(f"no checkpoints folder {checkpoints!r} in ComfyUI/models/ootd: put the released layout "
                            f"there (`ootd download --dest ComfyUI/models/ootd`), or set checkpoints_path")
        return folders[checkpoints]


def _model_input() -> io.Input:
    return OotdModel.Input("model", tooltip="from an ootd Loader")


class OotdTryOn(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="OotdTryOn", display_name="ootd Try-On", category=CATEGORY,
            description="The person wearing the garment (or an outfit: an upper and a lower garment), as `ootd run` "
                        "makes it: the same settings and seed give the same pictures.",
            inputs=[
                _model_input(),
                io.Image.Input("person", tooltip="photo of the person"),
                io.Image.Input("garment", tooltip="photo of the garment"),
                io.Combo.Input("category", options=list(CATEGORIES), default="upper",
                               tooltip="upper, lower or dress; auto: classified from the garment photo"),
                io.Mask.Input("mask", optional=True, tooltip="1 = repaint, the person photo's shape (paint it in "
                              "the mask editor, or take an ootd Mask); absent: found by pose and parsing"),
                *(widget(one) for one in widgets(NODE)),
                io.Image.Input("garment2", optional=True, tooltip="a second garment: an outfit (one upper and one "
                               "lower garment; the lower is tried on first)"),
                io.Combo.Input("category2", options=list(CATEGORIES), default="lower", optional=True,
                               tooltip="the second garment's category"),
                io.Mask.Input("mask2", optional=True, tooltip="the second garment's mask (give one for both "
                              "garments, or for neither)"),
            ],
            outputs=[
                io.Image.Output(display_name="images", tooltip="the pictures, one per sample"),
                io.Mask.Output(display_name="mask", tooltip="each garment's mask, in the person photo's frame and "
                               "size (an outfit's: two)"),
                io.String.Output(display_name="performance", tooltip="what ran and where the time went"),
            ],
        )

    @classmethod
    def execute(cls, model: backend.ModelHandle, person: Any, garment: Any, category: str, mask: Any = None,
                garment2: Any = None, category2: str = "lower", mask2: Any = None, **settings: Any) -> io.NodeOutput:
        with node_errors():
            photo = tensors.image_to_pil(person, "person")
            garments = [jobs.Garment(tensors.image_to_pil(garment, "garment"), category,
                                     tensors.mask_to_pil(mask, "mask") if mask is not None else None)]
            if garment2 is not None:
                garments.append(jobs.Garment(tensors.image_to_pil(garment2, "garment2"), category2,
                                             tensors.mask_to_pil(mask2, "mask2") if mask2 is not None else None,
                                             "garment2", "mask2"))
            elif mask2 is not None:
                raise OotdError("mask2 is the second garment's mask: connect garment2 too")
            if len(garments) == 2 and (mask is None) != (mask2 is None):
                raise OotdError("give a mask for both garments (mask and mask2), or for neither")
            made = jobs.try_on(model, photo, garments, settings, Steps())
        return io.NodeOutput(tensors.pil_to_image(made.pictures), tensors.pil_to_mask(made.masks), made.report)


class OotdMask(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="OotdMask", display_name="ootd Mask", category=CATEGORY,
            description="The mask a try-on would make (pose + parsing, as `ootd mask`), to look at, fix in the mask "
                        "editor and give to the try-on's mask input.",
            inputs=[
                _model_input(),
                io.Image.Input("person", tooltip="photo of the person"),
                io.Combo.Input("category", options=[c.value for c in Category], default="upper",
                               tooltip="the garment's category: which region the mask covers"),
                *(widget(one) for one in widgets(MASK_NODE)),
            ],
            outputs=[
                io.Mask.Output(display_name="mask", tooltip="1 = repaint, in the person photo's frame and size"),
                io.Image.Output(display_name="preview", tooltip="the masked person, the pose found and the body "
                                "parts found, side by side"),
            ],
        )

    @classmethod
    def execute(cls, model: backend.ModelHandle, person: Any, category: str, **settings: Any) -> io.NodeOutput:
        with node_errors():
            made = jobs.mask_of(model, tensors.image_to_pil(person, "person"), category, settings)
        return io.NodeOutput(tensors.pil_to_mask([made.mask]), tensors.pil_to_image([made.preview]))


class OotdClassify(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="OotdClassify", display_name="ootd Garment Category", category=CATEGORY,
            description="The category `auto` would choose for a garment photo (the checkpoints' CLIP), with every "
                        "category's probability.",
            inputs=[_model_input(), io.Image.Input("garment", tooltip="photo of the garment"),
                    *(widget(one) for one in widgets(CLASSIFY_NODE))],
            outputs=[
                io.Combo.Output(display_name="category", options=[c.value for c in Category],
                                tooltip="upper, lower or dress: connect it to a try-on's category"),
                io.String.Output(display_name="probabilities", tooltip="the chosen category and every category's "
                                 "probability"),
            ],
        )

    @classmethod
    def execute(cls, model: backend.ModelHandle, garment: Any, **settings: Any) -> io.NodeOutput:
        with node_errors():
            category, text = jobs.category_of(model, tensors.image_to_pil(garment, "garment"), settings)
        return io.NodeOutput(category, text, ui=ui.PreviewText(text))


NODES: list[type[io.ComfyNode]] = [OotdLoader, OotdTryOn, OotdMask, OotdClassify]


class OotdExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return NODES


async def comfy_entrypoint() -> OotdExtension:
    """What ComfyUI calls when it loads the pack (custom_nodes/ootd/__init__.py)."""
    return OotdExtension()
