"""Records from a Parquet file, read one row group at a time with only the columns the prompt uses.

No Airflow here: the prepare operator opens the file (local, or object storage through
``ObjectStoragePath``) and hands the binary file in. ``pyarrow`` is imported when a file is read
(the ``parquet`` extra).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

from airflow_batch_provider.core.lineage import DatasetRef
from airflow_batch_provider.exceptions import RecordSourceError
from airflow_batch_provider.services.records import SourceRecord
from airflow_batch_provider.services.source_values import row_record


@dataclass(frozen=True)
class ParquetSource:
    """The records of a Parquet file; a ``records=`` path ending in ``.parquet`` is one too.

    :param path: a local path or an object storage URL (templated)
    :param id_column: the column that holds the application id (default: the prompt's ``id_field``)
    :param conn_id: the object store's connection (default: the operator's ``records_conn_id``)
    :param columns: the columns read besides the id (default: the fields the prompt's template reads)
    :param batch_size: rows converted at a time within a row group
    """

    path: str
    id_column: str | None = None
    conn_id: str | None = None
    columns: Sequence[str] | None = None
    batch_size: int = 10_000

    @property
    def dataset(self) -> DatasetRef:
        """What it reads, for lineage: the file (its path unrendered)."""
        return DatasetRef("path", self.path)

    def describe(self) -> str:
        """The source in words, for messages."""
        return f"ParquetSource({self.path})"


def read_parquet(
    fh: IO[bytes],
    *,
    name: str,
    id_column: str,
    id_field: str,
    columns: Sequence[str],
    batch_size: int = 10_000,
) -> Iterator[SourceRecord]:
    """Read a Parquet file's rows as records, row group by row group, columns projected.

    :param fh: the file, opened in binary mode (seekable)
    :param name: the file's path or URL, for messages
    :param id_column: the column that holds the application id
    :param id_field: the prompt's id field (the id column's value is given under it too)
    :param columns: the other columns to read
    :param batch_size: rows converted at a time
    :raises RecordSourceError: the file lacks a column (the message names the file, the column and
        the columns it has)
    """
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(fh)
    has: list[str] = list(parquet.schema_arrow.names)
    wanted = list(dict.fromkeys([id_column, *columns]))
    missing = [c for c in wanted if c not in has]
    if missing:
        role = "the id column" if missing[0] == id_column else "a field the prompt reads"
        raise RecordSourceError(
            f"the Parquet file {name} has no column {missing[0]!r} ({role}); its columns are {has}. Rename "
            "the column, set ParquetSource(id_column=... / columns=...), or change the template."
        )
    position = 0
    for group in range(parquet.num_row_groups):
        row = 0
        for batch in parquet.iter_batches(batch_size=batch_size, row_groups=[group], columns=wanted):
            rows: list[dict[str, Any]] = batch.to_pylist()
            for value in rows:
                row += 1
                where = f"row group {group}, row {row} ({id_column} {value.get(id_column)!r})"
                yield row_record(
                    value, id_column=id_column, id_field=id_field, position=position, where=where
                )
                position += 1
