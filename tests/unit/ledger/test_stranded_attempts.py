"""A dead run's billed answers whose items stay with it, priced once by the run that took its workload over.

On SQLite and PostgreSQL (the ``ledger_url`` fixture), against the emulator: a run reconciles a
batch whose answers fail the prompt's schema (billed, ``invalid_output``, to be sent again), and
dies; the next run takes the workload over and its input no longer holds those records, so the
items stay with the dead run (ledger/stranded_attempts.py).
"""

from __future__ import annotations

from pathlib import Path

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.ledger.inheritance import inherit_harvested_lines
from airflow_batch_provider.ledger.stranded_attempts import STRANDED, inherit_stranded_attempts
from airflow_batch_provider.services import report
from airflow_batch_provider.services.harvest import reconcile_job
from tests.unit.ledger.test_inheritance import NEXT, billed, created, priced, reconciled, take_over
from tests.unit.services.workload import PROMPT, RUN, WORKLOAD, World, world

#: the run's prompt as its reconcile judges it: JSON with a key, which the emulator's text answers lack
JSON = PromptTemplate(
    version=PROMPT.version,
    model=PROMPT.model,
    user=PROMPT.user,
    params=PROMPT.params,
    output_format="json",
    output_schema={"type": "object", "required": ["label"]},
)


def killed_with_answers_to_send_again(w: World) -> str:
    """RUN reconciles a batch whose answers are all ``invalid_output``, creates a second and dies."""
    w.ledger.acquire_workload_lease(WORKLOAD, RUN, "lease-try1", dag_id="d")
    first, second = (str(m["job_id"]) for m in w.stage(6, max_requests=3))
    w.wait_terminal(created(w, first))
    pricer = report.batch_pricer("openai", w.prompt.model, None)
    summary = reconcile_job(w.ledger, w.adapter, w.staging, first, JSON, pricer)
    assert summary["outcomes"]
    states = [r["state"] for r in w.ledger.iter_items(WORKLOAD, RUN, columns=["state"])]
    assert states.count("failed_retryable") == 3, states
    return created(w, second)


def test_answers_of_items_left_with_a_dead_run_are_priced_once_by_the_run_that_took_it_over(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url) as w:
        second = killed_with_answers_to_send_again(w)
        take_over(w, NEXT)  # adopts the second batch; its input no longer holds the first three
        inherit_harvested_lines(w.ledger, WORKLOAD, NEXT, "prepare")
        (moved,) = inherit_stranded_attempts(w.ledger, WORKLOAD, NEXT, "prepare")
        assert (moved["from_run"], moved["attempts"]) == (RUN, 3)
        assert inherit_stranded_attempts(w.ledger, WORKLOAD, NEXT, "prepare") == []  # a cleared prepare
        reconciled(w, second)
        assert priced(w, NEXT) == billed(w)
        # the items stay with the dead run, for a later run to send again; cleared and published
        # later, the dead run prices none of those answers a second time
        retry = [r["state"] for r in w.ledger.iter_items(WORKLOAD, RUN, columns=["state"])]
        assert retry == ["failed_retryable"] * 3
        assert priced(w, NEXT, RUN) == billed(w)
        got = report.build_report(w.ledger, WORKLOAD, NEXT, "openai", None)
        assert [(j["from_run"], j["attempts"]) for j in got["stranded"]] == [(RUN, 3)]
        assert "stranded (billed answers of items left with dead runs" in got["table"]
        assert [r.action for r in w.ledger.audit_log(WORKLOAD)].count(STRANDED) == 1
