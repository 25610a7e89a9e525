"""The quotas shared through the ledger: a rate window and enqueued tokens, on SQLite and PostgreSQL."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.quota import STALE_ADMISSION_S, EnqueuedQuotaStore, SharedRateStore
from tests.unit.ledger import quota_worker
from tests.unit.ledger.test_store import staged_job

MODEL = "gpt-4o-mini"


def in_processes(target: Any, url: str, args: list[tuple[Any, ...]]) -> list[Any]:
    """Run ``target(url, *a, barrier, results)`` in one spawned process per ``a``; return their results."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(args))
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, *a, barrier, results)) for a in args]
    for p in procs:
        p.start()
    got = [results.get(timeout=300) for _ in args]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return got


# ---------------------------------------------------------------------------------------------- rate window


def test_a_full_window_refuses_and_says_when_its_oldest_request_leaves(ledger: Ledger) -> None:
    store = SharedRateStore(ledger.engine, "conn-a")
    for at in (100.0, 110.0):
        rid, _ = store.reserve(1, at, 2, None, 60.0)
        assert rid is not None
        store.commit(rid, 1, at)
    assert store.reserve(1, 120.0, 2, None, 60.0) == (None, 40.0)
    assert store.reserve(1, 160.0, 2, None, 60.0)[0] is not None


def test_two_connections_keep_two_windows(ledger: Ledger) -> None:
    a, b = SharedRateStore(ledger.engine, "conn-a"), SharedRateStore(ledger.engine, "conn-b")
    assert a.reserve(1, 100.0, 1, None, 60.0)[0] is not None
    assert b.reserve(1, 100.0, 1, None, 60.0)[0] is not None
    assert a.reserve(1, 101.0, 1, None, 60.0)[0] is None


def test_a_commit_gives_back_what_the_answer_did_not_use_to_another_process(ledger_url: str) -> None:
    one, other = Ledger.from_url(ledger_url), Ledger.from_url(ledger_url)
    try:
        mine, theirs = SharedRateStore(one.engine, "conn-a"), SharedRateStore(other.engine, "conn-a")
        rid, _ = mine.reserve(900, 100.0, None, 1000, 60.0)
        assert rid is not None
        assert theirs.reserve(500, 100.5, None, 1000, 60.0)[0] is None
        mine.commit(rid, 400, 101.0)
        assert theirs.reserve(500, 101.5, None, 1000, 60.0)[0] is not None
        assert theirs.in_window(101.5, 60.0) == (2, 900)
        mine.commit(rid, 700, 102.0)  # the answer used more than estimated: charged more
        assert theirs.in_window(102.0, 60.0) == (2, 1200)
        assert theirs.reserve(1, 102.5, None, 1000, 60.0) == (None, pytest.approx(59.5))  # mine leaves first
    finally:
        one.engine.dispose()
        other.engine.dispose()


def test_a_commit_counts_the_charge_from_the_answer_never_earlier(ledger: Ledger) -> None:
    store = SharedRateStore(ledger.engine, "conn-a")
    rid, _ = store.reserve(10, 100.0, 1, None, 60.0)
    assert rid is not None
    store.commit(rid, 10, 130.0)
    assert store.reserve(10, 165.0, 1, None, 60.0) == (None, pytest.approx(25.0))
    store.commit(rid, 10, 120.0)  # a late, earlier stamp does not move it back
    assert store.reserve(10, 185.0, 1, None, 60.0) == (None, pytest.approx(5.0))


def test_a_request_whose_answer_has_not_come_counts_however_long_it_takes(ledger: Ledger) -> None:
    store = SharedRateStore(ledger.engine, "conn-a")
    rid, _ = store.reserve(10, 100.0, 1, None, 60.0)
    assert rid is not None
    assert store.reserve(10, 200.0, 1, None, 60.0) == (None, 60.0)  # the provider may count it from now
    store.commit(rid, 10, 200.0)
    assert store.reserve(10, 260.5, 1, None, 60.0)[0] is not None


def test_a_released_reservation_frees_its_slot(ledger: Ledger) -> None:
    store = SharedRateStore(ledger.engine, "conn-a")
    rid, _ = store.reserve(10, 100.0, 1, None, 60.0)
    assert rid is not None and store.reserve(10, 101.0, 1, None, 60.0)[0] is None
    store.release(rid)
    assert store.reserve(10, 102.0, 1, None, 60.0)[0] is not None


def test_a_pause_one_process_was_told_of_holds_every_process(ledger: Ledger) -> None:
    told, other = SharedRateStore(ledger.engine, "conn-a"), SharedRateStore(ledger.engine, "conn-a")
    assert told.reserve(1, 100.0, 100, None, 60.0, paused_until=130.0) == (None, 30.0)
    assert other.reserve(1, 110.0, 100, None, 60.0) == (None, 20.0)
    assert other.reserve(1, 130.0, 100, None, 60.0)[0] is not None


def test_processes_racing_for_one_window_are_admitted_exactly_the_limit_together(ledger_url: str) -> None:
    Ledger.from_url(ledger_url).engine.dispose()  # the schema, before the race
    won = in_processes(quota_worker.reserve_rounds, ledger_url, [(60,)] * 3)
    assert sum(won) == 60, won


# ---------------------------------------------------------------------------------------------- enqueued tokens


def test_jobs_are_admitted_until_the_limit_and_one_that_ended_gives_its_tokens_back(ledger: Ledger) -> None:
    store = EnqueuedQuotaStore(ledger.engine, "conn-a")
    jobs = [staged_job(ledger, [f"a{n}"], chunk=n) for n in range(3)]
    assert store.admit(jobs[0], MODEL, 600, 1000, 100.0).admitted
    refused = store.admit(jobs[1], MODEL, 600, 1000, 100.0)
    assert not refused.admitted
    assert (refused.enqueued, [h.job_id for h in refused.holders]) == (600, [jobs[0]])
    ledger.update_job(jobs[0], state="submitted", batch_id="batch_1")
    assert not store.admit(jobs[1], MODEL, 600, 1000, 101.0).admitted
    ledger.update_job(jobs[0], batch_state="completed")
    assert store.admit(jobs[1], MODEL, 600, 1000, 102.0).admitted
    assert store.enqueued(MODEL, 102.0) == 600


def test_a_job_asking_again_is_not_counted_twice(ledger: Ledger) -> None:
    store = EnqueuedQuotaStore(ledger.engine, "conn-a")
    job = staged_job(ledger)
    assert store.admit(job, MODEL, 600, 1000, 100.0).admitted
    assert store.admit(job, MODEL, 600, 1000, 101.0).admitted
    assert store.enqueued(MODEL, 101.0) == 600


def test_other_models_and_released_jobs_do_not_count(ledger: Ledger) -> None:
    store = EnqueuedQuotaStore(ledger.engine, "conn-a")
    jobs = [staged_job(ledger, [f"a{n}"], chunk=n) for n in range(3)]
    assert store.admit(jobs[0], "other-model", 900, 1000, 100.0).admitted
    assert store.admit(jobs[1], MODEL, 900, 1000, 100.0).admitted
    store.release([jobs[1]], 101.0)
    assert store.admit(jobs[2], MODEL, 900, 1000, 101.0).admitted


def test_a_job_larger_than_the_limit_goes_alone_and_only_alone(ledger: Ledger) -> None:
    store = EnqueuedQuotaStore(ledger.engine, "conn-a")
    big, small = staged_job(ledger, ["a"], chunk=0), staged_job(ledger, ["b"], chunk=1)
    assert store.admit(big, MODEL, 5000, 1000, 100.0).admitted
    assert not store.admit(small, MODEL, 1, 1000, 100.0).admitted


def test_an_admitted_job_whose_chunk_is_uploaded_but_not_yet_created_holds_its_tokens(ledger: Ledger) -> None:
    # the upload task runs before submit: the job is ``uploaded`` when submit asks for admission
    store = EnqueuedQuotaStore(ledger.engine, "conn-a")
    first, second = staged_job(ledger, ["a"], chunk=0), staged_job(ledger, ["b"], chunk=1)
    ledger.update_job(first, state="uploaded")
    ledger.update_job(second, state="uploaded")
    assert store.admit(first, MODEL, 600, 1000, 100.0).admitted
    refused = store.admit(second, MODEL, 600, 1000, 100.5)  # the first one's create has not happened yet
    assert not refused.admitted and [h.job_id for h in refused.holders] == [first]
    assert not store.admit(second, MODEL, 600, 1000, 100.0 + STALE_ADMISSION_S - 1).admitted
    assert store.admit(second, MODEL, 600, 1000, 100.0 + STALE_ADMISSION_S + 1).admitted  # never created


def test_an_admission_never_created_is_released_once_stale(ledger: Ledger) -> None:
    store = EnqueuedQuotaStore(ledger.engine, "conn-a")
    dead, next_ = staged_job(ledger, ["a"], chunk=0), staged_job(ledger, ["b"], chunk=1)
    assert store.admit(dead, MODEL, 900, 1000, 100.0).admitted
    assert not store.admit(next_, MODEL, 900, 1000, 100.0 + STALE_ADMISSION_S - 1).admitted
    assert store.admit(next_, MODEL, 900, 1000, 100.0 + STALE_ADMISSION_S + 1).admitted


def test_processes_racing_for_enqueued_tokens_never_admit_more_than_the_limit(
    ledger: Ledger, ledger_url: str
) -> None:
    rounds = 30
    jobs = [
        [staged_job(ledger, [f"{p}{n}"], chunk=n * 3 + i) for n in range(rounds)] for i, p in enumerate("abc")
    ]
    won = in_processes(quota_worker.admit_rounds, ledger_url, [(j,) for j in jobs])
    assert sum(len(w) for w in won) == rounds, won
