"""The PNG record's key names live in two modules: the typed record that writes them (ootd/app/tryon/record.py) and
provenance.py, which reads a PNG's text back (issue 34). The reader helpers are tested here, and a scan of ootd/'s
source keeps the keys from spreading again: a record read anywhere else (`record["seed"]`, `text.get("sample")`,
`"sample" in record`) fails with its file and line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ootd.app.tryon.config import RunConfig
from ootd.app.tryon.passes import PASS_NAMES
from ootd.app.tryon.provenance import (
    RecordedInputs,
    is_intermediate_record,
    recorded_inputs,
    recorded_seed,
    setting_changes,
)
from ootd.app.tryon.record import (
    COMPARED_SETTINGS,
    INPUT_KEYS,
    PIXEL_SETTINGS,
    PassRecord,
    Record,
    comparable,
    mask_record,
)
from ootd.settings import Category, FitMode, ModelType, OutputSize, PhotoOutput, SamplingSettings
from ootd.speedups.modes import SpeedModes
from ootd.weights.lora import LoraChoice
from tests.helpers import REPO


def _pass(name: str = "", seed: int = 7, steps: int = 20, lora: LoraChoice | None = None,
          person: str = "p.png", photo: PhotoOutput | None = None) -> PassRecord:
    config = RunConfig(Path("ckpt"), sampling=SamplingSettings(seed=seed, steps=steps), speed=SpeedModes(),
                       fit=FitMode.PAD, lora=lora, photo=photo or PhotoOutput())
    return PassRecord(ModelType.DC, Category.LOWER if name == "lower" else Category.UPPER, config, person,
                      f"{name or 'g'}.png", "auto", 0.9, name)


def _text(sample: int | None = 0, **changes: object) -> dict[str, str]:
    """One garment's PNG text as the job writes it (sample None: an intermediate picture)."""
    return Record(_pass(**changes), device="cpu", precision="fp32", attention="sdpa", sample=sample).text()


def _every_key() -> set[str]:
    """Every key a record writes: an outfit's picture (each pass's keys) with an adapter, a classified category,
    the photo's size, threads and a sample number; and `ootd mask`'s record."""
    lora = LoraChoice(Path("adapter.safetensors"), 0.5, "ab12")
    passes = tuple(_pass(name, lora=lora, photo=PhotoOutput(OutputSize.PHOTO, True, 8)) for name in PASS_NAMES)
    record = Record(passes[-1], passes, "cpu", "fp32", "sdpa", 0, "4")
    keys = set(record.text()) | set(mask_record("p.png", Category.UPPER, ModelType.HD, RunConfig(Path("ckpt"))))
    assert {f"{PASS_NAMES[0]}_seed", "lora_sha256", "output_size", "category_p", "threads", "sample"} <= keys
    return keys


# ------------------------------------------------------------------------------------------- the helpers


def test_an_intermediate_is_ours_without_a_sample_number() -> None:
    assert not is_intermediate_record(_text(sample=0))
    assert is_intermediate_record(_text(sample=None))
    assert not is_intermediate_record({"sample": "0"})  # not ours: another program's text
    assert not is_intermediate_record({})


def test_the_inputs_a_record_names() -> None:
    assert recorded_inputs(_text(person="alice.jpg")) == RecordedInputs("alice.jpg", "g.png", "auto")
    assert recorded_inputs({}) == RecordedInputs("", "", "")
    assert set(INPUT_KEYS) <= set(_text()) and set(INPUT_KEYS) <= set(PIXEL_SETTINGS)


def test_the_seed_is_read_as_written() -> None:
    assert recorded_seed(_text(seed=1234)) == "1234"
    assert recorded_seed({}) == ""
    assert recorded_seed({"seed": "x"}) == "x"  # resume counts a word that is not a number as a seed of its own
    passes = tuple(_pass(name, seed=5) for name in PASS_NAMES)
    outfit = Record(passes[-1], passes, sample=0).text()
    assert recorded_seed(comparable(outfit)) == outfit[f"{PASS_NAMES[0]}_seed"]  # what resume reads of an outfit


def test_setting_changes_name_settings_not_inputs_and_fill_in_what_old_records_meant() -> None:
    a = _text(steps=20, person="a.png")
    b = _text(steps=30, person="b.png", lora=LoraChoice(Path("x.safetensors"), 0.5, "ff"))
    assert setting_changes(a, b) == {"steps": ("20", "30"), "lora_sha256": ("none", "ff"),
                                     "lora_scale": ("none", "0.5"), "lora": ("none", "x.safetensors")}
    assert setting_changes(a, a) == {}
    assert list(setting_changes({}, {"steps": "1"})) == ["steps"]  # a key neither records is not a change
    assert setting_changes({"steps": "1"}, {})["steps"] == ("1", "unknown")
    assert not set(COMPARED_SETTINGS) & set(INPUT_KEYS) and "lora" in COMPARED_SETTINGS


# --------------------------------------------------------------------------------------------- the guard

OWNERS = ("ootd/app/tryon/record.py", "ootd/app/tryon/provenance.py")  # where the keys are spelt
READ_ON = re.compile("text|record|info|meta", re.IGNORECASE)  # the names a record is read from
# (file, the name read from): places that read one of the record's words from something else, and why
ALLOWED = {
    ("ootd/weights/lora.py", "metadata"): "a LoRA file's safetensors header, which names its model type",
}


def _name(node: ast.expr) -> str:
    """The name a key is read from: `text`, `self.info`'s `info`, `read_record(p)`'s `read_record`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, (ast.Call, ast.Subscript)):
        return _name(node.func if isinstance(node, ast.Call) else node.value)
    return ""


def record_reads(source: str, keys: set[str]) -> list[tuple[int, str, str]]:
    """(line, key, name read from) of each record key read as `name[key]`, `name.get(key)` (pop, setdefault) or
    `key in name` on a name that looks like a record."""
    def key(node: ast.expr) -> str | None:
        return node.value if isinstance(node, ast.Constant) and node.value in keys else None

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and key(node.slice):
            read = (key(node.slice), _name(node.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
              and node.func.attr in ("get", "pop", "setdefault") and key(node.args[0])):
            read = (key(node.args[0]), _name(node.func.value))
        elif (isinstance(node, ast.Compare) and key(node.left) and isinstance(node.ops[0], (ast.In, ast.NotIn))):
            read = (key(node.left), _name(node.comparators[0]))
        else:
            continue
        if READ_ON.search(read[1]):
            found.append((node.lineno, *read))
    return sorted(found)


def test_the_guard_finds_record_reads_and_only_those() -> None:
    keys = {"sample", "seed", f"{PASS_NAMES[0]}_seed"}
    source = ('a = record["seed"]; b = text.get("sample", ""); c = "sample" not in read_record(p)\n'
              f'd = self.meta.pop("{PASS_NAMES[0]}_seed"); e = options["seed"]; f = form.get("sample")\n'
              'g = record["steps_done"]; h = record.get(name)\n')
    assert record_reads(source, keys) == [(1, "sample", "read_record"), (1, "sample", "text"), (1, "seed", "record"),
                                          (2, f"{PASS_NAMES[0]}_seed", "meta")]


def test_record_keys_are_read_only_in_the_record_and_provenance() -> None:
    keys = _every_key()
    found = []
    for path in sorted((REPO / "ootd").rglob("*.py")):
        where = path.relative_to(REPO).as_posix()
        if where in OWNERS:
            continue
        found += [f"{where}:{line}: {name}[{key!r}]" for line, key, name in record_reads(path.read_text("utf-8"), keys)
                  if (where, name) not in ALLOWED]
    assert not found, ("record keys read outside record.py/provenance.py (use a provenance.py helper):\n"
                       + "\n".join(found))
