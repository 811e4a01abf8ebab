"""An open file that fails its writes as a test needs (a full device: disk.py; a process killed mid-write:
kill_in_write.py) and is the file itself in everything else."""

from __future__ import annotations


class FailingHandle:
    """The file `handle` but for `write`, which a subclass makes fail its own way."""

    def __init__(self, handle) -> None:  # noqa: ANN001
        self._handle = handle

    def write(self, data) -> int:  # noqa: ANN001
        raise NotImplementedError

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._handle, name)

    def __enter__(self):  # noqa: ANN204
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()
