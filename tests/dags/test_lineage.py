"""OpenLineage events of a real DAG run: the prepare task names its source as an input, deliver its sink as an output.

Real Airflow (``airflow dags test``) with Airflow's OpenLineage provider installed, its listener
writing every event to a file (the provider's ``file`` transport); the emulator's batch API, a real
PostgreSQL behind a ``postgres`` connection, a SQLite file behind a ``sqlite`` one. What is asserted
is what the provider emitted, read back from that file: nothing here calls the operators' lineage
methods.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.support.airflow_run import openai_dag_env, run_airflow, tail

pytestmark = [pytest.mark.airflow_e2e, pytest.mark.postgres]
DAGS = Path(__file__).parent / "dags"
DAG_ID = "lineage_two_ways"
SECRET = "s3cr3t-pw"


def events_of(path: Path, task_id: str) -> dict[str, dict[str, Any]]:
    """The START and COMPLETE events of one task (``{dag_id}.{task_id}``), by event type.

    :param path: the file transport's file
    :param task_id: the task's id, with its group
    """
    found: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        if event.get("job", {}).get("name") == f"{DAG_ID}.{task_id}" and event.get("eventType"):
            found[event["eventType"]] = event
    return found


def names(datasets: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(d["namespace"], d["name"]) for d in datasets]


def test_the_prepare_task_reports_its_source_and_the_deliver_task_its_sink_through_the_provider(
    airflow_home: dict[str, str], postgres_server: Any, tmp_path: Path
) -> None:
    database = postgres_server.create_database()
    engine = create_engine(postgres_server.url_for(database))
    events = tmp_path / "openlineage.jsonl"
    reviews = tmp_path / "in" / "reviews.jsonl"
    reviews.parent.mkdir()
    reviews.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "channel": "survey", "product": "Lamp", "comment": "Great lamp"})
            + "\n"
            for i in range(3)
        ),
        encoding="utf-8",
    )
    labels = tmp_path / "labels.sqlite"
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "CREATE TABLE tickets (ticket_id INTEGER PRIMARY KEY, channel TEXT, product TEXT, body TEXT, sentiment TEXT)"
                )
            )
            conn.execute(text("INSERT INTO tickets VALUES (1, 'email', 'Lamp', 'The lamp is great', NULL)"))
        with create_engine(f"sqlite:///{labels}").begin() as conn:
            conn.execute(text("CREATE TABLE review_labels (id TEXT PRIMARY KEY, sentiment TEXT)"))
        support_db = {
            "conn_type": "postgres",
            "host": "127.0.0.1",
            "port": postgres_server.port,
            "login": "postgres",
            "password": SECRET,  # the test server trusts local connections: any password goes
            "schema": database,
        }
        labels_db = {"conn_type": "sqlite", "host": str(labels)}
        with openai_dag_env(
            airflow_home, tmp_path, dags=DAGS, connections={"support_db": support_db, "labels_db": labels_db}
        ) as (_, env):
            env["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps(
                {"type": "file", "log_file_path": str(events), "append": True}
            )
            env["AIRFLOW__OPENLINEAGE__NAMESPACE"] = "abp_test"
            # the listener emits from a forked process and kills it after this many seconds (10 by
            # default): the machine's load must not decide whether an event is written
            env["AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT"] = "600"
            env["ABP_LINEAGE_REVIEWS"] = str(reviews)
            proc = run_airflow(env, "dags", "test", DAG_ID)
        assert proc.returncode == 0, tail(proc)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT sentiment FROM tickets")).scalar_one() == "positive"
    finally:
        engine.dispose()
        postgres_server.drop_database(database)
    assert events.is_file(), f"the provider wrote no event: {tail(proc)}"
    assert SECRET not in events.read_text(encoding="utf-8")
    table = (f"postgres://127.0.0.1:{postgres_server.port}", f"{database}.public.tickets")
    sqlite = (f"sqlite://{labels}", "main.review_labels")
    expected = {
        "tickets.prepare": ([table], []),
        "tickets.deliver_tickets": ([], [table]),
        "reviews.prepare": ([("file", str(reviews))], []),
        "reviews.deliver_review_labels": ([], [sqlite]),
    }
    for task_id, (inputs, outputs) in expected.items():
        emitted = events_of(events, task_id)
        assert set(emitted) == {"START", "COMPLETE"}, (task_id, sorted(emitted))
        for kind, event in emitted.items():
            got = (names(event.get("inputs", [])), names(event.get("outputs", [])))
            assert got == (inputs, outputs), (task_id, kind, got)
