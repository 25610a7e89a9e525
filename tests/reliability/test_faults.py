"""Every emulator fault, for OpenAI and Anthropic, with the invariant checked after each run.

Create-like calls whose reply is refused before acting (429, 500), lost after acting (a 500 or a
dropped connection after the batch or file exists) or late (a slow reply); a batch that fails for
OpenAI's enqueued-token limit; result lines with custom ids nobody sent; a batch stuck in progress
until the deadline cancels it, with the worker killed in the middle of the real-time fallback.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from airflow_batch_provider.ledger import schema as s
from tests.support.chaos import WORKLOAD, ChaosRun, Kill, chaos_emulator, check_invariants, count_faults

pytestmark = pytest.mark.reliability

#: the kills of the deadline case: in the middle of the real-time fallback
DEADLINE_KILLS = (Kill(failpoint="fallback.after_send=2"),)
#: every create fault, once each, on the next create-like calls (uploads and batch creates)
CREATE_SCRIPT = (
    "upload:429",
    "create:500",
    "upload:500_after",
    "create:500_after",
    "create:drop_after",
    "create:slow_after",
)


def leftover_script(url: str) -> list[str]:
    return list(httpx.get(f"{url}/_emulator/config").json()["faults"]["create_script"])


def test_openai_create_faults_never_create_a_second_batch_nor_lose_an_item(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    with chaos_emulator({"create_script": list(CREATE_SCRIPT), "create_slow_s": 3.0}) as url:
        run = ChaosRun(airflow_home, tmp_path, "create-faults", url)
        run.resume_until_done(resume=False)
        verdict = check_invariants(url, [run])
        faults = count_faults(url)
        left = leftover_script(url)
    assert not verdict.violations, verdict.explain()
    assert not left, f"create faults never reached: {left}"
    assert sum(faults.values()) >= len(CREATE_SCRIPT), faults
    # an ambiguous create is settled inside the same task attempt, by a look-up by key
    assert run.attempts[0].returncode == 0, run.attempts[0].tail()


def test_anthropic_a_lost_create_reply_is_in_doubt_until_resolved_and_never_paid_twice(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    # The first create answers a 500 after the batch exists (Anthropic cannot be asked by key),
    # and a worker dies right after a later create: both must be resolved to the batch that
    # exists, never by creating a second one.
    with chaos_emulator({"create_script": ["create:500_after"]}) as url:
        run = ChaosRun(airflow_home, tmp_path, "anthropic", url, provider="anthropic")
        missed = run.survive([Kill(failpoint="submit.after_create=2")])
        verdict = check_invariants(url, [run])
        count_faults(url)
        left = leftover_script(url)
    assert not verdict.violations, verdict.explain()
    assert not missed, f"kill points never reached: {missed}"
    assert not left, f"create faults never reached: {left}"


def test_a_batch_failed_for_the_token_limit_and_unknown_result_lines_are_normal_outcomes(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    with chaos_emulator({"fail_token_limit": 1, "unknown_result_lines": 2}) as url:
        run = ChaosRun(airflow_home, tmp_path, "failed-batch", url)
        run.resume_until_done(resume=False)
        verdict = check_invariants(url, [run])
        with run.ledger().engine.connect() as conn:
            jobs = list(conn.execute(select(s.jobs).where(s.jobs.c.workload == WORKLOAD)).mappings())
        count_faults(url, ["unknown result line"] * sum(j["unknown_lines"] for j in jobs))
    assert not verdict.violations, verdict.explain()
    assert any(j["batch_state"] == "failed" for j in jobs), [(j["job_id"], j["batch_state"]) for j in jobs]
    assert sum(j["unknown_lines"] for j in jobs) > 0
    # the first run must not fail on the failed batch: it goes to the next round
    assert run.attempts[0].returncode == 0, run.attempts[0].tail()


def test_a_batch_stuck_at_the_deadline_is_cancelled_and_its_items_answered_once_despite_a_kill(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    start = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    with chaos_emulator({"stuck_batches": [0]}) as url:
        run = ChaosRun(
            airflow_home, tmp_path, "deadline", url, attempts=1, deadline="PT45S", logical_date=start
        )
        missed = run.survive(DEADLINE_KILLS)
        verdict = check_invariants(url, [run])
        count_faults(url, ["stuck batch"])
    assert not verdict.violations, verdict.explain()
    assert not missed, f"kill points never reached: {missed}"
    assert verdict.states.get("succeeded") == run.items, verdict.states
