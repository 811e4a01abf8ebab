"""The Ray actor pool's feeding and retries, against a stand-in for Ray that runs each call at once."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from ootd.app.batch.ray_pool import ActorPool, Lost


class Died(Exception):
    """What Ray raises for a call whose actor's process died."""


class FakeRay:
    """ray.wait/get/kill over calls already run: a reference is the call's outcome (a value, or Died)."""

    exceptions = SimpleNamespace(RayActorError=Died)

    def __init__(self) -> None:
        self.killed: list[int] = []

    def wait(self, refs: list[Any], num_returns: int, timeout: float) -> tuple[list[Any], list[Any]]:
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref: Any) -> Any:
        if isinstance(ref.outcome, Died):
            raise ref.outcome
        return ref.outcome

    def kill(self, actor: int) -> None:
        self.killed.append(actor)


class Ref:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome


def make_pool(dies: dict[int, int], size: int = 2, max_attempts: int = 3) -> tuple[ActorPool, FakeRay, list]:
    """A pool whose actor dies on item i's first dies[i] attempts; calls records (actor, item, attempt)."""
    ray, calls, ids = FakeRay(), [], itertools.count()

    def call(actor: int, item: int, attempt: int) -> Ref:
        calls.append((actor, item, attempt))
        return Ref(Died(f"actor {actor} died") if attempt <= dies.get(item, 0) else item * 10)

    return ActorPool(ray, lambda: next(ids), call, size, max_attempts, key=lambda item: item), ray, calls


def test_every_item_once_in_order_of_finishing_and_the_actors_killed_at_the_end() -> None:
    pool, ray, calls = make_pool({})
    assert list(pool.results(range(5))) == [(i, i * 10) for i in range(5)]
    assert pool.attempts == {} and pool.started == 5
    assert sorted(ray.killed) == [0, 1]  # the two actors, nothing replaced


def test_a_dead_actor_is_replaced_and_its_item_retried_until_the_bound() -> None:
    pool, ray, calls = make_pool({1: 1, 2: 5}, max_attempts=3)
    results = dict(pool.results(range(4)))
    assert results[0] == 0 and results[1] == 10 and results[3] == 30
    assert results[2] == Lost(3, "actor 4 died")  # three attempts, then reported, not run a fourth time
    assert pool.attempts == {1: 2, 2: 3}
    tries = [(actor, attempt) for actor, item, attempt in calls if item == 2]
    assert [attempt for _, attempt in tries] == [1, 2, 3]
    actors = [actor for actor, _ in tries]
    assert len(set(actors)) == 3 and set(actors) <= set(ray.killed)  # each on a fresh actor, each dead one killed


def test_items_are_taken_only_as_actors_free_up() -> None:
    """The driver holds a pool's worth of items, not the batch: an endless source still streams."""
    taken = itertools.count()

    def endless() -> Iterator[int]:
        while True:
            yield next(taken)

    pool, _, _ = make_pool({}, size=3)
    results = pool.results(endless())
    first = [next(results) for _ in range(100)]
    assert [item for item, _ in first] == list(range(100))
    assert next(taken) <= 100 + 3  # at most one item ahead per actor
    results.close()


@pytest.mark.parametrize("size", [1, 4])
def test_fewer_items_than_actors(size: int) -> None:
    pool, _, _ = make_pool({}, size=size)
    assert list(pool.results([7])) == [(7, 70)]
