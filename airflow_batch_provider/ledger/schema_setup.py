"""The ledger's schema room: create the tables, upgrade an older ledger in place, check the version.

The tables, columns and indexes themselves are declared in :mod:`~airflow_batch_provider.ledger.schema`
(and :mod:`~airflow_batch_provider.ledger.indexes`); this room makes a database match them, safely
when many processes open a new ledger at once.
"""

from __future__ import annotations

import time
from typing import Final

from sqlalchemy import (
    inspect,
    select,
    text,
)
from sqlalchemy.exc import DBAPIError

from airflow_batch_provider.exceptions import (
    LedgerError,
)
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.indexes import add_missing_indexes, drop_replaced_indexes
from airflow_batch_provider.ledger.room import Room

#: PostgreSQL advisory lock held while the schema is created or upgraded (any constant will do;
#: this one is "abp:ledger" in ASCII).
SCHEMA_LOCK_KEY: Final = 0x6162703A6C6564


class SchemaRoom(Room):
    """Creating and upgrading the schema (a room of :class:`~airflow_batch_provider.ledger.Ledger`)."""

    def ensure_schema(self) -> None:
        """Create missing tables and check the schema version.

        Safe when many processes open a new ledger at once (the first lease and prepare tasks of
        concurrent runs do).

        On PostgreSQL the whole step runs under a session advisory lock, so a second process
        waits and then finds the tables (``CREATE TABLE`` of two sessions at once fails on the
        catalogue's unique index). On SQLite a racing creator's "already exists" is retried.

        :raises LedgerError: the database holds a newer schema than this package knows
        """
        if self.engine.dialect.name == "postgresql":
            with self.engine.connect() as lock:
                lock.execute(text("SELECT pg_advisory_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
                try:
                    self._ensure_schema()
                finally:
                    lock.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": SCHEMA_LOCK_KEY})
                    lock.commit()
            return
        for attempt in range(5):
            try:
                self._ensure_schema()
                return
            except DBAPIError:
                if attempt == 4:
                    raise
                time.sleep(0.05 * (attempt + 1))

    def _ensure_schema(self) -> None:
        s.metadata.create_all(self.engine)
        with self.engine.connect() as conn:
            found = conn.execute(select(s.meta.c.value).where(s.meta.c.key == "schema_version")).scalar()
        if found is not None and int(found) > s.SCHEMA_VERSION:
            raise LedgerError(
                f"ledger schema version {found} is newer than this package's {s.SCHEMA_VERSION}; "
                "upgrade airflow-batch-provider on every worker."
            )
        self._add_missing_columns()
        add_missing_indexes(self.engine)
        drop_replaced_indexes(self.engine)
        with self.engine.begin() as conn:
            if found is None:
                conn.execute(s.meta.insert().values(key="schema_version", value=str(s.SCHEMA_VERSION)))
            elif int(found) < s.SCHEMA_VERSION:
                conn.execute(
                    s.meta.update()
                    .where(s.meta.c.key == "schema_version", s.meta.c.value == found)
                    .values(value=str(s.SCHEMA_VERSION))
                )

    def _add_missing_columns(self) -> None:
        """Upgrade an older ledger in place: add the columns of :data:`schema.ADDED_COLUMNS` it lacks.

        Safe when several workers open the ledger at once: a column another one added meanwhile
        is accepted.
        """
        dialect = self.engine.dialect
        for table_name, names in s.ADDED_COLUMNS.items():
            present = {col["name"] for col in inspect(self.engine).get_columns(table_name)}
            for name in names:
                if name in present:
                    continue
                col = s.metadata.tables[table_name].c[name]
                ddl = f"ALTER TABLE {table_name} ADD COLUMN {name} {col.type.compile(dialect=dialect)}"
                if col.server_default is not None:
                    ddl += f" DEFAULT {col.server_default.arg} NOT NULL"  # type: ignore[attr-defined]
                try:
                    with self.engine.begin() as conn:
                        conn.execute(text(ddl))
                except DBAPIError:
                    now_present = {c["name"] for c in inspect(self.engine).get_columns(table_name)}
                    if name not in now_present:
                        raise

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the database."""
        with self.engine.connect() as conn:
            return int(
                conn.execute(select(s.meta.c.value).where(s.meta.c.key == "schema_version")).scalar_one()
            )
