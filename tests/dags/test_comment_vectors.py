"""Comment embeddings from the emulator's batch API into a pgvector table with an HNSW index, then queried.

Real Airflow (``airflow dags test``, then ``airflow tasks test`` of the delivery task as a cleared
try), the real ``openai`` SDK over HTTP to the emulator, a real PostgreSQL with pgvector behind a
``postgres`` Airflow connection. The emulator's embeddings are hashed bags of words, so comments
that share words are near each other: the three topics below share no words, and a comment's
nearest neighbours are the other comments of its topic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.deliveries import delivery_rows
from batch_emulator.model import embed
from tests.support.airflow_run import openai_dag_env, run_airflow, tail

pytestmark = [pytest.mark.airflow_e2e, pytest.mark.postgres]
DAGS = Path(__file__).parent / "dags"
DAG_ID = WORKLOAD = "comment_vectors"
TOPICS = {
    "refund": (
        "refund money back slow payment",
        "refund still missing money payment",
        "waiting weeks refund payment money",
        "refund request money slow bank",
        "payment refund never arrived money",
    ),
    "battery": (
        "battery drains charger phone",
        "battery dies fast phone charger",
        "phone battery overheats charger",
        "charger broken battery phone dead",
        "battery life phone charger poor",
    ),
    "delivery": (
        "courier parcel late shipping",
        "parcel arrived late courier damaged",
        "shipping slow courier parcel lost",
        "late parcel courier shipping box",
        "courier lost parcel shipping tracking",
    ),
}
COMMENTS = {
    100 + i: (topic, body)
    for i, (topic, body) in enumerate((topic, body) for topic, bodies in TOPICS.items() for body in bodies)
}
NEAREST = """
SELECT b.comment_id FROM comment_vectors b WHERE b.comment_id <> :id
ORDER BY b.embedding <=> (SELECT a.embedding FROM comment_vectors a WHERE a.comment_id = :id) LIMIT 4
"""


def test_comment_vectors_land_once_in_an_hnsw_indexed_table_and_their_neighbours_share_a_topic(
    airflow_home: dict[str, str], tmp_path: Path, pgvector_server: Any
) -> None:
    name = pgvector_server.create_database("comment_vectors")
    engine = create_engine(pgvector_server.url_for(name))
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE comments (comment_id INTEGER PRIMARY KEY, body TEXT)"))
            conn.execute(
                text("INSERT INTO comments VALUES (:i, :b)"),
                [{"i": i, "b": b} for i, (_, b) in COMMENTS.items()],
            )
        db = {"conn_type": "postgres", "host": "127.0.0.1", "port": pgvector_server.port, "login": "postgres"}
        vector_db = {**db, "schema": name}
        with openai_dag_env(airflow_home, tmp_path, dags=DAGS, connections={"vector_db": vector_db}) as (
            _,
            env,
        ):
            proc = run_airflow(env, "dags", "test", DAG_ID)
            assert proc.returncode == 0, tail(proc)
            ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
            [run] = ledger.runs(WORKLOAD)
            # the delivery task cleared and run again: nothing written twice
            again = run_airflow(
                env, "tasks", "test", DAG_ID, f"{WORKLOAD}.deliver_comment_vectors", run["run_id"]
            )
            assert again.returncode == 0, tail(again)
            assert (
                "0 rows written, 15 unchanged (already delivered), 0 refused" in again.stdout + again.stderr
            )

        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT comment_id, embedding::text FROM comment_vectors ORDER BY 1")
            ).all()
            kind = conn.execute(
                text(
                    "SELECT am.amname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                    " JOIN pg_am am ON am.oid = c.relam WHERE i.indrelid = 'comment_vectors'::regclass"
                    " AND NOT i.indisprimary"
                )
            ).scalar_one()
            conn.execute(text("SET enable_seqscan = off"))  # the planner would scan 15 rows otherwise
            plan = "\n".join(r[0] for r in conn.execute(text("EXPLAIN " + NEAREST), {"id": 100}))
            neighbours = {
                i: [COMMENTS[n][0] for n in conn.execute(text(NEAREST), {"id": i}).scalars()]
                for i in COMMENTS
            }
            query = "[" + ",".join(repr(v) for v in embed("where is my refund money", 64)) + "]"
            closest = (
                conn.execute(
                    text(
                        "SELECT comment_id FROM comment_vectors ORDER BY embedding <=> CAST(:q AS vector) LIMIT 3"
                    ),
                    {"q": query},
                )
                .scalars()
                .all()
            )
        assert [r[0] for r in rows] == sorted(COMMENTS)  # each comment once
        answers = {
            r["app_id"]: json.loads(r["output_json"])
            for r in ledger.iter_items(WORKLOAD, run["run_id"])
            if r["state"] == "succeeded"
        }
        for comment_id, vector in rows:
            assert json.loads(vector) == pytest.approx(answers[str(comment_id)], abs=1e-6)
        assert kind == "hnsw" and "comment_vectors_embedding_hnsw_idx" in plan, plan
        for comment_id, topics in neighbours.items():
            assert topics == [COMMENTS[comment_id][0]] * 4, (comment_id, topics)
        assert {COMMENTS[c][0] for c in closest} == {"refund"}
        recorded = delivery_rows(ledger, WORKLOAD, "comment_vectors")
        assert len(recorded) == len(COMMENTS)
        assert {(r["state"], r["writes"]) for r in recorded} == {("delivered", 1)}
        report = json.loads(ledger.runs(WORKLOAD)[0]["report_json"])
        assert report["deliveries"]["comment_vectors"]["delivered"] == len(COMMENTS)
    finally:
        engine.dispose()
        pgvector_server.drop_database(name)
