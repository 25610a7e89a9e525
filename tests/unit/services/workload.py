"""A small workload against the real emulator, ledger and staging, for the service tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from airflow_batch_provider.adapters.anthropic import AnthropicBatchAdapter
from airflow_batch_provider.adapters.base import AdapterSettings, BatchAdapter, BatchRef
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.records import OpenItem
from airflow_batch_provider.ledger.store import PreparedItem
from airflow_batch_provider.services import round as rounds
from airflow_batch_provider.staging import Staging
from batch_emulator.config import EmulatorConfig, Timings
from batch_emulator.faults import FaultConfig
from batch_emulator.testing import run_emulator

PROMPT = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ text }}", params={"max_tokens": 8})
CLAUDE = PromptTemplate(version="v1", model="claude-haiku-4-5", user="{{ text }}", params={"max_tokens": 8})
#: Anthropic adapter settings that give up on an ambiguous create quickly.
FAST_CREATE: dict[str, Any] = {"create_retry_initial_s": 0.01, "create_retry_max_s": 0.02, "timeout": 1.0}
WORKLOAD = "svc"
RUN = "manual__2026-11-30T00:00:00+00:00"
#: Columns that record when, not what: left out of ledger comparisons.
WHEN = {"created_at", "updated_at", "submitted_at", "finished_at", "reconciled_at", "started_at"}


@dataclass
class World:
    """A ledger, an OpenAI adapter on a served emulator, and a file staging area."""

    ledger: Ledger
    adapter: BatchAdapter
    staging: Staging
    url: str
    root: Path
    prompt: PromptTemplate = PROMPT

    def arm(self, *script: str) -> None:
        """Script the next create-like calls (``"create:500_after"`` ...)."""
        self.config(faults={"create_script": list(script), "create_slow_s": 2.5})

    def batches_created(self) -> int:
        record = httpx.get(f"{self.url}/_emulator/record").json()
        return sum(len(v) for v in record["batches"].values())

    def config(self, **patch: Any) -> None:
        httpx.put(f"{self.url}/_emulator/config", json=patch).raise_for_status()

    def advance(self, seconds: float) -> None:
        """Move the emulator's clock forward (batches progress as if that time had passed)."""
        httpx.post(f"{self.url}/_emulator/clock", json={"advance_s": seconds}).raise_for_status()

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/_emulator/stats").json())

    def add_items(self, n: int, run_id: str = RUN) -> None:
        items = [
            PreparedItem(item_key(f"i{k}"), self.prompt.render({"id": f"i{k}", "text": f"t{k}"}))
            for k in range(n)
        ]
        self.ledger.start_run(WORKLOAD, run_id, self.adapter.name, self.prompt.model)
        self.ledger.upsert_items(WORKLOAD, run_id, items)

    def stage(self, n: int, max_requests: int | None = None, run_id: str = RUN) -> list[dict[str, Any]]:
        self.add_items(n, run_id)
        rows = self.ledger.iter_item_rows(WORKLOAD, run_id, states=["pending"], shape=OpenItem)
        return rounds.stage_round(
            ledger=self.ledger,
            adapter=self.adapter,
            staging=self.staging,
            workload=WORKLOAD,
            run_id=run_id,
            round_=1,
            items=rows,
            max_requests=max_requests,
        )

    def upload(self, job_id: str, owner: str = "upload-try1") -> str:
        """Run the upload step of a staged job (as the upload task does); return the job id."""
        from airflow_batch_provider.services.submit import upload_job

        upload_job(ledger=self.ledger, adapter=self.adapter, staging=self.staging, job_id=job_id, owner=owner)
        return job_id

    def files_uploaded(self) -> int:
        """Files the emulator's OpenAI router accepted."""
        return int(self.stats()["files_uploaded"])

    def ref(self, job_id: str) -> BatchRef:
        job = self.ledger.get_job(job_id)
        return BatchRef(self.adapter.name, job.batch_id, job.idempotency_key)

    def wait_terminal(self, job_id: str) -> str:
        ref = self.ref(job_id)
        while not (status := self.adapter.status(ref)).terminal:
            time.sleep(0.05)
        return status.state

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        out: dict[str, list[tuple[Any, ...]]] = {}
        with self.ledger.engine.connect() as conn:
            for name, table in {"items": s.items, "jobs": s.jobs, "attempts": s.attempts}.items():
                cols = [c for c in table.c if c.name not in WHEN]
                out[name] = sorted(tuple(r) for r in conn.execute(select(*cols)))
        return out


@contextmanager
def world(
    tmp_path: Path, provider: str = "openai", ledger_url: str | None = None, **config: Any
) -> Iterator[World]:
    """Serve an emulator (fast clock unless told) and open a fresh ledger and staging under ``tmp_path``.

    ``provider`` is ``openai`` (default) or ``anthropic`` (with :data:`FAST_CREATE`); ``ledger_url``
    names the ledger (default: a SQLite file under ``tmp_path``).
    """
    config.setdefault("time_scale", 0.02)
    if isinstance(config.get("faults"), dict):
        config["faults"] = FaultConfig(**config["faults"])
    if isinstance(config.get("timings"), dict):
        config["timings"] = Timings(**config["timings"])
    tmp_path.mkdir(parents=True, exist_ok=True)
    with run_emulator(EmulatorConfig(**config)) as url:
        adapter: BatchAdapter
        if provider == "anthropic":
            extra = {"spool_dir": str(tmp_path), **FAST_CREATE}
            adapter = AnthropicBatchAdapter(AdapterSettings(api_key="sk-test", base_url=url, extra=extra))
        else:
            adapter = OpenAIBatchAdapter(AdapterSettings(api_key="sk-test", base_url=f"{url}/v1"))
        ledger = Ledger.from_url(ledger_url or f"sqlite:///{tmp_path / 'ledger.sqlite'}")
        staging = Staging(f"file://{tmp_path / 'staging'}")
        prompt = CLAUDE if provider == "anthropic" else PROMPT
        yield World(ledger, adapter, staging, url, tmp_path, prompt)
