"""Upgrade steps: create the indexes an older ledger lacks, drop those a later version replaced.

(:data:`~airflow_batch_provider.ledger.schema.ADDED_INDEXES`,
:data:`~airflow_batch_provider.ledger.schema.DROPPED_INDEXES`.)

``metadata.create_all`` creates a missing table with every index, but adds no index to a table
that exists. Each index is its own idempotent step (``CREATE INDEX IF NOT EXISTS``), so workers
opening the ledger at once, or a later version adding more, need nothing else.
"""

from __future__ import annotations

from sqlalchemy import Index, inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.schema import CreateIndex

from airflow_batch_provider.ledger import schema as s


def _index(name: str) -> Index:
    for table in s.metadata.tables.values():
        for index in table.indexes:
            if index.name == name:
                return index
    raise KeyError(f"index {name!r} of ADDED_INDEXES is declared on no table of the schema")


def add_missing_indexes(engine: Engine) -> list[str]:
    """Create each index of :data:`~airflow_batch_provider.ledger.schema.ADDED_INDEXES` the ledger lacks.

    :param engine: the ledger's engine
    :return: the indexes created
    """
    made: list[str] = []
    inspector = inspect(engine)
    for name in s.ADDED_INDEXES:
        index = _index(name)
        table = index.table
        assert table is not None
        if name in {ix["name"] for ix in inspector.get_indexes(table.name)}:
            continue
        with engine.begin() as conn:
            conn.execute(CreateIndex(index, if_not_exists=True))
        made.append(name)
    return made


def drop_replaced_indexes(engine: Engine) -> list[str]:
    """Drop each index of :data:`~airflow_batch_provider.ledger.schema.DROPPED_INDEXES` the ledger has.

    ``DROP INDEX IF EXISTS``: workers opening the ledger at once drop it once between them.

    :param engine: the ledger's engine
    :return: the indexes dropped
    """
    inspector = inspect(engine)
    dropped: list[str] = []
    for name, table in s.DROPPED_INDEXES.items():
        if name not in {ix["name"] for ix in inspector.get_indexes(table)}:
            continue
        with engine.begin() as conn:
            conn.execute(text(f"DROP INDEX IF EXISTS {name}"))
        dropped.append(name)
    return dropped
