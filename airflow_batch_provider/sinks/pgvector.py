"""``PgVectorSink``: a workload's embeddings into a pgvector ``vector(n)`` column, once per item.

The rows are written by :class:`~airflow_batch_provider.sinks.sql.SqlUpsertSink`'s code (the same
``INSERT ... ON CONFLICT (keys) DO UPDATE``, one transaction per batch, a refused batch retried row
by row): this module adds only what is particular to vectors.

- **The dimension is checked before anything is written.** Every answer's vector is measured when
  its row is made, before its batch goes to the database, and an answer of another length fails
  the delivery with :class:`~airflow_batch_provider.exceptions.VectorDimensionError` (naming the
  item, the dimension expected and found, and the remedy). The column's own dimension is read
  from the catalogue before the first batch: a ``vector(m)`` column with ``m`` other than
  ``dimensions`` fails the same way, and so does a table or column that is not there (unless
  ``create=True``).
- **The table, the extension and the index are created when asked** (``create=True``): ``CREATE
  EXTENSION IF NOT EXISTS vector``, the table with its key and ``vector(n)`` column, and an HNSW or
  IVFFlat index for the distance the queries use, each ``IF NOT EXISTS``, right before the first
  batch (after that batch's vectors were checked), so that a wrong dimension creates nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from airflow_batch_provider.core.json_path import parse_path, read_path
from airflow_batch_provider.core.lineage import DatasetRef
from airflow_batch_provider.exceptions import ConfigurationError, VectorDimensionError
from airflow_batch_provider.ledger.candidates import Candidate
from airflow_batch_provider.services.delivery import RowWriter, SinkRow
from airflow_batch_provider.sinks.sql import ColumnSource, SqlUpsertSink

#: The operator class of each distance, for the index (``<=>``, ``<->``, ``<#>`` in queries).
OPCLASSES: Final = {"cosine": "vector_cosine_ops", "l2": "vector_l2_ops", "inner_product": "vector_ip_ops"}
#: The index options each method takes.
INDEX_OPTIONS: Final = {"hnsw": frozenset({"m", "ef_construction"}), "ivfflat": frozenset({"lists"})}
#: The most dimensions pgvector stores in a ``vector`` column, and indexes with HNSW or IVFFlat.
MAX_DIMENSIONS: Final = 16_000
MAX_INDEXED_DIMENSIONS: Final = 2_000
POSTGRES_TYPES: Final = frozenset({"postgres", "postgresql"})


@dataclass(frozen=True)
class PgVectorSink:
    """Write each item's embedding into a ``vector(dimensions)`` column of a PostgreSQL table.

    :param conn_id: a ``postgres`` connection (the database has, or may create, the ``vector``
        extension)
    :param table: the target table (``schema.table`` allowed)
    :param dimensions: the length of the model's vectors and of the column (``vector(n)``)
    :param key_columns: the key: the first column gets the application id, a second (where the
        table keeps versions) the prompt version
    :param vector_column: the ``vector`` column
    :param vector: JSON path to the vector in the answer (``"$"``: the answer is the vector)
    :param columns: other columns written beside the vector: column -> JSON path or callable,
        as for :class:`~airflow_batch_provider.sinks.sql.SqlUpsertSink` (created as ``TEXT``)
    :param create: create the extension, the table and the index when they are not there
    :param index: ``hnsw``, ``ivfflat`` or ``None`` (no index); only with ``create=True``
    :param distance: what the index orders by: ``cosine`` (``<=>``), ``l2`` (``<->``) or
        ``inner_product`` (``<#>``)
    :param index_options: the index's ``WITH (...)``: ``m``, ``ef_construction`` (HNSW) or
        ``lists`` (IVFFlat)
    :param name: the name deliveries are recorded under and the task is named after
        (``deliver_<name>``); default: the table name
    :param batch_size: rows per transaction
    :param key_type: converts the application id for the key column (e.g. ``int``: the created
        key column is then ``BIGINT``, else ``TEXT``)
    """

    conn_id: str
    table: str
    dimensions: int
    key_columns: Sequence[str] = ("id",)
    vector_column: str = "embedding"
    vector: str = "$"
    columns: Mapping[str, ColumnSource] = field(default_factory=dict)
    create: bool = False
    index: Literal["hnsw", "ivfflat"] | None = "hnsw"
    distance: Literal["cosine", "l2", "inner_product"] = "cosine"
    index_options: Mapping[str, int] = field(default_factory=dict)
    name: str | None = None
    batch_size: int = 1000
    key_type: Callable[[str], Any] = str
    _rows: SqlUpsertSink = field(init=False, repr=False, compare=False)
    _path: tuple[str | int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        what = f"PgVectorSink(table={self.table!r})"
        if not isinstance(self.dimensions, int) or not 1 <= self.dimensions <= MAX_DIMENSIONS:
            raise ConfigurationError(
                f"{what}: dimensions={self.dimensions!r}; give the length of the model's vectors, "
                f"1 to {MAX_DIMENSIONS} (e.g. the prompt's params dimensions)."
            )
        if self.index not in (None, "hnsw", "ivfflat"):
            raise ConfigurationError(f"{what}: index={self.index!r}; use 'hnsw', 'ivfflat' or None.")
        if self.distance not in OPCLASSES:
            raise ConfigurationError(f"{what}: distance={self.distance!r}; use one of {sorted(OPCLASSES)}.")
        if self.index is not None and self.dimensions > MAX_INDEXED_DIMENSIONS:
            raise ConfigurationError(
                f"{what}: dimensions={self.dimensions} is above the {MAX_INDEXED_DIMENSIONS} that pgvector "
                f"indexes with {self.index}; ask the model for fewer dimensions or pass index=None."
            )
        if self.index is not None:
            unknown = sorted(set(self.index_options) - INDEX_OPTIONS[self.index])
            if unknown:
                raise ConfigurationError(
                    f"{what}: index_options {unknown} are not {self.index} options; use "
                    f"{sorted(INDEX_OPTIONS[self.index])}."
                )
            for option, value in self.index_options.items():
                if not isinstance(value, int) or value < 1:
                    raise ConfigurationError(
                        f"{what}: index_options {option}={value!r}; give a whole number >= 1."
                    )
        if self.vector_column in self.columns:
            raise ConfigurationError(
                f"{what}: column {self.vector_column!r} is the vector column; map it once."
            )
        object.__setattr__(self, "_path", parse_path(self.vector))
        rows = SqlUpsertSink(
            conn_id=self.conn_id,
            table=self.table,
            key_columns=self.key_columns,
            columns={self.vector_column: self._vector_text, **self.columns},
            name=self.name,
            batch_size=self.batch_size,
            key_type=self.key_type,
        )
        object.__setattr__(self, "_rows", rows)
        object.__setattr__(self, "key_columns", rows.key_columns)

    @property
    def sink_name(self) -> str:
        """The name deliveries are recorded under (``name``, else the table's name)."""
        return self._rows.sink_name

    @property
    def dataset(self) -> DatasetRef:
        """What it writes, for lineage: the table."""
        return self._rows.dataset

    def row_for(self, result: Candidate) -> SinkRow:
        """Map one answer to its row, its vector checked against ``dimensions``.

        :param result: the answer
        :raises VectorDimensionError: the answer's vector has another length
        """
        return self._rows.row_for(result)

    def _vector_text(self, result: Candidate) -> str:
        """The answer's vector in pgvector's text form (``[0.1,0.2,...]``)."""
        value = read_path(result.output, self._path)
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
            value = value[0]  # one input's embedding list
        if not isinstance(value, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value
        ):
            raise ValueError(
                f"item {result.app_id!r}: the answer at {self.vector!r} is not a list of finite numbers "
                f"({type(value).__name__}); point vector= at the embedding in the answer"
            )
        if len(value) != self.dimensions:
            raise VectorDimensionError(
                f"item {result.app_id!r} (prompt version {result.prompt_version!r}): the model's vector has "
                f"{len(value)} dimensions and sink {self.sink_name!r} expects {self.dimensions} "
                f"({self.table}.{self.vector_column} vector({self.dimensions})); nothing of this batch was "
                f"written. Ask the model for {self.dimensions} dimensions (the prompt's params "
                f"dimensions), or give the sink dimensions={len(value)} and a column of that size."
            )
        return "[" + ",".join(repr(float(v)) for v in value) + "]"

    @contextmanager
    def open(self) -> Iterator[RowWriter]:
        """Open the connection's hook for one delivery; the table is checked (or created) first."""
        from airflow_batch_provider.hooks.sql import sql_connection_hook

        hook, conn_type = sql_connection_hook(self.conn_id, "a PgVectorSink")
        if conn_type.lower() not in POSTGRES_TYPES:
            raise ConfigurationError(
                f"sink {self.sink_name!r}: connection {self.conn_id!r} is of type {conn_type!r}; a "
                "PgVectorSink writes into PostgreSQL with the vector extension: give it a postgres "
                "connection (or use a SqlUpsertSink for other databases)."
            )
        dbapi = hook.get_conn()
        try:
            yield _VectorWriter(self, dbapi, self._rows.writer(dbapi, hook.placeholder))
        finally:
            dbapi.close()

    def ddl(self) -> list[str]:
        """The statements ``create=True`` runs: the extension, the table, the index (all ``IF NOT EXISTS``)."""
        keys = list(self.key_columns)
        types = ["BIGINT" if self.key_type is int else "TEXT", "TEXT"]
        cols = [f"{k} {types[i]} NOT NULL" for i, k in enumerate(keys)]
        cols.append(f"{self.vector_column} vector({self.dimensions}) NOT NULL")
        cols.extend(f"{c} TEXT" for c in self.columns)
        out = [
            "CREATE EXTENSION IF NOT EXISTS vector",
            f"CREATE TABLE IF NOT EXISTS {self.table} ({', '.join(cols)}, PRIMARY KEY ({', '.join(keys)}))",
        ]
        if self.index is not None:
            options = ", ".join(f"{k} = {int(v)}" for k, v in sorted(self.index_options.items()))
            out.append(
                f"CREATE INDEX IF NOT EXISTS {self.index_name()} ON {self.table} USING {self.index} "
                f"({self.vector_column} {OPCLASSES[self.distance]})"
                + (f" WITH ({options})" if options else "")
            )
        return out

    def index_name(self) -> str:
        """The created index's name (``<table>_<column>_<method>_idx``, at most 63 characters)."""
        base = self.table.rsplit(".", 1)[-1]
        return f"{base}_{self.vector_column}_{self.index}_idx"[:63]


#: The type and declared dimension of a column (``atttypmod`` is a vector's dimension, -1: none).
_COLUMN_SQL: Final = (
    "SELECT t.typname, a.atttypmod FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
    "WHERE a.attrelid = to_regclass(%s) AND a.attname = %s AND NOT a.attisdropped"
)


@dataclass
class _VectorWriter:
    """Check (or create) the table before the first batch, then write as the SQL sink does."""

    sink: PgVectorSink
    conn: Any
    rows: RowWriter
    ready: bool = False

    def write(self, rows: Sequence[SinkRow]) -> dict[int, str]:
        if not self.ready:
            self._prepare()
            self.ready = True
        return self.rows.write(rows)

    def _prepare(self) -> None:
        sink = self.sink
        cursor = self.conn.cursor()
        try:
            if sink.create:
                for statement in sink.ddl():
                    cursor.execute(statement)
                self.conn.commit()
            cursor.execute(_COLUMN_SQL, (sink.table, sink.vector_column))
            found = cursor.fetchone()
            self.conn.commit()
        finally:
            cursor.close()
        where = f"{sink.table}.{sink.vector_column}"
        if found is None:
            raise ConfigurationError(
                f"sink {sink.sink_name!r}: there is no column {where} in the database of connection "
                f"{sink.conn_id!r}; create it ({'; '.join(sink.ddl()[1:])}) or give the sink create=True."
            )
        type_name, typmod = str(found[0]), int(found[1])
        if type_name != "vector":
            raise ConfigurationError(
                f"sink {sink.sink_name!r}: column {where} is of type {type_name}, not vector; give the sink "
                f"a vector({sink.dimensions}) column (vector_column=...)."
            )
        if typmod not in (-1, sink.dimensions):
            raise VectorDimensionError(
                f"sink {sink.sink_name!r}: column {where} is vector({typmod}) and the sink expects "
                f"{sink.dimensions} dimensions; nothing was written. Give the sink dimensions={typmod} "
                f"(and the model as many), or alter the column to vector({sink.dimensions})."
            )
