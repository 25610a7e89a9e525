"""The interpreter tuned for a loop that makes many short-lived objects on several threads.

A delivery reads, maps and records answers on three threads, one batch at each step
(:mod:`airflow_batch_provider.services.delivery`). Three process-wide settings are changed while
one runs (:func:`tuned_for_bulk_loop`):

- **The collector kept off the process's old objects** (``gc.freeze``). A task process holds
  Airflow, SQLAlchemy and the drivers: hundreds of thousands of objects that live as long as it
  does. Each of the collector's older-generation passes a delivery triggers walks every one of them
  again (measured: a third of a delivery's own CPU time per row). They are given back after.
- **The youngest generation collected every** :data:`YOUNG_OBJECTS` **new objects, not 700.** A
  page of a thousand answers is some thousands of dicts and lists alive at once; at 700 the
  collector walks them several times a page, finds nothing (they are freed by their counts), and
  moves them to the older generations it then walks again.
- **The interpreter lock handed to a waiting thread after** :data:`SWITCH_INTERVAL` **seconds,
  not 5 ms.** The sink's thread comes back from the database five times a batch (``BEGIN``,
  ``COPY``'s two steps, the write, ``COMMIT``) and each time waits for the lock while the
  delivery's thread maps answers in Python; at 5 ms a wait, those waits were the sink's longest
  step.

What is set is the tighter of the process's setting and this one (a shorter interval, a larger
threshold), set when the first such block begins and given back as it was when the last one ends
(blocks on several threads overlap). Nothing else changes: a cycle made in the block is
collected as usual, a collector turned off stays off.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

#: The youngest generation's threshold while a bulk loop runs (new container objects between passes).
YOUNG_OBJECTS: Final = 10_000
#: Seconds a thread holds the interpreter lock while another waits for it, while a bulk loop runs.
SWITCH_INTERVAL: Final = 0.0005


@dataclass(frozen=True)
class _Saved:
    """The process's settings before the first block: given back when the last one ends."""

    threshold: tuple[int, int, int]
    interval: float
    frozen_before: bool


_guard = threading.Lock()
_blocks = 0
_saved: _Saved | None = None


@contextmanager
def tuned_for_bulk_loop() -> Iterator[None]:
    """Tune the interpreter for the ``with`` block (see the module); give the settings back after it.

    Where something froze objects before (a process forked from a frozen parent), they stay frozen
    after the block, with those frozen by it: ``gc.unfreeze`` cannot tell them apart.
    """
    _begin()
    try:
        yield
    finally:
        _end()


def _begin() -> None:
    global _blocks, _saved
    with _guard:
        _blocks += 1
        if _blocks > 1:
            return
        threshold = gc.get_threshold()
        interval = sys.getswitchinterval()
        _saved = _Saved(threshold, interval, gc.get_freeze_count() > 0)
        gc.freeze()
        young, *older = threshold
        if young:  # 0: the process turned generational collection off; left so
            gc.set_threshold(max(young, YOUNG_OBJECTS), *older)
        sys.setswitchinterval(min(interval, SWITCH_INTERVAL))


def _end() -> None:
    global _blocks, _saved
    with _guard:
        _blocks -= 1
        if _blocks or _saved is None:
            return
        saved, _saved = _saved, None
        sys.setswitchinterval(saved.interval)
        gc.set_threshold(*saved.threshold)
        if not saved.frozen_before:
            gc.unfreeze()
