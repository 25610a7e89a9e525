"""Connection -> ledger. Without a connection, the embedded SQLite ledger is used."""

from __future__ import annotations

from functools import cache
from typing import Any

from airflow.sdk import BaseHook

from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.settings import default_ledger_url


@cache
def _open(url: str) -> Ledger:
    return Ledger.from_url(url)


def url_from_connection(conn: Any) -> str:
    """Build a SQLAlchemy URL from an Airflow connection.

    ``postgres`` connections become ``postgresql+psycopg2://``; ``sqlite`` connections use the
    host as the file path; any other type must carry a full SQLAlchemy URL in ``extra.url``.

    :param conn: an Airflow connection
    """
    from sqlalchemy.engine import URL

    extra = conn.extra_dejson or {}
    if extra.get("url"):
        return str(extra["url"])
    if conn.conn_type in ("postgres", "postgresql"):
        return URL.create(
            "postgresql+psycopg2",
            username=conn.login or None,
            password=conn.password or None,
            host=conn.host or None,
            port=conn.port or None,
            database=conn.schema or None,
            query={k: str(v) for k, v in extra.items() if k in ("sslmode", "application_name")},
        ).render_as_string(hide_password=False)
    if conn.conn_type == "sqlite":
        return f"sqlite:///{conn.host}"
    raise ConfigurationError(
        f"ledger connection {conn.conn_id!r} has type {conn.conn_type!r}; use a 'postgres' or 'sqlite' "
        'connection, or put a SQLAlchemy URL in its extra as {"url": "..."}.'
    )


class LedgerHook(BaseHook):
    """Open the ledger named by a connection, or the embedded default.

    :param ledger_conn_id: a ``postgres`` or ``sqlite`` connection; ``None`` for the embedded
        SQLite ledger (``[batch_provider] ledger_url`` or ``$AIRFLOW_HOME/batch_ledger.sqlite``)
    """

    conn_name_attr = "ledger_conn_id"
    default_conn_name = "batch_ledger_default"
    conn_type = "batch_ledger"
    hook_name = "LLM Batch Ledger"

    def __init__(self, ledger_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ledger_conn_id = ledger_conn_id

    def url(self) -> str:
        """Return the ledger's SQLAlchemy URL (with credentials; never log it)."""
        if not self.ledger_conn_id:
            return default_ledger_url()
        return url_from_connection(self.get_connection(self.ledger_conn_id))

    def get_conn(self) -> Ledger:
        """Return the ledger (one engine per URL per process)."""
        return _open(self.url())

    def test_connection(self) -> tuple[bool, str]:
        """Connect to the ledger's database without creating anything and report its schema.

        :return: ``(True, dialect and schema version)`` or ``(False, why not)``; never the password
        """
        from sqlalchemy import create_engine, inspect, select

        from airflow_batch_provider.ledger import schema

        where = repr(self.ledger_conn_id) if self.ledger_conn_id else "the embedded default"
        try:
            engine = create_engine(self.url())
            try:
                with engine.connect() as conn:
                    if schema.meta.name not in inspect(conn).get_table_names():
                        return True, f"ledger {where} ({engine.dialect.name}) is reachable; no ledger yet"
                    version = conn.execute(
                        select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")
                    ).scalar()
            finally:
                engine.dispose()
        except Exception as exc:  # the button reports every failure as text
            return False, f"ledger {where} is unreachable: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        return True, f"ledger {where} ({engine.dialect.name}) is reachable; schema version {version}"
