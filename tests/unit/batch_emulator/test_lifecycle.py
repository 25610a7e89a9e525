from __future__ import annotations

from pathlib import Path

import pytest

from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import FaultConfig
from batch_emulator.lifecycle import ItemLog, Job, JobItem, ValidationIssue

T0 = 1_000.0


def make_job(
    n: int = 10, *, faults: FaultConfig | None = None, issues: bool = False, index: int = 0, **cfg: float
) -> Job:
    config = EmulatorConfig(faults=faults or FaultConfig(), **cfg)  # type: ignore[arg-type]
    items = [
        JobItem(custom_id=f"c{i}", line=i + 1, body={}, decision=config.faults.decide_item(0, f"c{i}"))
        for i in range(n)
    ]
    return Job(
        job_id="job",
        provider="test",
        creation_index=index,
        created=T0,
        items=items,
        issues=[ValidationIssue("bad", "bad input", 1)] if issues else [],
        config=config,
    )


def test_the_phases_follow_the_scaled_timings() -> None:
    job = make_job(time_scale=0.5)  # validating 1 s, in progress 5 s, finalizing 1 s
    assert job.view(T0).status == "validating"
    assert job.view(T0 + 0.99).status == "validating"
    assert job.view(T0 + 1.0).status == "in_progress"
    assert job.view(T0 + 5.99).status == "in_progress"
    assert job.view(T0 + 6.0).status == "finalizing"
    done = job.view(T0 + 7.0)
    assert done.status == "completed" and done.terminal
    assert dict(done.times) == {"in_progress_at": 1001, "finalizing_at": 1006, "completed_at": 1007}


def test_items_finish_evenly_over_the_in_progress_phase() -> None:
    job = make_job(10)
    counts = [job.view(T0 + 2 + s).completed for s in range(0, 11)]
    assert counts == list(range(0, 11))
    assert job.view(T0).total == 0
    assert job.view(T0 + 2).total == 10


def test_failing_items_count_as_failed_in_processing_order() -> None:
    job = make_job(100, faults=FaultConfig(rate_500=0.3))
    final = job.view(T0 + 20)
    failing = sum(item.failing for item in job.items)
    assert (final.completed, final.failed) == (100 - failing, failing)
    half = job.view(T0 + 2 + 5)
    assert half.completed + half.failed == 50
    assert half.failed == sum(job.items[i].failing for i in job.order[:50])


def test_processing_order_is_a_seeded_shuffle() -> None:
    a, b = make_job(50), make_job(50)
    assert a.order == b.order
    assert sorted(a.order) == list(range(50))
    assert tuple(a.order) != tuple(range(50))
    assert make_job(50, index=1).order != a.order


def test_a_job_with_validation_issues_fails_when_validation_ends() -> None:
    job = make_job(issues=True)
    assert job.view(T0 + 1).status == "validating"
    failed = job.view(T0 + 2)
    assert failed.status == "failed" and dict(failed.times) == {"failed_at": 1002}
    assert (failed.total, failed.completed, failed.failed) == (0, 0, 0)
    assert list(job.outcomes(T0 + 100)) == []


def test_an_expiring_job_stops_at_its_fraction_and_leaves_the_rest_expired() -> None:
    job = make_job(10, faults=FaultConfig(expire_batches=(0,), expire_after_fraction=0.3))
    assert job.view(T0 + 4.99).status == "in_progress"
    expired = job.view(T0 + 5)
    assert expired.status == "expired" and expired.times["expired_at"] == 1005
    assert job.view(T0 + 100).completed == 3
    ends = [o.end for o in job.outcomes(T0 + 100)]
    assert ends == ["processed"] * 3 + ["expired"] * 7


def test_a_cancel_stops_the_work_and_ends_after_the_cancelling_delay() -> None:
    job = make_job(10)
    assert job.request_cancel(T0 + 5)  # 3 items done
    view = job.view(T0 + 6)
    assert view.status == "cancelling" and view.times["cancelling_at"] == 1005
    final = job.view(T0 + 7)
    assert final.status == "cancelled" and final.times["cancelled_at"] == 1007
    assert final.completed == 3
    assert [o.end for o in job.outcomes(T0 + 7)] == ["processed"] * 3 + ["cancelled"] * 7


def test_a_finished_job_cannot_be_cancelled() -> None:
    job = make_job(2)
    assert not job.request_cancel(T0 + 14)
    assert job.view(T0 + 20).status == "completed"


def test_time_scale_zero_finishes_at_once() -> None:
    job = make_job(5, time_scale=0.0)
    view = job.view(T0)
    assert view.status == "completed" and view.completed == 5


def test_a_jobs_items_live_in_a_spool_file_and_read_back_whole_in_any_order(tmp_path: Path) -> None:
    faults = FaultConfig(rate_500=0.3, rate_duplicate=0.3)
    items = [
        JobItem(
            custom_id=f"c{i}",
            line=i + 1,
            body={"messages": [{"role": "user", "content": f"review {i} é"}]},
            decision=faults.decide_item(0, f"c{i}"),
            natural_error={"status": 400, "message": "too long"} if i % 7 == 0 else None,
        )
        for i in range(300)
    ]
    log = ItemLog(tmp_path, items)
    log.seal()
    assert log.path.parent == tmp_path
    assert len(log.path.read_bytes().splitlines()) == 300, "one line per item on disk"
    assert list(log) == items
    with log.reading() as get:
        assert [get(i) for i in (299, 0, 150)] == [items[299], items[0], items[150]]
    assert log[-1] == items[-1] and log[10:12] == items[10:12]
    assert [log.failing(i) for i in range(300)] == [item.failing for item in items]
    assert list(log.custom_ids()) == [f"c{i}" for i in range(300)]


def test_a_sealed_item_log_refuses_more_items_and_its_file_goes_with_the_job(tmp_path: Path) -> None:
    log = ItemLog(tmp_path, [JobItem("a", 1, {})])
    job = Job(
        job_id="j", provider="t", creation_index=0, created=T0, items=log, issues=[], config=EmulatorConfig()
    )
    with pytest.raises(ValueError, match="sealed"):
        log.append(JobItem("b", 2, {}))
    job.bill("a", input_tokens=3, output_tokens=2)
    assert job.billed == {
        "a": {"input_tokens": 3, "output_tokens": 2, "cached_input_tokens": 0, "cache_write_tokens": 0}
    }
    assert len(list(tmp_path.iterdir())) == 2, "the items and the billed tokens, on disk"
    job.discard()
    assert list(tmp_path.iterdir()) == []


def test_outcomes_come_one_at_a_time_with_their_input_position() -> None:
    job = make_job(20)
    outcomes = job.outcomes(T0 + 100)
    first = next(outcomes)
    assert first.item.custom_id == f"c{first.index}" and first.position == 0
    assert sorted([first.index, *(o.index for o in outcomes)]) == list(range(20))
