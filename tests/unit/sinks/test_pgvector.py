"""PgVectorSink against a real PostgreSQL with pgvector, the emulator's embeddings, real Airflow connections and hooks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError, VectorDimensionError
from airflow_batch_provider.ledger.candidates import Candidate
from airflow_batch_provider.ledger.deliveries import delivery_rows
from airflow_batch_provider.services.delivery import deliver
from airflow_batch_provider.sinks.pgvector import PgVectorSink
from tests.unit.services.workload import RUN, WORKLOAD, world
from tests.unit.sinks.target import CONN_ID, Target, bumped, publish_run, target_for

pytestmark = pytest.mark.postgres
DIMS = 8
RUN_2 = "manual__2026-12-01T00:00:00+00:00"
EMBED = PromptTemplate(
    version="emb-v1",
    model="text-embedding-3-small",
    kind="embedding",
    user="{{ text }}",
    params={"dimensions": DIMS},
    output_format="vector",
)


@pytest.fixture
def target(pgvector_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Target]:
    with target_for("postgresql", tmp_path, pgvector_server) as found:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", found.conn_json)
        yield found


def vectors_sink(dimensions: int = DIMS, **kwargs: Any) -> PgVectorSink:
    """The sink of these tests: each item's embedding into ``item_vectors`` by its id."""
    return PgVectorSink(
        conn_id=CONN_ID,
        table="item_vectors",
        dimensions=dimensions,
        key_columns=["item_id"],
        columns={"version": lambda r: r.prompt_version},
        batch_size=2,
        **{"create": True, **kwargs},
    )


def index_of(target: Target, name: str) -> tuple[Any, ...]:
    """An index's access method, its operator class and its options."""
    [found] = target.rows(
        "SELECT am.amname, oc.opcname, c.reloptions FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " JOIN pg_am am ON am.oid = c.relam JOIN pg_opclass oc ON oc.oid = i.indclass[0]"
        f" WHERE c.relname = '{name}'"
    )
    return found


def test_embeddings_land_in_a_created_vector_column_with_an_hnsw_index_once_each(
    tmp_path: Path, target: Target
) -> None:
    with world(tmp_path / "w") as w:
        publish_run(w, 5, prompt=EMBED)
        first = deliver(w.ledger, WORKLOAD, RUN, vectors_sink())
        assert (first.written, first.unchanged, first.refused) == (5, 0, 0)
        again = deliver(w.ledger, WORKLOAD, RUN, vectors_sink())  # the task cleared
        assert (again.written, again.unchanged) == (0, 5)
        answers = {
            r["app_id"]: json.loads(r["output_json"])
            for r in w.ledger.iter_items(WORKLOAD, RUN)
            if r["state"] == "succeeded"
        }
        records = delivery_rows(w.ledger, WORKLOAD, "item_vectors")
        assert {(r["state"], r["writes"]) for r in records} == {("delivered", 1)}
    assert target.rows(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = 'item_vectors'::regclass AND attname = 'embedding'"
    ) == [(f"vector({DIMS})",)]
    assert index_of(target, "item_vectors_embedding_hnsw_idx") == ("hnsw", "vector_cosine_ops", None)
    rows = target.rows("SELECT item_id, embedding::text, version FROM item_vectors ORDER BY item_id")
    assert [r[0] for r in rows] == [f"i{k}" for k in range(5)]
    for item_id, text_form, version in rows:
        assert json.loads(text_form) == pytest.approx(answers[item_id], abs=1e-6)
        assert version == "emb-v1"
    # each vector's nearest neighbour by cosine distance is its own row
    nearest = target.rows(
        "SELECT a.item_id, (SELECT b.item_id FROM item_vectors b ORDER BY b.embedding <=> a.embedding LIMIT 1)"
        " FROM item_vectors a ORDER BY a.item_id"
    )
    assert all(a == b for a, b in nearest)


def test_a_new_prompt_versions_vectors_update_each_row_and_add_none(tmp_path: Path, target: Target) -> None:
    with world(tmp_path / "w") as w:
        publish_run(w, 3, prompt=EMBED)
        assert deliver(w.ledger, WORKLOAD, RUN, vectors_sink()).written == 3
        publish_run(w, 3, RUN_2, bumped(EMBED, "emb-v2"))
        assert deliver(w.ledger, WORKLOAD, RUN_2, vectors_sink()).written == 3
        latest = {
            r["app_id"]: json.loads(r["output_json"])
            for r in w.ledger.iter_items(WORKLOAD, RUN_2)
            if r["state"] == "succeeded"
        }
    rows = target.rows("SELECT item_id, embedding::text, version FROM item_vectors ORDER BY item_id")
    assert [(r[0], r[2]) for r in rows] == [(f"i{k}", "emb-v2") for k in range(3)]
    for item_id, text_form, _ in rows:
        assert json.loads(text_form) == pytest.approx(latest[item_id], abs=1e-6)


def test_a_vector_of_another_dimension_fails_the_delivery_before_anything_is_written(
    tmp_path: Path, target: Target
) -> None:
    with world(tmp_path / "w") as w:
        publish_run(w, 3, prompt=EMBED)
        with pytest.raises(VectorDimensionError) as raised:
            deliver(w.ledger, WORKLOAD, RUN, vectors_sink(dimensions=16))
        message = str(raised.value)
        assert "item 'i0'" in message and "has 8 dimensions" in message and "expects 16" in message
        assert "Ask the model for 16 dimensions" in message and "dimensions=8" in message
        assert delivery_rows(w.ledger, WORKLOAD, "item_vectors") == []
    assert target.rows("SELECT to_regclass('item_vectors')") == [(None,)]  # not even created


def test_a_column_of_another_dimension_fails_the_delivery_before_anything_is_written(
    tmp_path: Path, target: Target
) -> None:
    target.execute("CREATE EXTENSION IF NOT EXISTS vector")
    target.execute("CREATE TABLE item_vectors (item_id TEXT PRIMARY KEY, embedding vector(4), version TEXT)")
    with world(tmp_path / "w") as w:
        publish_run(w, 3, prompt=EMBED)
        with pytest.raises(VectorDimensionError, match=r"item_vectors.embedding is vector\(4\).*expects 8"):
            deliver(w.ledger, WORKLOAD, RUN, vectors_sink(create=False))
        assert delivery_rows(w.ledger, WORKLOAD, "item_vectors") == []
    assert target.rows("SELECT count(*) FROM item_vectors") == [(0,)]


def test_a_missing_table_without_create_names_the_statement_to_run(tmp_path: Path, target: Target) -> None:
    with world(tmp_path / "w") as w:
        publish_run(w, 1, prompt=EMBED)
        with pytest.raises(
            ConfigurationError, match=r"no column item_vectors.embedding.*create=True"
        ) as raised:
            deliver(w.ledger, WORKLOAD, RUN, vectors_sink(create=False))
    assert "CREATE TABLE IF NOT EXISTS item_vectors (item_id TEXT NOT NULL, embedding vector(8)" in str(
        raised.value
    )


def test_an_ivfflat_index_is_created_with_its_lists_for_the_distance_asked(
    tmp_path: Path, target: Target
) -> None:
    with world(tmp_path / "w") as w:
        publish_run(w, 2, prompt=EMBED)
        sink = vectors_sink(index="ivfflat", distance="l2", index_options={"lists": 2})
        assert deliver(w.ledger, WORKLOAD, RUN, sink).written == 2
    assert index_of(target, "item_vectors_embedding_ivfflat_idx") == ("ivfflat", "vector_l2_ops", ["lists=2"])


def test_an_answer_that_is_not_a_vector_is_refused_with_its_reason_and_the_others_are_written() -> None:
    sink = vectors_sink()
    good = Candidate("k0", "i0", "v1", "succeeded", [0.5] * DIMS, None, None)
    row = sink.row_for(good)
    assert row.keys == {"item_id": "i0"} and row.values["embedding"] == "[" + ",".join(["0.5"] * DIMS) + "]"
    for bad in (None, {"label": "x"}, ["a"] * DIMS, [float("nan")] * DIMS):
        with pytest.raises(ValueError, match="not a list of finite numbers"):
            sink.row_for(Candidate("k1", "i1", "v1", "succeeded", bad, None, None))


def test_a_sink_that_pgvector_cannot_index_or_store_is_refused_when_built() -> None:
    with pytest.raises(ConfigurationError, match="dimensions=0"):
        vectors_sink(dimensions=0)
    with pytest.raises(ConfigurationError, match="above the 2000 that pgvector indexes with hnsw"):
        vectors_sink(dimensions=3072)
    assert vectors_sink(dimensions=3072, index=None).dimensions == 3072
    with pytest.raises(ConfigurationError, match=r"\['lists'\] are not hnsw options"):
        vectors_sink(index_options={"lists": 10})
    with pytest.raises(ConfigurationError, match="distance='dot'"):
        vectors_sink(distance="dot")
    with pytest.raises(ConfigurationError, match="not a plain SQL identifier"):
        vectors_sink(vector_column="embedding; DROP")


def test_a_pgvector_sink_declares_its_table_through_its_connection_for_lineage() -> None:
    from airflow_batch_provider.core.lineage import DatasetRef

    sink = PgVectorSink(conn_id="vector_db", table="public.comment_vectors", dimensions=8)
    assert sink.dataset == DatasetRef("table", "public.comment_vectors", "vector_db")
