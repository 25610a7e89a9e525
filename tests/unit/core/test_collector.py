"""The collector is kept off the objects that existed before a block, and given them back after it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from airflow_batch_provider.core.collector import old_objects_frozen


@pytest.fixture
def nothing_frozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_objects_that_exist_before_the_block_are_frozen_in_it_and_unfrozen_after_it(
    nothing_frozen: None,
) -> None:
    old = [[n] for n in range(1000)]
    with old_objects_frozen():
        assert gc.get_freeze_count() >= len(old)
    assert gc.get_freeze_count() == 0


def test_a_cycle_made_inside_the_block_is_collected_there(nothing_frozen: None) -> None:
    with old_objects_frozen():
        cycle: list[object] = []
        cycle.append(cycle)
        seen = id(cycle)
        del cycle
        gc.collect()
        assert seen not in {id(o) for o in gc.get_objects()}


def test_objects_frozen_before_the_block_stay_frozen_after_it(nothing_frozen: None) -> None:
    gc.freeze()
    before = gc.get_freeze_count()
    with old_objects_frozen():
        pass
    assert gc.get_freeze_count() >= before > 0


def test_the_objects_are_unfrozen_when_the_block_raises(nothing_frozen: None) -> None:
    with pytest.raises(RuntimeError), old_objects_frozen():
        raise RuntimeError("the delivery failed")
    assert gc.get_freeze_count() == 0
