"""Only the model owner makes networks: read from the source, no module outside ootd/models/ (and the loaders under
it) constructs one (`from_pretrained` of a model class, an ONNX Runtime session, a network class instantiated) or
resolves the runtime, and the loaders' entry points are called from the owner alone. Network skeletons on the meta
device (shapes for memory estimates: no weights, nothing runs) are not models. The device is found by the runtime
alone, in the scripts too (a benchmark measures on the device a run would get, as a run gets it). A control shows
the scans find each kind of construction and detection."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

# Network classes (diffusers, transformers, the metric packages, ours): constructing one makes a model.
NETWORKS = {"UNet2DConditionModel", "AutoencoderKL", "CLIPTextModel", "CLIPTextModelWithProjection",
            "CLIPVisionModelWithProjection", "CLIPModel", "FeatureExtractorInceptionV3", "LPIPS", "TryOnPipeline",
            "Preprocessor", "PoseEstimator", "HumanParser", "TryOnObjective", "InferenceSession"}
CONSTRUCTORS = {"from_pretrained", "from_config", "from_checkpoint", "from_checkpoints", "from_single_file"}
# The loaders' entry points: what turns files (or a stand-in's recipe) into networks
LOADERS = {"load_components", "load_vae", "load_unet", "load_text_encoder", "load_image_encoder", "load_text_tower",
           "load_networks", "published_modules", "random_modules", "from_checkpoints", "resolve_runtime"}
# Where networks are made: the owner, and the loaders it calls (files -> modules, strict; pose and parsing; the
# metric networks), and the benchmark's random-weight stand-ins, which it hands to the owner as a source.
CONSTRUCTION_SITES = ("ootd/models/", "ootd/weights/loading.py", "ootd/evaluation/networks.py",
                      "ootd/preprocessing.py", "preprocess/", "ootd/tools/bench/random_weights.py")
LOADER_CALLERS = ("ootd/models/", "ootd/weights/loading.py", "ootd/evaluation/networks.py", "ootd/preprocessing.py",
                  "ootd/runtime.py")

# Where the device is found: the runtime (ootd/runtime.py, resolved once per owner), the module that says how
# (ootd/hardware/), and the doctor, which reports every GPU as the machine shows it and runs no model
DEVICE_FINDERS = {"detect_device", "peek_device"}
DEVICE_SITES = ("ootd/runtime.py", "ootd/hardware/", "ootd/tools/doctor/")


def _name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _meta_block(item: ast.withitem) -> bool:
    """`with torch.device("meta")`: a skeleton's shapes, no weights."""
    call = item.context_expr
    return isinstance(call, ast.Call) and _name(call.func) == "device" and any(
        isinstance(a, ast.Constant) and a.value == "meta" for a in call.args)


def constructions(source: str) -> list[str]:
    """`line: what` for each network constructed or runtime resolved in `source`, outside meta-device blocks."""
    found: list[str] = []

    def visit(node: ast.AST, meta: bool) -> None:
        if isinstance(node, ast.With | ast.AsyncWith):
            meta = meta or any(_meta_block(item) for item in node.items)
        if isinstance(node, ast.Call) and not meta:
            func, name = node.func, _name(node.func)
            receiver = _name(func.value) if isinstance(func, ast.Attribute) else ""
            if name in NETWORKS or name == "resolve_runtime" or (
                    name in CONSTRUCTORS and (receiver in NETWORKS or receiver.endswith(("Model", "Pipeline")))):
                found.append(f"{node.lineno}: {receiver + '.' if receiver else ''}{name}")
        for child in ast.iter_child_nodes(node):
            visit(child, meta)

    visit(ast.parse(source), False)
    return found


def loader_calls(source: str) -> list[str]:
    """`line: name` for each call of a loader's entry point in `source` (definitions are not calls)."""
    return [f"{node.lineno}: {_name(node.func)}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and _name(node.func) in LOADERS]


def device_detections(source: str) -> list[str]:
    """`line: name` for each call that finds the device itself in `source` (not through the runtime)."""
    return [f"{node.lineno}: {_name(node.func)}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and _name(node.func) in DEVICE_FINDERS]


def _sources() -> dict[str, str]:
    files = [*REPO.glob("ootd/**/*.py"), *REPO.glob("preprocess/**/*.py"), REPO / "run" / "run_ootd.py"]
    return {path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8") for path in files}


def _allowed(path: str, sites: tuple[str, ...]) -> bool:
    return any(path == site or (site.endswith("/") and path.startswith(site)) for site in sites)


def test_no_module_outside_the_owner_constructs_a_network_or_resolves_the_runtime() -> None:
    outside = {path: found for path, source in _sources().items()
               if not _allowed(path, CONSTRUCTION_SITES) and (found := constructions(source))}
    assert outside == {}


def test_the_loaders_are_called_by_the_owner_alone() -> None:
    outside = {path: found for path, source in _sources().items()
               if not _allowed(path, LOADER_CALLERS) and (found := loader_calls(source))}
    assert outside == {}


def test_the_scan_finds_each_kind_of_construction() -> None:
    """A control: what the two tests above must catch, and what they must let through."""
    caught = constructions("\n".join([
        "runtime = resolve_runtime(request)",
        "unet = UNet2DConditionModel.from_pretrained(folder)",
        "session = ort.InferenceSession(path)",
        "vae = AutoencoderKL(**config)",
        "pipe = TryOnPipeline(components, model_type, device, precision)",
        "clip = transformers.CLIPVisionModelWithProjection.from_pretrained(folder)",
    ]))
    assert [line.split(": ")[0] for line in caught] == ["1", "2", "3", "4", "5", "6"], caught
    assert constructions("\n".join([
        "config = CLIPConfig.from_pretrained(folder)",  # a config, not a network
        "with quiet_loading(), torch.device('meta'):",
        "    unet = UNet2DConditionModel.from_config(config)",  # a skeleton: shapes only
        "pipe = models.pipeline(ModelType.HD)",  # the owner's getter
    ])) == []
    assert loader_calls("components = load_components(root, 'hd', dtypes)\ndef load_vae(layout, dtype): ...") == [
        "1: load_components"]


def test_the_device_is_found_by_the_runtime_alone() -> None:
    """The library, its front ends and the scripts get their device from a model owner's runtime (or, before
    anything loads, its `hardware()`), as a run does: none detects it on its own."""
    scripts = {path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8")
               for path in REPO.glob("scripts/**/*.py")}
    assert scripts  # the scan reads them
    outside = {path: found for path, source in {**_sources(), **scripts}.items()
               if not _allowed(path, DEVICE_SITES) and (found := device_detections(source))}
    assert outside == {}


def test_the_device_scan_finds_each_way_to_detect_it() -> None:
    """A control: direct calls, by name or through the module, are caught; the owner's runtime is not."""
    assert device_detections("\n".join([
        "info = detect_device('cpu')",
        "info = device.detect_device(args.device)",
        "seen = peek_device(None)",
        "info = Models(None, RuntimeRequest(device='cpu')).runtime().device",
        "hardware = models.hardware()",
    ])) == ["1: detect_device", "2: detect_device", "3: peek_device"]


def test_the_old_ways_to_get_a_model_are_gone() -> None:
    """The loaders each front end had (a loader per module, the training placeholders, the classifier cache and
    its manual release, validation resetting placement from outside) are not in the source any more."""
    text = {path: source for path, source in _sources().items()}
    gone = ("class PipelineLoader", "class NotLoaded", "def _load_prepare_models", "def release_classifier",
            "def pipe_for", 'residency.place("none")', "def detect_device(options")
    found = {word: [path for path, source in text.items() if word in source and not path.startswith("ootd/models/")]
             for word in gone}
    assert {word: paths for word, paths in found.items() if paths} == {}
    # no process-wide cache above the library (the classifier's was one: a second owner of a network); the
    # library's caches of small values (imaging/icc.py's colour transforms) hold no model
    above = ("ootd/app/", "ootd/cli/", "ootd/serve/", "ootd/comfyui/", "run/")
    assert [path for path, source in text.items() if "lru_cache" in source and path.startswith(above)] == []
    assert not (Path(REPO) / "ootd" / "app" / "train" / "models.py").exists()
