"""The schema room: many processes opening a new ledger at once find one schema."""

from __future__ import annotations

import threading

from airflow_batch_provider.ledger import Ledger


def test_many_processes_opening_a_new_ledger_at_once_all_find_one_schema(ledger_url: str) -> None:
    opened: list[Ledger] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def open_ledger() -> None:
        start.wait()
        try:
            opened.append(Ledger.from_url(ledger_url))
        except BaseException as exc:  # the test reports it
            errors.append(exc)

    for _round in range(3):  # each round on the same database: the later ones find it made
        threads = [threading.Thread(target=open_ledger) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors
    assert len(opened) == 18
    assert {ledger.schema_version for ledger in opened} == {opened[0].schema_version}
    for ledger in opened:
        ledger.engine.dispose()
