"""The shortest sequences through the stateful machine that break issue 18's guarantees on main.

Written by hand from the issue and replayed through the machine's own rules (the same steps
hypothesis would draw), so each known bug stays a fixed, fast regression case beside the random
search of ``test_stateful.py``. ``make test`` runs them (about half a minute together), as does
``make chaos-long``. See docs/reliability.md ("What it found on unfixed main").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import pytest

from batch_emulator.config import EmulatorConfig, Timings
from batch_emulator.testing import run_emulator
from tests.reliability.test_stateful import Ledgers, machine
from tests.support.stateful_run import shared_ssl_contexts

pytestmark = [pytest.mark.reliability]

OPENAI: Final[dict[str, Any]] = {"provider": "openai", "items": 6, "chunk": 3, "budget": None}
ANTHROPIC: Final[dict[str, Any]] = {**OPENAI, "provider": "anthropic"}
Step = tuple[str, dict[str, Any]]
FINISH_0: Final[Step] = ("finish", {"run": 0, "wait": True})
FINISH_1: Final[Step] = ("finish", {"run": 1, "wait": True})
IN_DOUBT_PAST_DEADLINE: Final[list[Step]] = [
    ("setup", ANTHROPIC),
    ("inject_a_fault", {"fault": "lost_create_reply"}),
    ("run_up_to", {"run": 0, "task": "wait"}),
    ("the_deadline_passes", {"run": 0}),
    ("finish", {"run": 0, "wait": False}),
]
TAKEOVER: Final[list[Step]] = [("kill_a_runs_process", {"run": 0}), ("start_another_run", {}), FINISH_1]
IN_DOUBT_PAST_DEADLINE_DROPPED: Final[list[Step]] = [
    IN_DOUBT_PAST_DEADLINE[0],
    ("inject_a_fault", {"fault": "dropped_create_reply"}),
    *IN_DOUBT_PAST_DEADLINE[2:],
]
#: ``clear_a_task``'s index of the first chunk's submit among a run's done tasks (lease, prepare,
#: the two uploads, then the first submit)
SUBMIT_OF_THE_FIRST_CHUNK: Final = 4
UP_TO_RECONCILE: Final[list[Step]] = [("setup", OPENAI), ("run_up_to", {"run": 0, "task": "reconcile"})]

SEQUENCES: Final[dict[str, list[Step]]] = {
    "bug1_resolve_then_redrive_in_doubt": [
        *IN_DOUBT_PAST_DEADLINE,
        ("resolve_jobs_in_doubt", {"absent": False}),
        ("act_on_review", {"action": "redrive", "code": "in_doubt"}),
        ("start_another_run", {}),
        FINISH_1,
    ],
    # the batch ends before the next run: that run harvests it, prices it once (late_harvest) and
    # the first run stays history, also when it is cleared and finished again afterwards
    "bug1_resolve_then_the_next_run_harvests": [
        *IN_DOUBT_PAST_DEADLINE,
        ("resolve_jobs_in_doubt", {"absent": False}),
        ("act_on_review", {"action": "redrive", "code": "in_doubt"}),
        ("time_passes_at_the_provider", {}),
        ("start_another_run", {}),
        FINISH_1,
        ("clear_run", {"run": 0}),
        FINISH_0,
    ],
    # the still-open finding of docs/reliability.md: a dropped create reply, in doubt past the
    # deadline, the run published; its tasks run again from submit (the batch found and ended):
    # the finished run applies nothing, the next run harvests the batch and prices it once
    "finished_run_rerun_from_submit_leaves_its_in_doubt_batch_to_the_next_run": [
        *IN_DOUBT_PAST_DEADLINE_DROPPED,
        ("inject_a_fault", {"fault": "clear"}),
        ("time_passes_at_the_provider", {}),
        ("time_passes_at_the_provider", {}),
        ("clear_a_task", {"run": 0, "which": SUBMIT_OF_THE_FIRST_CHUNK}),
        FINISH_0,
        ("start_another_run", {}),
        FINISH_1,
    ],
    "bug2_html_page_as_output_file": [*UP_TO_RECONCILE, ("damage_a_result_file", {"how": "html"}), FINISH_0],
    "bug2_truncated_line": [*UP_TO_RECONCILE, ("damage_a_result_file", {"how": "truncate"}), FINISH_0],
    "bug2_error_line_before_success": [
        *UP_TO_RECONCILE,
        ("damage_a_result_file", {"how": "error_first"}),
        FINISH_0,
    ],
    "bug2_rate_malformed": [("setup", OPENAI), ("inject_a_fault", {"fault": "rate_malformed"}), FINISH_0],
    "bug3_prompt_bumped_mid_run": [
        *UP_TO_RECONCILE,
        ("bump_or_edit_the_prompt", {"version": "v2", "wording": ""}),
        FINISH_0,
    ],
    "bug4_a_bad_copy_of_a_good_record": [
        ("setup", OPENAI),
        ("add_a_record_with_the_same_id", {"index": 1, "bad": True}),
        FINISH_0,
    ],
    "bug8_a_killed_run_keeps_its_workload": [
        ("setup", OPENAI),
        ("run_up_to", {"run": 0, "task": "wait"}),
        ("kill_a_runs_process", {"run": 0}),
        ("start_another_run", {}),
        FINISH_1,
    ],
    # the run that took the workload over adopts the killed run's jobs wherever they stood
    "bug8_a_killed_runs_staged_jobs_are_created_by_the_run_that_takes_over": [
        ("setup", OPENAI),
        ("run_up_to", {"run": 0, "task": "submit"}),
        *TAKEOVER,
    ],
    "bug8_a_batch_created_before_the_kill_is_found_not_bought_again": [
        ("setup", OPENAI),
        ("kill_at_a_fail_point", {"run": 0, "point": "submit.after_create", "nth": ""}),
        *TAKEOVER,
    ],
    # found by the derandomized search (2026-12-02): an Anthropic batch created before the kill,
    # then the same run's tasks killed again mid-download
    "anthropic_a_batch_created_before_a_kill_is_not_bought_again": [
        ("setup", ANTHROPIC),
        ("kill_at_a_fail_point", {"run": 0, "point": "submit.after_create", "nth": ""}),
        ("kill_at_a_fail_point", {"run": 1, "point": "download.mid", "nth": ""}),
    ],
    "bug8_a_result_file_half_applied_before_the_kill_is_applied_once": [
        ("setup", OPENAI),
        ("kill_at_a_fail_point", {"run": 0, "point": "reconcile.mid", "nth": ""}),
        *TAKEOVER,
    ],
    "bug8_items_prepared_before_the_kill_are_sent_by_the_run_that_takes_over": [
        ("setup", OPENAI),
        ("kill_at_a_fail_point", {"run": 0, "point": "prepare.after_upsert", "nth": ""}),
        *TAKEOVER,
    ],
    "bug8_the_killed_run_cleared_after_the_takeover_applies_and_pays_nothing_twice": [
        ("setup", OPENAI),
        ("run_up_to", {"run": 0, "task": "wait"}),
        *TAKEOVER,
        ("clear_run", {"run": 0}),
        FINISH_0,
    ],
    "bug8_a_cleared_task_of_the_killed_run_leaves_the_adopted_jobs_to_the_run_that_owns_them": [
        ("setup", OPENAI),
        ("run_up_to", {"run": 0, "task": "wait"}),
        *TAKEOVER,
        ("clear_a_task", {"run": 0, "which": 2}),
        FINISH_0,
    ],
    # issue 18, left open: what a killed run had already reconciled is priced by the run that
    # takes its workload over, once (its report), whenever the kill came
    "bug8_answers_a_killed_run_reconciled_in_round_1_are_priced_by_the_run_that_takes_over": [
        ("setup", OPENAI),
        ("inject_a_fault", {"fault": "expire_next"}),
        ("run_up_to", {"run": 0, "task": "resubmit"}),
        ("run_up_to", {"run": 0, "task": "wait"}),
        *TAKEOVER,
    ],
    "bug8_answers_a_killed_run_reconciled_before_its_publish_are_priced_by_the_run_that_takes_over": [
        ("setup", OPENAI),
        ("run_up_to", {"run": 0, "task": "publish"}),
        *TAKEOVER,
    ],
    # a second takeover: the run that took over dies in its turn, after it reconciled what it adopted
    "bug8_a_second_takeover_prices_what_both_dead_runs_reconciled_once": [
        ("setup", OPENAI),
        ("inject_a_fault", {"fault": "expire_next"}),
        ("run_up_to", {"run": 0, "task": "resubmit"}),
        ("run_up_to", {"run": 0, "task": "wait"}),
        ("kill_a_runs_process", {"run": 0}),
        ("start_another_run", {}),
        ("run_up_to", {"run": 1, "task": "deadline_branch"}),
        ("kill_a_runs_process", {"run": 1}),
        ("start_another_run", {}),
        ("finish", {"run": 2, "wait": True}),
    ],
    # the dead run cleared and run again after the takeover: it prices nothing a second time
    "bug8_a_killed_run_cleared_after_the_takeover_prices_nothing_it_reconciled_twice": [
        ("setup", OPENAI),
        ("run_up_to", {"run": 0, "task": "publish"}),
        *TAKEOVER,
        ("clear_run", {"run": 0}),
        FINISH_0,
        ("start_another_run", {}),
        ("finish", {"run": 2, "wait": True}),
    ],
    # found by the derandomized search once it reached takeovers (2026-12-02, not shrunk): a
    # finished run cleared and reopened, then failed and taken over, then killed; its recorded
    # report priced its answers, so the run that took over inherits none of them (it did: the
    # reports counted 834 input tokens, the emulator billed 630)
    "a_reopened_run_taken_over_keeps_what_its_recorded_report_priced": [
        ("setup", {**OPENAI, "chunk": 4}),
        FINISH_0,
        ("bump_or_edit_the_prompt", {"version": "v1", "wording": " Answer in one word."}),
        ("every_run_to_its_end", {}),
        ("edit_the_input", {"index": 13, "text": "great, thanks"}),
        ("edit_the_input", {"index": 17, "text": "the parcel was lost"}),
        ("bump_or_edit_the_prompt", {"version": "v2", "wording": ""}),
        ("start_another_run", {}),
        ("clear_run", {"run": 0}),
        ("add_a_record_with_the_same_id", {"index": 0, "bad": False}),
        ("edit_the_input", {"index": 12, "text": None}),
        ("next_task", {"run": 0}),
        ("advance", {"run": 1, "tasks": 12}),
        ("every_run_to_its_end", {}),
        ("act_on_review", {"action": "redrive", "code": "already_in_run"}),
        ("kill_a_runs_process", {"run": 0}),
    ],
    "bug5_fixed_input_and_cleared_run": [
        ("setup", OPENAI),
        ("edit_the_input", {"index": 1, "text": None}),
        FINISH_0,
        ("edit_the_input", {"index": 1, "text": "fixed"}),
        ("clear_run", {"run": 0}),
        FINISH_0,
    ],
    "bug6_clearing_an_older_run": [
        ("setup", OPENAI),
        FINISH_0,
        ("edit_the_input", {"index": 1, "text": "changed"}),
        ("start_another_run", {}),
        FINISH_1,
        ("clear_run", {"run": 0}),
        FINISH_0,
    ],
    # the same version with other wording: every item's rendered request changed, so it is sent
    # and paid again, for a reason the ledger records (``abp_prompt_changes``, the report's
    # ``prompt_changed``); the machine counts that record as the reason, nothing else
    "prompt_edited_in_place_between_two_runs": [
        ("setup", OPENAI),
        ("every_run_to_its_end", {}),
        ("bump_or_edit_the_prompt", {"version": "v1", "wording": " Answer in one word."}),
        ("start_another_run", {}),
        ("every_run_to_its_end", {}),
    ],
    # the open finding of 2026-12-02 (docs/reliability.md): custom ids count attempts per item
    # and prompt version, so the v2 run sends r000__a1c0 again in its own batch; the machine
    # counted that as v2's answer billed twice (a false alarm: two items, each billed once)
    "a_prompt_bumped_between_runs_sends_the_same_custom_ids_for_new_items": [
        ("setup", OPENAI),
        FINISH_0,
        ("bump_or_edit_the_prompt", {"version": "v2", "wording": ""}),
        ("start_another_run", {}),
        ("run_up_to", {"run": 1, "task": "reconcile"}),
        FINISH_1,
    ],
    "bug9_redrive_in_doubt_without_resolve": [
        *IN_DOUBT_PAST_DEADLINE,
        ("act_on_review", {"action": "redrive", "code": "in_doubt"}),
        ("start_another_run", {}),
        FINISH_1,
    ],
    # a wait on a job in doubt before the deadline: it defers between look-ups (the trigger's
    # recheck), never sleeps in its worker slot
    "bug7_a_wait_on_a_job_in_doubt_defers_and_holds_no_worker_slot": [
        ("setup", ANTHROPIC),
        ("inject_a_fault", {"fault": "lost_create_reply"}),
        ("run_up_to", {"run": 0, "task": "wait"}),
        ("next_task", {"run": 0}),
        ("time_passes_at_the_provider", {}),
        FINISH_0,
    ],
    "bug10_sync_fallback_over_budget": [
        ("setup", {**OPENAI, "budget": "0.00006"}),
        ("inject_a_fault", {"fault": "stuck_next"}),
        ("run_up_to", {"run": 0, "task": "wait"}),
        ("the_deadline_passes", {"run": 0}),
        FINISH_0,
    ],
}


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    timings = Timings(validating_s=1.0, in_progress_s=5.0, finalizing_s=1.0, cancelling_s=0.0)
    with shared_ssl_contexts(), run_emulator(EmulatorConfig(seed=7, time_scale=1.0, timings=timings)) as url:
        yield url


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_a_known_sequence_keeps_every_item_answered_once_and_every_billed_answer_priced(
    emulator: str, name: str
) -> None:
    from airflow_batch_provider.operators import batch as batch_ops
    from airflow_batch_provider.operators import liveness

    saved, signs = batch_ops.dagrun_state, liveness.holder_task_instances
    state = machine(emulator, Ledgers("sqlite"), [])()
    try:
        state.exactly_once()
        for rule, kwargs in SEQUENCES[name]:
            getattr(state, rule)(**kwargs)
            state.exactly_once()
    finally:
        state.teardown()
        batch_ops.dagrun_state = saved  # type: ignore[assignment]
        liveness.holder_task_instances = signs  # type: ignore[assignment]
