"""The compressed store of a batch's error messages: every text comes back exactly, in any order, and a
million-message batch holds a small fraction of the texts' size."""

from __future__ import annotations

import random

from ootd.app.batch.texts import TextStore


def test_every_text_comes_back_exactly_in_any_order() -> None:
    rng = random.Random(3)
    texts = ["", "a", "é ✓ 中文", "bad \udcff byte", "x" * 100, "y" * 5000]  # spanning blocks of 64 bytes too
    texts += ["".join(rng.choice("ab ,:/\n") for _ in range(rng.randrange(0, 300))) for _ in range(500)]
    store = TextStore(block=64)
    numbers = [store.add(text) for text in texts]
    assert numbers == list(range(len(texts))) and len(store) == len(texts)
    order = list(range(len(texts)))
    rng.shuffle(order)
    assert [store.get(n) for n in order] == [texts[n] for n in order]
    assert [store.get(n) for n in range(len(texts))] == texts


def test_messages_are_kept_compressed() -> None:
    store = TextStore()
    raw = 0
    for i in range(20000):
        text = f"person image people/missing{i:06d}.png: file not found"
        raw += len(text)
        store.add(text)
    held = sum(len(block) for block in store.blocks) + len(store.open)
    assert held < raw / 4, (held, raw)
    assert store.get(12345) == "person image people/missing012345.png: file not found"
