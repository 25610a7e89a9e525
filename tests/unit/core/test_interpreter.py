"""The interpreter is tuned for a bulk loop's block, and given its settings back as they were after it."""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator

import pytest

from airflow_batch_provider.core.interpreter import SWITCH_INTERVAL, YOUNG_OBJECTS, tuned_for_bulk_loop


@pytest.fixture
def as_python_starts() -> Iterator[None]:
    """Nothing frozen, the default threshold and interval; put back as they were after the test."""
    threshold, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    sys.setswitchinterval(0.005)
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    sys.setswitchinterval(interval)


def test_the_objects_that_exist_before_the_block_are_frozen_in_it_and_unfrozen_after_it(
    as_python_starts: None,
) -> None:
    old = [[n] for n in range(1000)]
    with tuned_for_bulk_loop():
        assert gc.get_freeze_count() >= len(old)
    assert gc.get_freeze_count() == 0


def test_a_cycle_made_inside_the_block_is_collected_there(as_python_starts: None) -> None:
    with tuned_for_bulk_loop():
        cycle: list[object] = []
        cycle.append(cycle)
        seen = id(cycle)
        del cycle
        gc.collect()
        assert seen not in {id(o) for o in gc.get_objects()}


def test_objects_frozen_before_the_block_stay_frozen_after_it(as_python_starts: None) -> None:
    gc.freeze()
    before = gc.get_freeze_count()
    with tuned_for_bulk_loop():
        pass
    assert gc.get_freeze_count() >= before > 0


def test_the_young_threshold_and_the_switch_interval_are_the_loops_in_the_block_and_as_before_after_it(
    as_python_starts: None,
) -> None:
    with tuned_for_bulk_loop():
        assert gc.get_threshold() == (YOUNG_OBJECTS, 10, 10)
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)
    assert gc.get_threshold() == (700, 10, 10)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_process_setting_tighter_than_the_loops_is_kept_and_a_collector_turned_off_stays_off(
    as_python_starts: None,
) -> None:
    gc.set_threshold(50_000, 20, 20)
    sys.setswitchinterval(SWITCH_INTERVAL / 2)
    with tuned_for_bulk_loop():
        assert gc.get_threshold() == (50_000, 20, 20)
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL / 2)
    gc.set_threshold(0)
    with tuned_for_bulk_loop():
        assert gc.get_threshold()[0] == 0
    assert gc.get_threshold()[0] == 0


def test_the_settings_are_given_back_when_the_block_raises(as_python_starts: None) -> None:
    with pytest.raises(RuntimeError), tuned_for_bulk_loop():
        raise RuntimeError("the delivery failed")
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == (700, 10, 10)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_overlapping_blocks_on_two_threads_give_the_settings_back_only_when_the_last_one_ends(
    as_python_starts: None,
) -> None:
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[tuple[tuple[int, int, int], float]] = []

    def second() -> None:
        first_in.wait(10)
        with tuned_for_bulk_loop():
            second_in.set()
            first_out.wait(10)  # the first block has ended; this one still runs
            seen.append((gc.get_threshold(), sys.getswitchinterval()))

    other = threading.Thread(target=second)
    other.start()
    with tuned_for_bulk_loop():
        first_in.set()
        assert second_in.wait(10)
    first_out.set()
    other.join(10)
    [(threshold, interval)] = seen
    assert threshold == (YOUNG_OBJECTS, 10, 10)
    assert interval == pytest.approx(SWITCH_INTERVAL)
    assert gc.get_threshold() == (700, 10, 10)
    assert sys.getswitchinterval() == pytest.approx(0.005)
    assert gc.get_freeze_count() == 0
