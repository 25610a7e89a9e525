"""The retention policy and the prune (ledger/retention.py), on SQLite and PostgreSQL.

The prune's promise: a workload pruned to its last runs reads, on its next night, exactly what an
identical workload never pruned reads (what prepare skips, the review queue, the results, every
cost the report and the UI show), while the history that grows every night goes.
"""

from __future__ import annotations

import itertools
import multiprocessing
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.exceptions import LedgerError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.ledger.handoffs import acknowledge, pending_for
from airflow_batch_provider.ledger.late_harvest import move_job_to_run, resolved_jobs_of_finished_runs
from airflow_batch_provider.ledger.retention import PRUNE, RetentionPolicy, prune
from tests.unit.ledger import prune_worker
from tests.unit.ledger.nights import night, stage_pending, what_a_night_reads
from tests.unit.ledger.store_support import prep, snapshot
from tests.unit.ledger.test_unharvested import IDS, in_doubt_at_the_deadline

WL = "feedback"
POOL = tuple(f"item-{n}" for n in range(8))
_names = itertools.count()

#: a night of the pool: per item, absent (None) or (text version, fails)
NIGHT = st.lists(
    st.one_of(st.none(), st.tuples(st.integers(0, 2), st.booleans())), min_size=len(POOL), max_size=len(POOL)
)


def inputs_of(plan: list[tuple[int, bool] | None]) -> tuple[dict[str, str], set[str]]:
    inputs = {app: f"text {spec[0]}" for app, spec in zip(POOL, plan, strict=True) if spec is not None}
    failing = {app for app, spec in zip(POOL, plan, strict=True) if spec is not None and spec[1]}
    return inputs, failing


def rows_of(ledger: Ledger, table: Any, workload: str) -> int:
    with ledger.engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(table).where(table.c.workload == workload)
            ).scalar_one()
        )


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(history=st.lists(NIGHT, min_size=2, max_size=5), tonight=NIGHT, keep=st.integers(1, 3))
def test_a_pruned_workloads_next_night_skips_reviews_and_costs_exactly_what_an_unpruned_one_does(
    ledger: Ledger,
    history: list[list[tuple[int, bool] | None]],
    tonight: list[tuple[int, bool] | None],
    keep: int,
) -> None:
    n = next(_names)
    kept, pruned = f"kept-{n}", f"pruned-{n}"
    for number, plan in enumerate(history):
        inputs, failing = inputs_of(plan)
        for workload in (kept, pruned):
            night(ledger, workload, f"night-{number}", inputs, failing)
    before = what_a_night_reads(ledger, pruned, f"night-{len(history) - 1}")
    assert before == what_a_night_reads(ledger, kept, f"night-{len(history) - 1}")

    report = prune(ledger, pruned, RetentionPolicy(keep_runs=keep), batch_rows=2)

    assert report.held == ()
    assert what_a_night_reads(ledger, pruned, f"night-{len(history) - 1}") == before
    inputs, failing = inputs_of(tonight)
    last = f"night-{len(history)}"
    assert night(ledger, pruned, last, inputs, failing) == night(ledger, kept, last, inputs, failing)
    assert what_a_night_reads(ledger, pruned, last) == what_a_night_reads(ledger, kept, last)
    assert rows_of(ledger, s.attempts, pruned) <= rows_of(ledger, s.attempts, kept)
    assert rows_of(ledger, s.runs, pruned) == rows_of(ledger, s.runs, kept)


def test_a_prune_removes_the_old_nights_attempts_and_jobs_and_keeps_each_items_last_success(
    ledger: Ledger,
) -> None:
    inputs = {app: "same" for app in POOL}
    night(ledger, WL, "n1", inputs)
    for number in (2, 3, 4):
        night(ledger, WL, f"n{number}", {**inputs, "item-0": f"edited {number}"})
    assert rows_of(ledger, s.attempts, WL) == len(POOL) + 3
    dry = prune(ledger, WL, RetentionPolicy(keep_runs=1), dry_run=True)
    assert rows_of(ledger, s.attempts, WL) == len(POOL) + 3  # a dry run removes nothing

    done = prune(ledger, WL, RetentionPolicy(keep_runs=1))

    assert (dry.runs, dry.rows) == (done.runs, done.rows)
    # n1's job holds the last success of the seven items never edited: it stays, with those lines
    assert done.runs == ("n1", "n2", "n3")
    assert done.rows["abp_attempts"] == 3  # item-0's lines of n1, n2 and n3
    assert done.rows["abp_jobs"] == 2  # n2's and n3's jobs: n1's still holds successes
    assert rows_of(ledger, s.attempts, WL) == len(POOL)
    assert [r.action for r in ledger.audit_log(WL)] == [PRUNE]
    assert prune(ledger, WL, RetentionPolicy(keep_runs=1)).rows == dict.fromkeys(done.rows, 0)


def test_keep_days_keeps_the_runs_of_the_last_days_and_the_newest_run_always(ledger: Ledger) -> None:
    for number in range(3):
        night(ledger, WL, f"n{number}", {"a": f"text {number}"})
    later = utcnow() + timedelta(days=10)
    assert prune(ledger, WL, RetentionPolicy(keep_days=30), now=later, dry_run=True).runs == ()
    assert prune(ledger, WL, RetentionPolicy(keep_days=5), now=later).runs == ("n0", "n1")
    assert prune(ledger, WL, RetentionPolicy(keep_days=5, keep_runs=3), now=later).runs == ()


def test_no_policy_keeps_everything(ledger: Ledger) -> None:
    for number in range(3):
        night(ledger, WL, f"n{number}", {"a": f"text {number}"})
    before = snapshot(ledger)
    assert prune(ledger, WL, RetentionPolicy()).total == 0
    assert snapshot(ledger) == before


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"keep_runs": 0}, "keep_runs=0 keeps no run; give 1 or more"),
        ({"keep_days": 0}, "keep_days=0 keeps no day"),
    ],
)
def test_a_policy_that_keeps_nothing_is_refused_with_the_remedy(policy: dict[str, int], message: str) -> None:
    with pytest.raises(LedgerError, match=message):
        RetentionPolicy(**policy)  # type: ignore[arg-type]


def test_the_review_queue_its_audit_deliveries_and_reports_survive_a_prune(ledger: Ledger) -> None:
    inputs = {app: "same" for app in POOL}
    night(ledger, WL, "n1", inputs, failing={"item-0", "item-1"})
    night(ledger, WL, "n2", inputs)  # the two failures go to review (sticky)
    assert ledger.resolve_review(WL, app_ids=["item-1"], actor="ops", note="answered by hand") == 1
    handed = pending_for(ledger, WL, "crm")
    assert acknowledge(ledger, WL, "crm", [h.key for h in handed]) == len(POOL) - 2
    night(ledger, WL, "n3", {**inputs, "item-7": "edited"})
    offered = [h.key for h in pending_for(ledger, WL, "crm")]
    kept_tables = ("abp_items", "abp_results", "abp_deliveries", "abp_runs", "abp_leases")
    before = {name: rows for name, rows in snapshot(ledger).items() if name in kept_tables}
    audit = ledger.audit_log(WL)
    review = ledger.review_items(WL)

    assert prune(ledger, WL, RetentionPolicy(keep_runs=1)).runs == ("n1", "n2")

    assert {name: rows for name, rows in snapshot(ledger).items() if name in kept_tables} == before
    assert ledger.audit_log(WL)[1:] == audit
    assert ledger.review_items(WL) == review and [r.app_id for r in review] == ["item-0"]
    # the review page's cost of each item still counts every run's attempts of it
    with ledger.engine.connect() as conn:
        left = {
            r.app_id
            for r in conn.execute(
                select(s.items.c.app_id).join(s.attempts, s.attempts.c.item_key == s.items.c.item_key)
            )
        }
    assert {"item-0", "item-1"} <= left
    # the consumer is offered after the prune what it was offered before, and nothing it acknowledged
    again = [h.key for h in pending_for(ledger, WL, "crm")]
    assert again == offered and not set(again) & {h.key for h in handed}


def test_a_run_whose_job_is_in_doubt_is_kept_whole_and_its_batch_is_harvested_and_priced_once(
    ledger: Ledger,
) -> None:
    ledger.start_run(WL, "r1", "anthropic", "m")
    job_id, cids = in_doubt_at_the_deadline(ledger)
    ledger.finish_run(WL, "r1", {"in_doubt_jobs": [job_id]})
    for number in (2, 3):
        night(ledger, WL, f"n{number}", {"other": f"text {number}"})
    before = snapshot(ledger)

    report = prune(ledger, WL, RetentionPolicy(keep_runs=1))

    assert [(h.run_id, "in_doubt" in h.reason) for h in report.held] == [("r1", True)]
    assert report.runs == ("n2",)
    after = snapshot(ledger)
    for table in ("abp_jobs", "abp_attempts"):
        mine = [r for r in before[table] if r["run_id"] == "r1"]
        assert mine and mine == [r for r in after[table] if r["run_id"] == "r1"]
    # resolved later: the next run finds the batch, harvests it once, and prices each line once
    ledger.resolve_job(job_id, "batch_late", "ops", "found in the console")
    ledger.start_run(WL, "n4", "openai", "gpt-4o-mini")
    assert prune(ledger, WL, RetentionPolicy(keep_runs=1)).held[0].run_id == "r1"
    assert [j.job_id for j in resolved_jobs_of_finished_runs(ledger, WL, "n4")] == [job_id]
    assert move_job_to_run(ledger, job_id, "n4", "prepare") == len(IDS)
    answer_late(ledger, job_id, cids)
    totals = ledger.attempt_totals(WL, "n4")
    assert sum(int(t["lines"]) for t in totals if t["outcome"] == "succeeded") == len(IDS)
    assert ledger.count_states(WL, "n4") == {"succeeded": len(IDS)}


def answer_late(ledger: Ledger, job_id: str, cids: dict[str, str]) -> None:
    from airflow_batch_provider.core.results import ItemResult, Usage
    from tests.unit.ledger.store_support import cost_of

    ledger.apply_results(
        job_id,
        [ItemResult(c, "succeeded", output={"x": 1}, usage=Usage(5, 5)) for c in cids.values()],
        cost_of,
    )
    ledger.update_job(job_id, state="reconciled", reconciled_at=utcnow())


def test_a_running_night_is_never_pruned_and_keeps_what_it_staged(ledger: Ledger) -> None:
    night(ledger, WL, "n1", {"a": "one", "b": "one"})
    night(ledger, WL, "n2", {"a": "two", "b": "one"})
    ledger.start_run(WL, "n3", "openai", "gpt-4o-mini")
    ledger.upsert_items(WL, "n3", [prep("a", "three"), prep("b", "one")])
    job_id, _ = stage_pending(ledger, WL, "n3")
    # n3 is newest and unfinished; n2 is past keep_runs=1 and goes; n1 still holds b's success
    report = prune(ledger, WL, RetentionPolicy(keep_runs=1))
    assert report.runs == ("n1", "n2")
    assert ledger.get_job(job_id).state == "staged"
    assert ledger.count_states(WL, "n3") == {"staged": 1, "unchanged": 1}


def test_a_prune_racing_nights_in_another_process_changes_nothing_they_read(ledger: Ledger) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    url = ledger.engine.url.render_as_string(hide_password=False)
    worker = ctx.Process(target=prune_worker.prune_until_stopped, args=(url, "raced", ready, stop, results))
    worker.start()
    try:
        assert ready.wait(120)
        for number in range(6):
            inputs = {app: f"text {(number + i) // 3}" for i, app in enumerate(POOL)}
            failing = {POOL[number % len(POOL)]}
            assert night(ledger, "raced", f"n{number}", inputs, failing) == night(
                ledger, "calm", f"n{number}", inputs, failing
            )
            assert what_a_night_reads(ledger, "raced", f"n{number}") == what_a_night_reads(
                ledger, "calm", f"n{number}"
            )
    finally:
        stop.set()
        removed, passes = results.get(timeout=120)
        worker.join(timeout=60)
    assert worker.exitcode == 0
    assert removed > 0 and passes > 1
    assert rows_of(ledger, s.attempts, "raced") < rows_of(ledger, s.attempts, "calm")
