"""The README's "from a table and back" DAG (``dags/ticket_sentiment.py``), run as shipped.

Support tickets in PostgreSQL, read through a ``SqlSource``, classified through the emulator's
batch API, the labels written back onto each row by a ``SqlUpsertSink``, and an escalation opened
per negative comment by a ``Consumer`` through a helpdesk on loopback (an ``http`` connection) that
counts the requests per ``Idempotency-Key``. Real Airflow (``airflow dags test``, ``airflow tasks
test``), the real ``openai`` SDK over HTTP to the emulator, a real PostgreSQL behind a ``postgres``
Airflow connection and its hook, the ``http`` provider's hook.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.deliveries import delivery_rows
from airflow_batch_provider.ledger.digests import delivery_key
from tests.support.airflow_run import openai_dag_env, run_airflow, tail
from tests.support.helpdesk import Helpdesk, serve_helpdesk

pytestmark = pytest.mark.airflow_e2e
REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "ticket_sentiment.py"  # shipped, and shown verbatim in the README
PROMPT_FILE = REPO / "include" / "prompts" / "feedback_classification.yaml"


def shipped_dag_folder(root: Path) -> Path:
    """A DAG folder holding the shipped DAG file alone, with the prompt in the include folder beside it, where the file looks.

    Only this file is parsed, not the other shipped DAGs (the vLLM ones import the Kubernetes client).
    """
    (root / "dags").mkdir(parents=True)
    (root / "include" / "prompts").mkdir(parents=True)
    shutil.copy(DAG_FILE, root / "dags" / DAG_FILE.name)
    shutil.copy(PROMPT_FILE, root / "include" / "prompts" / PROMPT_FILE.name)
    return root / "dags"


WORKLOAD = "ticket_sentiment"
DAG_ID = "ticket_sentiment"
CONSUME = f"{WORKLOAD}.deliver_escalations"
TICKETS = 60
BODIES = (
    "The refund was slow and left me disappointed.",  # negative: every third ticket, 20 of them
    "The login screen of the app is excellent, I love it.",
    "The gift wrapping was okay, nothing special.",
)
NEGATIVE = [str(1000 + i) for i in range(0, TICKETS, 3)]


@contextmanager
def support_db(postgres_server: Any) -> Iterator[tuple[Engine, dict[str, Any]]]:
    """The ``tickets`` table in a fresh PostgreSQL database; yield its engine and the ``support_db`` connection."""
    name = postgres_server.create_database("support_tickets")
    engine = create_engine(postgres_server.url_for(name))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "CREATE TABLE tickets (ticket_id INTEGER PRIMARY KEY, channel TEXT, product TEXT, body TEXT,"
                    " sentiment TEXT, confidence DOUBLE PRECISION)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO tickets (ticket_id, channel, product, body) VALUES (:i, 'email', 'Lamp', :b)"
                ),
                [{"i": 1000 + i, "b": BODIES[i % 3]} for i in range(TICKETS)],
            )
        yield (
            engine,
            {
                "conn_type": "postgres",
                "host": "127.0.0.1",
                "port": postgres_server.port,
                "login": "postgres",
                "schema": name,
            },
        )
    finally:
        engine.dispose()
        postgres_server.drop_database(name)


def keys_of(tickets: list[str], version: str) -> dict[str, str]:
    """The idempotency key of each ticket's escalation at a prompt version."""
    return {delivery_key(WORKLOAD, "escalations", t, version): t for t in tickets}


def the_report(ledger: Ledger, run_id: str) -> dict[str, Any]:
    [found] = [r["report_json"] for r in ledger.runs(WORKLOAD) if r["run_id"] == run_id]
    report: dict[str, Any] = json.loads(found)
    return report


def test_every_tickets_row_gets_its_label_once_no_row_is_added_and_each_negative_one_one_escalation(
    airflow_home: dict[str, str], tmp_path: Path, postgres_server: Any
) -> None:
    with support_db(postgres_server) as (engine, db), serve_helpdesk() as helpdesk:
        bundle = shipped_dag_folder(tmp_path / "bundle")
        connections = {"support_db": db, "helpdesk_api": helpdesk.connection()}
        with openai_dag_env(airflow_home, tmp_path, dags=bundle, connections=connections) as (_, env):
            proc = run_airflow(env, "dags", "test", DAG_ID)
        assert proc.returncode == 0, tail(proc)
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT ticket_id, sentiment, confidence FROM tickets ORDER BY ticket_id")
            ).all()
    assert [r[0] for r in rows] == [1000 + i for i in range(TICKETS)]  # none added
    ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
    [run] = ledger.runs(WORKLOAD)
    answers = {
        r["app_id"]: json.loads(r["output_json"])
        for r in ledger.iter_items(WORKLOAD, run["run_id"])
        if r["state"] == "succeeded"
    }
    assert len(answers) == TICKETS
    for ticket_id, sentiment, confidence in rows:
        answer = answers[str(ticket_id)]
        assert (sentiment, confidence) == (answer["sentiment"], answer["confidence"])
        assert sentiment in ("positive", "negative", "neutral")
    recorded = delivery_rows(ledger, WORKLOAD, "tickets")
    assert len(recorded) == TICKETS and {(r["state"], r["writes"]) for r in recorded} == {("delivered", 1)}
    report = json.loads(run["report_json"])
    assert report["deliveries"]["tickets"]["delivered"] == TICKETS
    # one escalation per negative comment, each with its own key, each key once
    assert sorted(t for t, a in answers.items() if a["sentiment"] == "negative") == NEGATIVE
    assert helpdesk.keys() == dict.fromkeys(keys_of(NEGATIVE, "v3"), 1)
    assert helpdesk.tickets_by_key() == keys_of(NEGATIVE, "v3")
    escalations = report["deliveries"]["escalations"]
    assert {k: escalations[k] for k in ("acted", "already_acknowledged", "left_out", "failed")} == {
        "acted": len(NEGATIVE),
        "already_acknowledged": 0,
        "left_out": TICKETS - len(NEGATIVE),
        "failed": 0,
    }


def test_a_consumer_killed_before_its_acknowledgement_cleared_and_bumped_sends_no_key_twice_but_the_killed_one(
    airflow_home: dict[str, str], tmp_path: Path, postgres_server: Any
) -> None:
    ledger_db = postgres_server.create_database("ticket_ledger")
    try:
        with support_db(postgres_server) as (_, db), serve_helpdesk() as helpdesk:
            bundle = shipped_dag_folder(tmp_path / "bundle")
            connections = {"support_db": db, "helpdesk_api": helpdesk.connection()}
            ledger_url = postgres_server.url_for(ledger_db)
            with openai_dag_env(
                airflow_home, tmp_path, dags=bundle, connections=connections, ledger_url=ledger_url
            ) as (_, env):
                check_kill_clear_and_bump(env, helpdesk, bundle)
    finally:
        postgres_server.drop_database(ledger_db)


def check_kill_clear_and_bump(env: dict[str, str], helpdesk: Helpdesk, bundle: Path) -> None:
    """The consumer killed after its third request, rerun, cleared, then the prompt's version bumped."""
    killed = run_airflow({**env, "ABP_FAILPOINTS": "consume.after_act=3"}, "dags", "test", DAG_ID)
    assert killed.returncode == -9, tail(killed)  # SIGKILL: nothing of the task ran after the request
    sent = [key for key, _ in helpdesk.requests]
    assert len(sent) == 3 and set(sent) <= set(keys_of(NEGATIVE, "v3"))
    ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
    try:
        [run] = ledger.runs(WORKLOAD)
        rerun = run_airflow(env, "tasks", "test", DAG_ID, CONSUME, run["run_id"])
        assert rerun.returncode == 0, tail(rerun)
        # the third key again (its request was sent, its acknowledgement was not recorded), no new key
        assert helpdesk.keys() == {**dict.fromkeys(keys_of(NEGATIVE, "v3"), 1), sent[2]: 2}
        rows = delivery_rows(ledger, WORKLOAD, "escalations")
        assert {r["state"] for r in rows if r["app_id"] in NEGATIVE} == {"acknowledged"}
        assert the_report(ledger, run["run_id"])["deliveries"]["escalations"]["acted"] == len(NEGATIVE) - 2
        cleared = run_airflow(env, "tasks", "test", DAG_ID, CONSUME, run["run_id"])
        assert cleared.returncode == 0, tail(cleared)
        assert sum(helpdesk.keys().values()) == len(NEGATIVE) + 1  # nothing new
        escalations = the_report(ledger, run["run_id"])["deliveries"]["escalations"]
        assert (escalations["acted"], escalations["already_acknowledged"]) == (0, len(NEGATIVE))
        prompt = bundle.parent / "include" / "prompts" / PROMPT_FILE.name
        prompt.write_text(prompt.read_text().replace("version: v3", "version: v4"), encoding="utf-8")
        bumped = run_airflow(env, "dags", "test", DAG_ID)
        assert bumped.returncode == 0, tail(bumped)
        # the new version's answers: a new key each, once; the old keys not again
        assert helpdesk.keys() == {
            **dict.fromkeys(keys_of(NEGATIVE, "v3"), 1),
            sent[2]: 2,
            **dict.fromkeys(keys_of(NEGATIVE, "v4"), 1),
        }
    finally:
        ledger.engine.dispose()
