from __future__ import annotations

from dataclasses import FrozenInstanceError, fields

import pytest

from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.records import (
    ITEM_SHAPES,
    JOB_ID_MAX,
    ItemRow,
    JobRow,
    job_id_for,
    sync_job_id,
)


def test_a_short_job_id_keeps_the_readable_form_of_earlier_versions() -> None:
    assert job_id_for("feedback", "scheduled__2026-01-01T00:00:00+00:00", 2, 7) == (
        "feedback:scheduled__2026-01-01T00:00:00+00:00:r2:c00007"
    )
    assert sync_job_id("feedback", "manual__1") == "feedback:manual__1:sync"


@pytest.mark.parametrize("workload_len", [8, 150, 200])
def test_a_job_id_never_exceeds_the_column_and_stays_deterministic_and_distinct(workload_len: int) -> None:
    workload = "w" * workload_len
    run_a = "backfill__" + "2026-01-01T00:00:00+00:00_" * 10 + "a"
    run_b = run_a[:-1] + "b"
    a = job_id_for(workload, run_a, 12, 99999)
    assert len(a) <= JOB_ID_MAX and len(sync_job_id(workload, run_a)) <= JOB_ID_MAX
    assert a == job_id_for(workload, run_a, 12, 99999)
    assert a != job_id_for(workload, run_b, 12, 99999)
    assert a != job_id_for(workload, run_a, 12, 99998)
    assert a.endswith(":r12:c99999")
    assert a.startswith(workload[:100])


def test_a_long_run_id_keeps_its_start_readable() -> None:
    job_id = job_id_for("feedback", "manual__" + "x" * 300, 1, 0)
    assert job_id.startswith("feedback:manual__xxx")
    assert "~" in job_id and len(job_id) == JOB_ID_MAX


def test_the_job_id_limit_is_the_columns_length() -> None:
    for column in (s.jobs.c.job_id, s.items.c.job_id, s.attempts.c.job_id):
        assert column.type.length == JOB_ID_MAX  # type: ignore[attr-defined]


def test_typed_rows_name_exactly_the_columns_of_their_tables() -> None:
    assert {f.name for f in fields(JobRow)} == {c.name for c in s.jobs.columns}
    assert {f.name for f in fields(ItemRow)} == {c.name for c in s.items.columns}


def test_a_typed_row_is_frozen_and_built_from_a_mapping_with_extra_keys() -> None:
    row = ItemRow.from_row({c.name: None for c in s.items.columns} | {"extra": 1, "state": "review"})
    assert row.state == "review"
    with pytest.raises(FrozenInstanceError):
        row.state = "pending"  # type: ignore[misc]


def test_every_item_shape_names_only_columns_of_the_items_table_and_its_key() -> None:
    columns = {c.name for c in s.items.columns}
    for shape in ITEM_SHAPES:
        names = {f.name for f in fields(shape)}
        assert names <= columns, shape.__name__
        assert {"item_key", "prompt_version"} <= names, shape.__name__
