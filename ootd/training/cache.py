"""The training cache: what every epoch reads, made once by `ootd train prepare` (docs/training.md).

    CACHE/index.json                 what the cache is for (model type, resolution, framing), its pairs and split
    CACHE/entries/<key>.safetensors  one pair: the latents of the target (the person photo, times the VAE scaling
                                     factor), of the masked person and of the garment, the garment's prompt
                                     embedding (its CLIP image embedding joined to the text part, docs/upstream.md
                                     §3), and the mask at the working resolution
    CACHE/images/<key>.person.png    the framed photos of a held-out pair, for the validation sheets and their SSIM
    CACHE/images/<key>.garment.png

An entry's key is a hash of what determines its numbers (the model, the resolution, the framing, the category and
the bytes of the person, garment and mask files), never of where the files were: the same pairs give the same
entries whichever layout listed them, and a rerun finds its finished entries by key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ootd.errors import UsageError, printable
from ootd.imaging.atomic import write_atomic, write_text_atomic
from ootd.weights.layout import file_sha256  # noqa: F401 - a pair's files hashed as the weights' (prepare's import)

if TYPE_CHECKING:
    import torch

CACHE_FORMAT = "ootd-train-cache"
CACHE_VERSION = 1
ENTRY_TENSORS = ("target", "masked", "garment", "prompt", "mask")
KEY_CHARS = 32


def entry_key(*parts: str) -> str:
    """The key of an entry from the words that determine its numbers."""
    text = "\0".join([CACHE_FORMAT, str(CACHE_VERSION), *parts])
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:KEY_CHARS]


@dataclass(frozen=True)
class CacheEntry:
    """One prepared pair as the index lists it."""

    key: str
    person: str  # the person photo as the data listed it (for messages and sheets)
    garment: str
    category: str
    person_id: str  # who the person is: the person photo's sha256 (the split never divides one)
    split: str = "train"  # train or val


@dataclass
class CacheIndex:
    """What a cache holds; written last by each prepare, atomically."""

    model_type: str
    resolution: str
    fit: str
    entries: list[CacheEntry] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "row N (source): problem" of the bad rows
    format: str = CACHE_FORMAT
    version: int = CACHE_VERSION

    def split(self, name: str) -> list[CacheEntry]:
        return [e for e in self.entries if e.split == name]

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def entry_path(cache: Path, key: str) -> Path:
    return cache / "entries" / f"{key}.safetensors"


def image_paths(cache: Path, key: str) -> tuple[Path, Path]:
    return cache / "images" / f"{key}.person.png", cache / "images" / f"{key}.garment.png"


def write_entry(cache: Path, key: str, tensors: dict[str, torch.Tensor]) -> Path:
    """One entry, complete or absent."""
    from safetensors.torch import save

    data = save({name: tensors[name].detach().to("cpu").contiguous() for name in ENTRY_TENSORS},
                metadata={"ootd": f"{CACHE_FORMAT} {CACHE_VERSION}"})  # one key: several have no fixed order
    path = entry_path(cache, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, lambda handle: handle.write(data), overwrite=True)


def read_entry(cache: Path, key: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = entry_path(cache, key)
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - a missing or damaged entry: rerun prepare
        raise UsageError(f"training cache entry {printable(path)} cannot be read ({str(exc).splitlines()[0]}); "
                         "run `ootd train prepare` again on this cache") from None
    missing = [name for name in ENTRY_TENSORS if name not in tensors]
    if missing:
        raise UsageError(f"training cache entry {printable(path)} lacks {', '.join(missing)}; run `ootd train "
                         "prepare` again on this cache")
    return tensors


def write_index(cache: Path, index: CacheIndex) -> Path:
    return write_text_atomic(cache / "index.json", index.to_json())


def read_index(cache: str | Path) -> CacheIndex:
    """A cache's index, or one UsageError saying why the folder is not a usable cache."""
    path = Path(cache) / "index.json"
    if not path.is_file():
        raise UsageError(f"{printable(cache)} is not a training cache (no index.json): make one with "
                         "`ootd train prepare DATA -o CACHE`")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != CACHE_FORMAT or data.get("version") != CACHE_VERSION:
            raise ValueError(f"format {data.get('format')!r} version {data.get('version')!r}")
        entries = [CacheEntry(**e) for e in data.pop("entries")]
        return CacheIndex(**{k: v for k, v in data.items() if k != "entries"}, entries=entries)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise UsageError(f"{printable(path)} is not a training cache index this ootd reads ({exc}); run "
                         "`ootd train prepare` again") from None
