"""What every room of the ledger stands on (``ledger/room.py``): the Ledger is its rooms, and no room hides another's method.

:class:`~airflow_batch_provider.ledger.Ledger` is one class made of mixins; Python's method
resolution would silently let one room's method shadow another's of the same name. These tests
hold the promise of the module's docstring: each room is a class of its own module, with the
methods of its one concern, reaching the database through the one engine.
"""

from __future__ import annotations

import inspect
import sys
from collections import defaultdict

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.room import Room


def rooms_of(ledger_class: type) -> list[type]:
    return [c for c in ledger_class.__mro__ if issubclass(c, Room) and c not in (Room, ledger_class)]


def shadowed(ledger_class: type) -> dict[str, list[str]]:
    """Each attribute that more than one room (or the class itself) defines, with who defines it."""
    defined: dict[str, list[str]] = defaultdict(list)
    for cls in (ledger_class, *rooms_of(ledger_class)):
        for name in vars(cls):
            if not (name.startswith("__") and name.endswith("__")):
                defined[name].append(cls.__name__)
    return {name: owners for name, owners in defined.items() if len(owners) > 1}


def test_the_ledger_is_its_rooms_each_of_its_own_module_and_no_two_define_the_same_method() -> None:
    rooms = rooms_of(Ledger)
    assert len(rooms) >= 10
    assert len({room.__module__ for room in rooms}) == len(rooms)
    assert shadowed(Ledger) == {}


def test_the_check_sees_a_room_that_would_hide_anothers_method() -> None:
    first, second = rooms_of(Ledger)[:2]
    name = next(n for n in vars(second) if not n.startswith("__"))
    hiding = type("HidingRoom", (Room,), {name: lambda self: None})
    composed = type("Composed", (hiding, first, second), {})
    assert shadowed(composed) == {name: ["HidingRoom", second.__name__]}


def test_every_room_reaches_the_database_through_the_one_engine_the_ledger_was_built_with() -> None:
    # no room takes its own arguments or makes an engine of its own: Room.__init__ is the one
    assert next(c for c in Ledger.__mro__ if "__init__" in vars(c)) is Room
    for room in rooms_of(Ledger):
        source = inspect.getsource(sys.modules[room.__module__])
        assert "create_engine(" not in source, room.__module__
