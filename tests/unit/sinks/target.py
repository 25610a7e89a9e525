"""A target database for the sink tests (SQLite file or a PostgreSQL database) behind an Airflow connection."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.services.harvest import reconcile_job
from airflow_batch_provider.sinks.sql import SqlUpsertSink
from tests.unit.services.test_harvest import price
from tests.unit.services.workload import PROMPT, RUN, WORKLOAD, World

CONN_ID = "tickets_db"
REPO = Path(__file__).resolve().parents[3]


@dataclass
class Target:
    """The user's database: a SQLAlchemy URL to look at it, and the Airflow connection's JSON."""

    url: str
    conn_json: str

    @property
    def database(self) -> str:
        """The database's name (a server's; SQLite: the file)."""
        return self.url.rsplit("/", 1)[-1].split("?", 1)[0]

    def execute(self, sql: str) -> None:
        engine = create_engine(self.url)
        try:
            with engine.begin() as conn:
                conn.execute(text(sql))
        finally:
            engine.dispose()

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        engine = create_engine(self.url)
        try:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.execute(text(sql))]
        finally:
            engine.dispose()


@contextmanager
def target_for(kind: str, tmp_path: Path, server: Any = None) -> Iterator[Target]:
    """A fresh target database of ``kind`` (``sqlite``, ``postgresql`` or ``mysql``)."""
    if kind == "sqlite":
        path = tmp_path / "target.sqlite"
        yield Target(f"sqlite:///{path}", json.dumps({"conn_type": "sqlite", "host": str(path)}))
        return
    name = server.create_database(f"target_{tmp_path.name[-20:].lower().replace('-', '_')}")
    try:
        if kind == "mysql":
            yield Target(server.url_for(name), server.conn_json(name))
            return
        conn = {
            "conn_type": "postgres",
            "host": "127.0.0.1",
            "port": server.port,
            "login": "postgres",
            "schema": name,
        }
        yield Target(server.url_for(name), json.dumps(conn))
    finally:
        server.drop_database(name)


def tickets_sink(batch_size: int = 2, mode: str = "upsert") -> SqlUpsertSink:
    """The sink of these tests: the answer and its prompt version onto ``tickets`` by ticket id."""
    return SqlUpsertSink(
        conn_id=CONN_ID,
        table="tickets",
        key_columns=["ticket_id"],
        columns={"summary": "$", "version": lambda r: r.prompt_version},
        mode=mode,  # type: ignore[arg-type]
        batch_size=batch_size,
    )


def publish_run(w: World, n: int, run_id: str = RUN, prompt: PromptTemplate = PROMPT) -> None:
    """Run ``n`` items through the emulator's batch API with ``prompt`` and publish the run."""
    w.prompt = prompt
    for job_id in submitted_run(w, n, run_id):
        w.wait_terminal(job_id)
        reconcile_job(w.ledger, w.adapter, w.staging, job_id, prompt, price)
    w.ledger.publish(WORKLOAD, run_id)


def submitted_run(w: World, n: int, run_id: str) -> list[str]:
    """Stage ``n`` items of ``run_id`` and create their batches for the prompt's kind of request."""
    jobs = []
    for manifest in w.stage(n, run_id=run_id):
        job = w.ledger.get_job(manifest["job_id"])
        with w.staging.at(job.staged_path).open("rb") as fh:
            ref = w.adapter.submit(
                w.adapter.stage(fh, "x.jsonl", int(job.size_bytes)), job.idempotency_key, {}, w.prompt.kind
            )
        w.ledger.mark_submitted(job.job_id, ref.batch_id, "file")
        jobs.append(job.job_id)
    return jobs


def bumped(prompt: PromptTemplate, version: str) -> PromptTemplate:
    """The prompt at another version, its content changed so the answers change."""
    return replace(prompt, version=version, user="v2 {{ text }}")


def deliver_in_process(ledger_url: str, run_id: str, env: dict[str, str], failpoints: str = "") -> int:
    """Run one delivery in a new process (``deliver_worker``); return its exit code (-9: killed)."""
    full = {**env, "ABP_FAILPOINTS": failpoints} if failpoints else env
    return subprocess.run(
        [sys.executable, "-m", "tests.unit.sinks.deliver_worker", ledger_url, WORKLOAD, run_id],
        cwd=REPO,
        env=full,
        check=False,
        timeout=120,
    ).returncode
