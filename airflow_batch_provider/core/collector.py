"""The garbage collector kept off a process's old objects while a loop makes many short-lived ones.

A task process holds Airflow, SQLAlchemy and the drivers: hundreds of thousands of objects that
live as long as it does. A delivery makes and drops a few objects per answer; each of the
collector's older-generation passes it triggers walks every one of those old objects again
(measured: a third of a delivery's own CPU time per row). :func:`old_objects_frozen` moves the
objects that exist when it starts out of the collector's reach (``gc.freeze``) and gives them back
when it ends; what the loop makes is collected as usual.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def old_objects_frozen() -> Iterator[None]:
    """Freeze the objects that exist now for the ``with`` block; unfreeze them after it.

    Where something froze objects before (a process forked from a frozen parent), they stay frozen
    after the block, with those frozen by it: ``gc.unfreeze`` cannot tell them apart.
    """
    frozen_before = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()
