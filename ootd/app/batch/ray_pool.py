"""A pool of Ray actors fed one item at a time: driver memory bounded by the pool, not by the batch.

Each actor runs one item at a time, so an actor that dies (killed, out of memory, its node lost) costs exactly
the item it was running: the pool replaces the actor and gives the item to the replacement, up to
`max_attempts` attempts in all, then reports the item as lost instead of running it again. Items are taken
from an iterator only when an actor is free, and a result is handed on (and dropped here) as soon as it
arrives, so what the driver holds is a few object references per actor whatever the batch's length.

Why not Ray Data's actor pool: it keeps per-block bookkeeping in the driver for the whole run (with one item
per block, needed for the point above, ~7.5 KB per item, over 1 GB at 10^5 items). Why not
`ray.util.ActorPool`: a failed result does not say which item it held, so the item cannot be retried.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")

WAIT_S = 1.0  # ray.wait in slices, so Ctrl-C and SIGTERM are handled while the actors work


@dataclasses.dataclass(frozen=True)
class Lost:
    """An item whose actor died on each of its attempts."""

    attempts: int
    reason: str


def death_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """Ray's errors that mean the actor's process or node died (the item itself may be fine)."""
    names = ("RayActorError", "WorkerCrashedError", "OutOfMemoryError", "NodeDiedError", "ObjectLostError")
    return tuple(getattr(ray.exceptions, name) for name in names if hasattr(ray.exceptions, name))


class ActorPool(Generic[Item]):
    """`size` actors made by `make()`, each running `call(actor, item, attempt)` (a Ray object reference)."""

    def __init__(self, ray: Any, make: Callable[[], Any], call: Callable[[Any, Item, int], Any], size: int,
                 max_attempts: int, key: Callable[[Item], Any]) -> None:
        self.ray, self.make, self.call, self.size = ray, make, call, size
        self.max_attempts, self.key = max_attempts, key
        self.attempts: dict[Any, int] = {}  # key -> attempts started, for the items tried more than once
        self.started = 0  # attempts started in all
        self._dead = death_errors(ray)

    def results(self, items: Iterable[Item]) -> Iterator[tuple[Item, Any]]:
        """(item, its result, or `Lost`) as each finishes; the actors are killed when this ends or is closed."""
        ray = self.ray
        todo: Iterator[Item] = iter(items)
        retries: deque[tuple[Item, int]] = deque()
        actors = [self.make() for _ in range(self.size)]
        pending: dict[Any, tuple[int, Item, int]] = {}  # reference -> (actor slot, item, attempt)

        def feed(slot: int) -> None:
            if retries:
                item, attempt = retries.popleft()
            else:
                item = next(todo, _END)
                if item is _END:
                    return
                attempt = 1
            self.started += 1
            if attempt > 1:
                self.attempts[self.key(item)] = attempt
            pending[self.call(actors[slot], item, attempt)] = (slot, item, attempt)

        try:
            for slot in range(self.size):
                feed(slot)
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=WAIT_S)
                if not ready:
                    continue
                slot, item, attempt = pending.pop(ready[0])
                try:
                    result = ray.get(ready[0])
                except self._dead as exc:
                    with contextlib.suppress(Exception):
                        ray.kill(actors[slot])
                    actors[slot] = self.make()
                    if attempt < self.max_attempts:
                        retries.append((item, attempt + 1))
                        feed(slot)
                        continue
                    result = Lost(attempt, " ".join(str(exc).split())[:300])
                feed(slot)
                yield item, result
        finally:
            for actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)


_END: Any = object()
