"""A prompt edited in place (airflow_batch_provider.ledger.prompt_changes), on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from sqlalchemy import select

from airflow_batch_provider.core.custom_ids import item_key, make_custom_id
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.prompt_changes import PromptEdit, edited_in_place, prompt_changed_section
from airflow_batch_provider.ledger.runs import RunPrompt, record_run_prompt
from airflow_batch_provider.ledger.store import PreparedItem, UpsertStats
from tests.unit.ledger.jobs import job_row

WL = "feedback"
OLD, NEW = "a" * 64, "b" * 64


def prep(app_id: str, system: str = "label it", text: str = "hello", version: str = "v1") -> PreparedItem:
    return PreparedItem(
        item_key(app_id),
        CanonicalRequest(
            app_id=app_id,
            prompt_version=version,
            model="gpt-4o-mini",
            system=system,
            messages=({"role": "user", "content": text},),
            params={"max_tokens": 10},
        ),
    )


def start(ledger: Ledger, run_id: str, sha256: str, version: str = "v1") -> None:
    ledger.start_run(WL, run_id, "openai", "gpt-4o-mini")
    record_run_prompt(ledger, WL, run_id, RunPrompt(version, sha256))


def answer_all(ledger: Ledger, run_id: str, items: Sequence[PreparedItem]) -> None:
    """Stage, submit and answer the run's items (each a success), as the run's tasks do."""
    job_id = f"{WL}:{run_id}:r1:c00000"
    placements = [(it.key, it.request.prompt_version, make_custom_id(it.key, 1, 0), 1) for it in items]
    ledger.record_job(job_row(WL, run_id, len(placements), size_bytes=100), placements)
    ledger.mark_submitted(job_id, f"batch-{run_id}", f"file-{run_id}")
    results = [ItemResult(p[2], "succeeded", output={"label": "x"}, usage=Usage(10, 1)) for p in placements]
    ledger.apply_results(job_id, results, lambda usage: Decimal(0))


def changes(ledger: Ledger) -> list[dict[str, Any]]:
    c = s.prompt_changes.c
    with ledger.engine.connect() as conn:
        rows = conn.execute(
            select(
                c.run_id, c.item_key, c.prompt_version, c.previous_run_id, c.previous_sha256, c.prompt_sha256
            )
            .where(c.workload == WL)
            .order_by(c.run_id, c.item_key)
        ).mappings()
        return [dict(r) for r in rows]


def test_an_answered_item_sent_again_for_a_prompt_edited_in_place_is_recorded_with_both_digests(
    ledger: Ledger,
) -> None:
    first = [prep("a"), prep("b")]
    start(ledger, "r1", OLD)
    ledger.upsert_items(WL, "r1", first)
    answer_all(ledger, "r1", first)
    start(ledger, "r2", NEW)
    edited = [prep("a", system="label it in one word"), prep("b", system="label it in one word")]
    assert ledger.upsert_items(WL, "r2", edited) == UpsertStats(changed=2, prompt_changed=2)
    assert ledger.count_states(WL, "r2") == {"pending": 2}
    expected = [
        {
            "run_id": "r2",
            "item_key": item_key(app_id),
            "prompt_version": "v1",
            "previous_run_id": "r1",
            "previous_sha256": OLD,
            "prompt_sha256": NEW,
        }
        for app_id in sorted(["a", "b"], key=item_key)
    ]
    assert changes(ledger) == expected
    # a rerun of the task records nothing twice
    assert ledger.upsert_items(WL, "r2", edited) == UpsertStats(already_in_run=2)
    assert changes(ledger) == expected
    assert prompt_changed_section(ledger, WL, "r2") == {
        "items": 2,
        "edits": [{"prompt_version": "v1", "previous_sha256": OLD, "sha256": NEW, "items": 2}],
    }
    assert prompt_changed_section(ledger, WL, "r1") == {"items": 0}


def test_an_edited_record_or_a_new_prompt_version_is_no_in_place_prompt_edit(ledger: Ledger) -> None:
    first = [prep("a"), prep("b")]
    start(ledger, "r1", OLD)
    ledger.upsert_items(WL, "r1", first)
    answer_all(ledger, "r1", first)
    start(ledger, "r2", OLD)  # the same prompt content: only the record changed
    assert ledger.upsert_items(WL, "r2", [prep("a"), prep("b", text="edited")]) == UpsertStats(
        changed=1, unchanged=1
    )
    start(ledger, "r3", NEW, version="v2")  # a new version: new items, old answers kept at v1
    assert ledger.upsert_items(WL, "r3", [prep("a", system="other", version="v2")]) == UpsertStats(new=1)
    assert changes(ledger) == []


def test_an_item_held_in_review_is_sent_again_for_a_prompt_edited_in_place_and_recorded(
    ledger: Ledger,
) -> None:
    start(ledger, "r1", OLD)
    ledger.upsert_items(WL, "r1", [prep("a")])
    ledger.reject_items(WL, "r1", [(prep("a"), "a", "too_long", "item a is too long")])
    start(ledger, "r2", OLD)
    assert ledger.upsert_items(WL, "r2", [prep("a")]) == UpsertStats(in_review=1)
    start(ledger, "r3", NEW)
    assert ledger.upsert_items(WL, "r3", [prep("a", system="shorter")]) == UpsertStats(
        changed=1, prompt_changed=1
    )
    assert [(c["run_id"], c["previous_run_id"]) for c in changes(ledger)] == [("r3", "r2")]


def test_prepare_finds_the_latest_earlier_run_that_rendered_the_version_otherwise(ledger: Ledger) -> None:
    start(ledger, "r1", OLD)
    assert edited_in_place(ledger, WL, "r1", "v1", OLD) is None  # itself does not count
    start(ledger, "r2", "c" * 64)
    start(ledger, "r3", NEW, version="v2")
    ledger.start_run("other", "r9", "openai", "gpt-4o-mini")
    record_run_prompt(ledger, "other", "r9", RunPrompt("v1", "d" * 64))
    start(ledger, "r4", OLD)
    assert edited_in_place(ledger, WL, "r4", "v1", OLD) == PromptEdit("r2", "v1", "c" * 64, OLD)
    assert edited_in_place(ledger, WL, "r4", "v2", NEW) is None
    warning = PromptEdit("r2", "v1", "c" * 64, OLD).warning(WL, "r4", "feedback-labels")
    for part in ("'feedback-labels'", "'v1'", "c" * 12, "a" * 12, "prompt_changed", "Bump `version`"):
        assert part in warning
