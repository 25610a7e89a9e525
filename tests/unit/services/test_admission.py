"""Admission in waves under the enqueued-token limit, against the emulator's own limit and record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_batch_provider.adapters.base import AdapterSettings
from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger.records import OpenItem
from airflow_batch_provider.ledger.store import PreparedItem
from airflow_batch_provider.services import admission
from airflow_batch_provider.services import round as rounds
from airflow_batch_provider.services.submit import submit_job, upload_job
from tests.unit.services.workload import PROMPT, RUN, WORKLOAD, World, world

CHUNKS = 50
#: Batches last 14 s of the emulator's clock, which the round moves on between passes.
REAL_TIME = 1.0
#: Two items of about 60 tokens per chunk: the estimate's overheads are small next to the text.
TEXT = "the parcel came late and the box was broken, but support answered within the hour " * 3


def stage_chunks(w: World, chunks: int = CHUNKS) -> list[str]:
    """Stage ``chunks`` jobs of two items each; return their ids."""
    w.ledger.start_run(WORKLOAD, RUN, w.adapter.name, PROMPT.model)
    w.ledger.upsert_items(
        WORKLOAD,
        RUN,
        [
            PreparedItem(item_key(f"i{k}"), PROMPT.render({"id": f"i{k}", "text": f"{k} {TEXT}"}))
            for k in range(2 * chunks)
        ],
    )
    manifests = rounds.stage_round(
        ledger=w.ledger,
        adapter=w.adapter,
        staging=w.staging,
        workload=WORKLOAD,
        run_id=RUN,
        round_=1,
        items=w.ledger.iter_item_rows(WORKLOAD, RUN, states=["pending"], shape=OpenItem),
        max_requests=2,
    )
    return [str(m["job_id"]) for m in manifests]


def provider_tokens(w: World, job_id: str) -> int:
    """The job's input tokens as the emulator counts them against its enqueued-token limit."""
    path = w.staging.at(w.ledger.get_job(job_id).staged_path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return sum(
        sum(-(-len(m["content"].encode()) // 4) + 4 for m in line["body"]["messages"]) for line in lines
    )


def limited(w: World, limit: int, **extra: Any) -> OpenAIBatchAdapter:
    """The world's adapter on a connection that states ``limit`` (the emulator enforces the same)."""
    w.config(faults={"enqueued_token_limit": limit})
    settings = AdapterSettings(
        api_key="sk-test", base_url=f"{w.url}/v1", extra={"enqueued_token_limit": limit, **extra}
    )
    return OpenAIBatchAdapter(settings)


def record(w: World) -> dict[str, Any]:
    return dict(httpx.get(f"{w.url}/_emulator/record").json())


def run_round(w: World, adapter: OpenAIBatchAdapter, jobs: list[str], admit: bool) -> int:
    """Submit every job as the submit tasks would, each asking for admission first; return the refusals.

    A refused job is asked again on a later pass (the task defers and comes back); between passes
    the emulator's clock moves on by a batch's whole life, so the batches of one pass end together.
    """
    for job_id in jobs:  # the upload tasks run first; admission is asked at create time
        upload_job(ledger=w.ledger, adapter=adapter, staging=w.staging, job_id=job_id, owner="t")
    waiting, refusals = list(jobs), 0
    for _ in range(100):
        for job_id in list(waiting):
            decision = admission.admit(w.ledger, adapter, w.ledger.get_job(job_id), "emu")
            if admit and not decision.admitted:
                refusals += 1
                continue
            submit_job(ledger=w.ledger, adapter=adapter, staging=w.staging, job_id=job_id, owner="t")
            waiting.remove(job_id)
        w.advance(15.0)
        if not waiting:
            return refusals
    raise AssertionError(f"{len(waiting)} jobs were never admitted")


def test_a_round_of_50_chunks_under_a_limit_of_10_goes_out_in_waves_and_no_batch_fails(
    tmp_path: Path,
) -> None:
    with world(tmp_path, time_scale=REAL_TIME) as w:
        jobs = stage_chunks(w)
        limit = 10 * max(provider_tokens(w, j) for j in jobs)
        adapter = limited(w, limit)
        refusals = run_round(w, adapter, jobs, admit=True)
        for job_id in jobs:
            assert w.wait_terminal(job_id) == "completed"
        batches = record(w)["batches"]["openai"]
        assert len(batches) == CHUNKS
        assert [b["status"] for b in batches] == ["completed"] * CHUNKS
        assert 0 < w.stats()["counters"]["openai.enqueued_tokens_peak"] <= limit
        assert refusals > 0  # it did wait: 50 chunks never fit at once


def test_without_admission_the_provider_fails_every_batch_over_its_limit(tmp_path: Path) -> None:
    """What admission prevents: the same round created at once, 40-odd batches fail at the provider."""
    with world(tmp_path, time_scale=REAL_TIME) as w:
        jobs = stage_chunks(w)
        limit = 10 * max(provider_tokens(w, j) for j in jobs)
        run_round(w, limited(w, limit), jobs, admit=False)
        statuses = [w.wait_terminal(job_id) for job_id in jobs]
        assert statuses.count("failed") >= CHUNKS - 10
        assert w.stats()["counters"]["openai.enqueued_tokens_peak"] <= limit  # the provider refused the rest


def test_the_estimate_of_a_chunk_errs_high_against_the_providers_count(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        jobs = stage_chunks(w, 3)
        for job_id in jobs:
            job = w.ledger.get_job(job_id)
            assert admission.job_tokens(w.ledger, job) >= provider_tokens(w, job_id)


def test_a_job_already_created_is_let_through_even_when_the_quota_is_full(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        first, second = stage_chunks(w, 2)
        adapter = limited(w, provider_tokens(w, first))
        assert admission.admit(w.ledger, adapter, w.ledger.get_job(first), "emu").admitted
        assert not admission.admit(w.ledger, adapter, w.ledger.get_job(second), "emu").admitted
        w.ledger.update_job(second, state="submitting")  # a retried submit whose create may have gone out
        assert admission.admit(w.ledger, adapter, w.ledger.get_job(second), "emu").admitted


def test_a_refusal_names_the_job_the_limit_and_when_it_asks_again(tmp_path: Path) -> None:
    with world(tmp_path) as w:
        first, second = stage_chunks(w, 2)
        adapter = limited(w, provider_tokens(w, first), admission_retry_s=7)
        assert admission.admit(w.ledger, adapter, w.ledger.get_job(first), "emu").admitted
        refused = admission.admit(w.ledger, adapter, w.ledger.get_job(second), "emu")
        assert (refused.admitted, refused.retry_in_s) == (False, 7.0)
        assert second in refused.reason and "gpt-4o-mini" in refused.reason and "'emu'" in refused.reason


@pytest.mark.parametrize(
    ("extra", "model", "limit"),
    [
        ({}, "gpt-4o-mini", None),
        ({"enqueued_token_limit": 90000}, "gpt-4o-mini", 90000),
        ({"enqueued_token_limit": "90000"}, "gpt-4o-mini", 90000),
        ({"enqueued_token_limit": '{"gpt-4o-mini": 2000000, "*": 90000}'}, "gpt-4o-mini", 2000000),
        ({"enqueued_token_limit": {"gpt-4o-mini": 2000000, "*": 90000}}, "gpt-4.1", 90000),
        ({"enqueued_token_limit": {"gpt-4o-mini": 2000000}}, "gpt-4.1", None),
    ],
)
def test_the_limit_is_read_per_model_from_the_connection(
    extra: dict[str, Any], model: str, limit: int | None
) -> None:
    assert admission.enqueued_limit(extra, model) == limit


def test_a_limit_that_is_not_a_positive_number_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="enqueued_token_limit"):
        admission.enqueued_limit({"enqueued_token_limit": "lots"}, "gpt-4o-mini")
