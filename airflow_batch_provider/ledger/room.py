"""What every room of the ledger stands on: the engine of the ledger's database.

:class:`~airflow_batch_provider.ledger.Ledger` is one class made of rooms (mixins); each room is a
class of its own module with the methods of one concern, and reaches the database through
:attr:`Room.engine`.
"""

from __future__ import annotations

from sqlalchemy import Engine


class Room:
    """The base of the ledger's rooms.

    :param engine: a SQLAlchemy engine (SQLite or PostgreSQL)
    """

    engine: Engine

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
