"""The transitions room: the one guarded function that writes an item's state."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.ledger import Ledger, bulk, items, store
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.store import Moved
from airflow_batch_provider.ledger.transitions import guarded_transition
from tests.unit.ledger.store_support import (
    WL,
    first_run_all_succeeded,
    item,
    prep,
)

# ---------------------------------------------------------------------------------------------- guarded transition


def test_the_guard_in_sql_refuses_a_move_the_caller_did_not_check(ledger: Ledger) -> None:
    first_run_all_succeeded(ledger, ["a", "b"])
    ledger.upsert_items(WL, "r1", [prep("c")])
    rows = [
        {"b_workload": WL, "b_key": item_key(a), "b_version": "v1", "state": "staged", "job_id": "j"}
        for a in ("a", "b", "c")
    ]
    with ledger.engine.begin() as conn:
        moved = guarded_transition(conn, utcnow(), rows=rows)
    assert moved == Moved(moved=1, refused=2)
    assert [item(ledger, a)["state"] for a in "abc"] == ["succeeded", "succeeded", "staged"]
    assert item(ledger, "a")["job_id"] != "j"


def test_a_stale_read_loses_the_compare_and_set(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    ledger.reject_items(WL, "r1", [(prep("a"), "a", "too_long", "over the limit")])  # a concurrent writer
    row = {
        "b_workload": WL,
        "b_key": item_key("a"),
        "b_version": "v1",
        "b_from": "pending",
        "state": "staged",
    }
    with ledger.engine.begin() as conn:
        assert guarded_transition(conn, utcnow(), rows=[row]) == Moved(moved=0, refused=1)
    assert item(ledger, "a")["state"] == "review"


def test_a_set_transition_counts_what_it_left_where_it_was(ledger: Ledger) -> None:
    first_run_all_succeeded(ledger, ["a"])
    ledger.upsert_items(WL, "r1", [prep("b")])
    with ledger.engine.begin() as conn:
        moved = guarded_transition(conn, utcnow(), target="skipped", where=s.items.c.workload == WL)
    assert moved == Moved(moved=1, refused=1)


#: The rooms that were ``ledger/store.py`` before the split: none updates ``abp_items`` but the guard.
STORE_ROOMS = (
    "bulk",
    "costs",
    "item_reads",
    "items",
    "jobs",
    "leases",
    "result_rules",
    "results",
    "review",
    "room",
    "rounds",
    "run_rows",
    "schema_setup",
    "store",
    "sync_attempts",
    "transitions",
)


def _item_updates(tree: ast.AST) -> Iterator[tuple[str, bool]]:
    """(function, whether the update may set ``state``) for every ``s.items.update()`` in a module."""
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "values"
                and "s.items.update()" in ast.unparse(node.func.value)
            ):
                continue
            names = {kw.arg for kw in node.keywords}
            # a ** mapping may hold anything: counted as a state write
            yield fn.name, "state" in names or None in names or bool(node.args)


def test_nothing_but_the_guarded_transition_writes_an_item_state() -> None:
    """Every ``UPDATE abp_items`` of the store's rooms is inside the guard, and no module of the ledger
    but the guard sets an item's state (the others move an item to another run, never its state)."""
    folder = Path(store.__file__).parent
    writers: set[str] = set()
    state_writers: set[tuple[str, str]] = set()
    for path in sorted(folder.glob("*.py")):
        source = path.read_text()
        for fn, sets_state in _item_updates(ast.parse(source)):
            if path.stem in STORE_ROOMS:
                writers.add(fn)
            if sets_state:
                state_writers.add((path.stem, fn))
        assert "bulk_update(conn, s.items" not in source, path.name
    assert writers == {"guarded_transition"}
    assert state_writers == {("transitions", "guarded_transition")}
    assert {p.stem for p in folder.glob("*.py")} >= set(STORE_ROOMS)


def test_a_compare_and_set_from_a_state_that_cannot_reach_the_target_is_refused(ledger: Ledger) -> None:
    first_run_all_succeeded(ledger, ["a"])
    row = {
        "b_workload": WL,
        "b_key": item_key("a"),
        "b_version": "v1",
        "b_from": "succeeded",
        "state": "staged",
    }
    with ledger.engine.begin() as conn:
        assert guarded_transition(conn, utcnow(), rows=[row]) == Moved(moved=0, refused=1)
    assert item(ledger, "a")["state"] == "succeeded"


def test_a_staged_transition_refuses_moves_the_states_forbid_and_stale_reads_in_sql(ledger: Ledger) -> None:
    """The set-based form (``UPDATE ... FROM`` a staging table) is guarded like the others."""
    first_run_all_succeeded(ledger, ["a"])
    ledger.upsert_items(WL, "r1", [prep("b"), prep("c")])
    staged = [
        (item_key("a"), "v1", "succeeded", "submitted", "x", "r1", None, None, None, None),  # forbidden move
        (item_key("b"), "v1", "pending", "staged", "x", "r1", None, None, None, None),  # allowed
        (item_key("c"), "v1", "staged", "submitted", "x", "r1", None, None, None, None),  # stale read
    ]
    with ledger.engine.begin() as conn:
        bulk.stage(conn, items.ITEMS_STAGE, staged)
        moved = guarded_transition(
            conn, utcnow(), staged=items.ITEMS_STAGE, workload=WL, targets={"pending", "staged", "submitted"}
        )
    assert moved == Moved(moved=1, refused=2)
    assert [item(ledger, k)["state"] for k in ("a", "b", "c")] == ["succeeded", "staged", "pending"]
