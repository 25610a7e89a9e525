"""A test DAG: comments in a PostgreSQL table -> embeddings -> a pgvector table with an HNSW index.

The comments are read from the connection ``vector_db`` (table ``comments``) and their vectors go
into ``comment_vectors`` (created with its HNSW index on the first delivery) through a
``PgVectorSink``, keyed on the comment id.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.pipeline import batch_inference_group
from airflow_batch_provider.services.sources_sql import SqlSource
from airflow_batch_provider.sinks import PgVectorSink

DIMENSIONS = 64

with DAG(
    dag_id="comment_vectors",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["test"],
):
    batch_inference_group(
        workload="comment_vectors",
        records=SqlSource(conn_id="vector_db", table="comments", id_column="comment_id", page_size=4),
        prompt=PromptTemplate(
            version="emb-v1",
            model="text-embedding-3-small",
            kind="embedding",
            user="{{ body }}",
            params={"dimensions": DIMENSIONS},
            output_format="vector",
        ),
        batch_conn_id="openai_batch_default",
        max_attempts=1,
        sinks=[
            PgVectorSink(
                conn_id="vector_db",
                table="comment_vectors",
                dimensions=DIMENSIONS,
                key_columns=["comment_id"],
                key_type=int,
                create=True,
                index="hnsw",
                index_options={"m": 8, "ef_construction": 32},
                batch_size=4,
            )
        ],
    )
