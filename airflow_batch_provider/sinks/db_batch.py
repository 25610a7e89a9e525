"""A batch of DB-API statements committed as one transaction, and what counts as the database refusing a row.

Shared by the one-row writer (:mod:`airflow_batch_provider.sinks.sql`) and the multi-row one
(:mod:`airflow_batch_provider.sinks.pg_batch`): a refused batch is rolled back and retried row by
row by its writer; any other database error is raised.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

#: DB-API exception classes that mean "the database refused this row" (not "the database failed").
REFUSALS: Final = frozenset({"DataError", "IntegrityError"})
#: MySQL and MariaDB errors of a row refused for its values that mysqlclient raises as
#: ``OperationalError`` (it maps only some codes to ``DataError``): 1292 a value that is not a date
#: or number, 1366 a value that is not of the column's type, 3819 MySQL's CHECK, 4025 MariaDB's CHECK.
MYSQL_REFUSALS: Final = frozenset({1292, 1366, 3819, 4025})


def refused_by_database(exc: BaseException) -> bool:
    """Whether ``exc`` is the database refusing a row (a type or constraint error).

    :param exc: the exception a driver raised
    """
    if any(cls.__name__ in REFUSALS for cls in type(exc).__mro__):
        return True
    mysql = type(exc).__module__.split(".")[0] == "MySQLdb"
    return mysql and bool(exc.args) and exc.args[0] in MYSQL_REFUSALS


def write_batch(conn: Any, run: Callable[[Any], object]) -> bool:
    """Run ``run(cursor)`` and commit: ``True``; the database refused a row (rolled back): ``False``.

    :param conn: the DB-API connection
    :param run: the batch's statements, on a cursor of ``conn``
    :raises Exception: any other database error, after the rollback
    """
    cursor = conn.cursor()
    try:
        run(cursor)
        conn.commit()
        return True
    except Exception as exc:
        conn.rollback()
        if not refused_by_database(exc):
            raise
        return False
    finally:
        cursor.close()
