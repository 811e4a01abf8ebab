"""Many short texts (a batch's error messages) kept compressed, so 10^6 of them hold tens of MB, not hundreds.

A message is a Python string of ~50 bytes of overhead plus its text; a million of them, with the dict that
finds them, is ~250 MB. Here texts are appended to a buffer that is zlib-compressed a block at a time (error
messages repeat most of their words, ~5-10x smaller), and each text is found by its number: two array entries.
Reading one back decompresses its block (a few µs; the last block read is kept), so texts read in the order they
were written cost one decompression a block.
"""

from __future__ import annotations

import zlib
from array import array

BLOCK = 16 * 1024  # bytes of text per compressed block


class TextStore:
    """Append-only texts, each found again by the number `add` returned."""

    def __init__(self, block: int = BLOCK) -> None:
        self.block = block
        self.blocks: list[bytes] = []  # sealed, compressed
        self.open = bytearray()  # the block being filled
        self.starts = array("q")  # text number -> offset in the whole (uncompressed) stream
        self.sizes = array("i")  # text number -> its size in bytes
        self._cached: tuple[int, bytes] | None = None  # (block number, its bytes): the last block read

    def __len__(self) -> int:
        return len(self.starts)

    def add(self, text: str) -> int:
        data = text.encode("utf-8", "surrogateescape")
        self.starts.append(len(self.blocks) * self.block + len(self.open))
        self.sizes.append(len(data))
        self.open += data
        while len(self.open) >= self.block:  # a text may span blocks
            self.blocks.append(zlib.compress(bytes(self.open[:self.block]), 6))
            del self.open[:self.block]
        return len(self.starts) - 1

    def get(self, number: int) -> str:
        start, size = self.starts[number], self.sizes[number]
        data = bytearray()
        while size > 0:
            block, offset = divmod(start, self.block)
            take = min(size, self.block - offset)
            data += self._block(block)[offset:offset + take]
            start, size = start + take, size - take
        return data.decode("utf-8", "surrogateescape")

    def _block(self, number: int) -> bytes:
        if number == len(self.blocks):
            return bytes(self.open)
        if self._cached is None or self._cached[0] != number:
            self._cached = (number, zlib.decompress(self.blocks[number]))
        return self._cached[1]
