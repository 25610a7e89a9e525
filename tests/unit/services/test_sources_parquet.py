"""A Parquet file is read row group by row group, columns projected, bad rows rejected with their place."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batch_provider.exceptions import RecordSourceError
from airflow_batch_provider.services.sources_parquet import read_parquet


def write(path: Path, rows: int, row_group_size: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = [None if i == 6 else f"r{i}" for i in range(rows)]
    table = pa.table({"key": ids, "text": [f"t{i}" for i in range(rows)], "wide": ["x" * 100] * rows})
    pq.write_table(table, path, row_group_size=row_group_size)


def test_rows_come_in_file_order_projected_to_the_id_and_the_prompts_fields(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    write(path, 10, 4)
    with path.open("rb") as fh:
        records = list(
            read_parquet(fh, name=str(path), id_column="key", id_field="id", columns=["text"], batch_size=3)
        )
    assert [r.position for r in records] == list(range(10))
    assert records[0].value == {"key": "r0", "text": "t0", "id": "r0"}  # "wide" is not read
    bad = [r for r in records if r.problem is not None]
    assert len(bad) == 1 and bad[0].problem is not None
    code, reason = bad[0].problem
    assert code == "missing_id" and reason.startswith("row group 1, row 3 ")


def test_a_missing_id_column_names_the_file_the_column_and_the_columns_it_has(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    write(path, 2, 2)
    with (
        path.open("rb") as fh,
        pytest.raises(
            RecordSourceError,
            match=r"in.parquet has no column 'id' \(the id column\); its columns are \['key', 'text', 'wide'\]",
        ),
    ):
        next(read_parquet(fh, name=str(path), id_column="id", id_field="id", columns=["text"]))


def test_a_parquet_source_declares_its_file_for_lineage() -> None:
    from airflow_batch_provider.core.lineage import DatasetRef
    from airflow_batch_provider.services.sources_parquet import ParquetSource

    source = ParquetSource("s3://exports/{{ ds }}/tickets.parquet", conn_id="aws_default")
    assert source.dataset == DatasetRef("path", "s3://exports/{{ ds }}/tickets.parquet")
