"""Another workload's published answers as records, on the real ledger (SQLite and PostgreSQL).

Step 1 (``entities``) is driven through the ledger as its tasks drive it
(:mod:`tests.unit.ledger.answered`); step 2 (``categories``) prepares its records from step 1's
answers with the prepare's own :func:`load_records`, and is answered and published the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, select

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError, RecordSourceError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from airflow_batch_provider.services.records import PrepareResult, Reject, SourceRecord, load_records
from airflow_batch_provider.services.sources_workload import WorkloadSource, read_workload
from tests.unit.ledger.answered import answered_run
from tests.unit.ledger.nights import stage_pending
from tests.unit.ledger.store_support import cost_of, ok

STEP1 = "entities"
STEP2 = "categories"
LINES = WorkloadSource(
    workload=STEP1,
    each="$.answer.line_items",
    fields={"description": "$.item.description", "currency": "$.answer.currency"},
)
PROMPT = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ description }} ({{ currency }})")


def invoice(currency: str, *lines: str) -> dict[str, Any]:
    return {"currency": currency, "line_items": [{"description": d} for d in lines]}


INVOICES = {
    "inv-1": invoice("EUR", "Toner", "Paper"),
    "inv-2": invoice("USD", "Chair"),
    "inv-3": invoice("GBP", "Desk", "Lamp", "Cable"),
}


def read(ledger: Ledger, source: WorkloadSource = LINES, id_field: str = "id") -> list[SourceRecord]:
    return list(read_workload(ledger, source, id_field=id_field))


def step2(ledger: Ledger, run_id: str, source: WorkloadSource = LINES) -> tuple[PrepareResult, list[Reject]]:
    """Prepare step 2's run from step 1's answers; answer what it sends; publish and finish it."""
    rejects: list[Reject] = []
    result = load_records(
        ledger=ledger,
        workload=STEP2,
        run_id=run_id,
        template=PROMPT,
        records=read_workload(ledger, source, id_field=PROMPT.id_field),
        write_reject=rejects.append,
    )
    job_id, cids = stage_pending(ledger, STEP2, run_id)
    if cids:
        ledger.mark_submitted(job_id, f"batch-{job_id}", f"file-{job_id}")
        ledger.apply_results(job_id, [ok(cid) for cid in cids.values()], cost_of)
    ledger.publish(STEP2, run_id)
    ledger.finish_run(STEP2, run_id, {"run": run_id})
    return result, rejects


def sent(ledger: Ledger, run_id: str) -> set[str]:
    """The step-2 items the run sent (an attempt of the run)."""
    a = s.attempts.c
    with ledger.engine.connect() as conn:
        keys = set(conn.execute(select(a.item_key).where(a.workload == STEP2, a.run_id == run_id)).scalars())
    return {str(r["app_id"]) for r in ledger.iter_items(STEP2, run_id) if r["item_key"] in keys}


def states(ledger: Ledger, run_id: str) -> dict[str, str]:
    return {str(r["app_id"]): str(r["state"]) for r in ledger.iter_items(STEP2, run_id)}


def test_each_line_item_of_each_answer_is_a_record_named_by_its_answer_and_index(ledger: Ledger) -> None:
    answered_run(ledger, STEP1, "r1", INVOICES)
    # the answers come in their items' key order, the lines of each in list order
    expected = [
        {"id": f"{app_id}:{n}", "description": line["description"], "currency": INVOICES[app_id]["currency"]}
        for app_id in sorted(INVOICES, key=item_key)
        for n, line in enumerate(INVOICES[app_id]["line_items"])
    ]
    records = read(ledger)
    assert [(r.position, r.value, r.problem) for r in records] == [
        (n, value, None) for n, value in enumerate(expected)
    ]


def test_without_each_an_answer_is_one_record_and_without_fields_the_template_reads_the_envelope(
    ledger: Ledger,
) -> None:
    answered_run(ledger, STEP1, "r1", INVOICES)
    [first, *_] = records = read(ledger, WorkloadSource(workload=STEP1), id_field="ref")
    assert len(records) == 3
    value = dict(first.value or {})
    assert set(value) == {"ref", "answer", "source_id"} and value["ref"] == value["source_id"]
    assert value["answer"] == INVOICES[value["ref"]]
    request = PromptTemplate(
        version="v1", model="m", user="{{ answer.currency }} {{ source_id }}", id_field="ref"
    ).render(value)
    assert request.messages[0]["content"] == f"{INVOICES[value['ref']]['currency']} {value['ref']}"
    keyed = WorkloadSource(workload=STEP1, each="$.answer.line_items", key="$.item.description")
    assert sorted(str((r.value or {})["ref"]) for r in read(ledger, keyed, id_field="ref"))[:2] == [
        "inv-1:Paper",
        "inv-1:Toner",
    ]


def test_a_changed_answer_resends_only_the_records_built_from_it_and_a_gone_answer_takes_its_records_along(
    ledger: Ledger,
) -> None:
    answered_run(ledger, STEP1, "r1", INVOICES)
    first, _ = step2(ledger, "s1")
    assert (first.items, first.ledger.new) == (6, 6)
    assert sent(ledger, "s1") == set(states(ledger, "s1"))
    # step 1 again: inv-1's second line changed, inv-2 left the input, inv-3 the same answer
    changed = {"inv-1": invoice("EUR", "Toner", "Paper, A4"), "inv-3": INVOICES["inv-3"]}
    answered_run(ledger, STEP1, "r2", changed)
    second, _ = step2(ledger, "s2")
    assert (second.read, second.ledger.changed, second.ledger.unchanged, second.ledger.new) == (5, 1, 4, 0)
    assert sent(ledger, "s2") == {"inv-1:1"}
    assert states(ledger, "s2") == {
        "inv-1:0": "unchanged",
        "inv-1:1": "succeeded",
        "inv-3:0": "unchanged",
        "inv-3:1": "unchanged",
        "inv-3:2": "unchanged",
    }  # inv-2's line left the input with its answer
    # step 2 again without a change in step 1: nothing sent
    third, _ = step2(ledger, "s3")
    assert (third.read, third.ledger.unchanged) == (5, 5)
    assert sent(ledger, "s3") == set()


def test_an_answer_of_another_prompt_version_or_a_run_still_running_is_not_read(ledger: Ledger) -> None:
    answered_run(ledger, STEP1, "r1", INVOICES)
    ledger.start_run(STEP1, "r2", "openai", "gpt-4o-mini")  # running: nothing published yet
    assert len(read(ledger)) == 6
    answered_run(ledger, STEP1, "r3", {"inv-2": INVOICES["inv-2"]}, version="v2")
    assert [(r.value or {})["id"] for r in read(ledger)] == ["inv-2:0"]
    pinned = WorkloadSource(workload=STEP1, each="$.answer.line_items", prompt_version="v1")
    with pytest.raises(RecordSourceError, match=r"\(r3\) answered with prompt version 'v2', not 'v1'"):
        read(ledger, pinned)


def test_a_workload_with_no_published_answers_is_refused_naming_it_and_the_remedy(ledger: Ledger) -> None:
    with pytest.raises(RecordSourceError) as caught:
        read(ledger, WorkloadSource(workload="invoice_entities"))
    assert "workload 'invoice_entities' has no published answers in this ledger" in str(caught.value)
    assert "Run the workload's DAG first" in str(caught.value)
    answered_run(ledger, STEP1, "r1", INVOICES)
    ledger.start_run("invoice_entities", "r1", "openai", "gpt-4o-mini")  # started, never published
    with pytest.raises(RecordSourceError, match=r"workloads with published answers: \['entities'\]"):
        read(ledger, WorkloadSource(workload="invoice_entities"))


def test_a_run_publishing_now_or_one_that_finished_while_reading_makes_the_source_refuse(
    ledger: Ledger,
) -> None:
    answered_run(ledger, STEP1, "r1", INVOICES)
    records = read_workload(ledger, LINES, id_field="id")
    next(records)
    answered_run(ledger, STEP1, "r2", INVOICES)  # finished while r1's answers were read
    with pytest.raises(
        RecordSourceError, match=r"run r2 of workload 'entities' published answers while those of run r1"
    ):
        list(records)
    answered_run(ledger, STEP1, "r3", {"inv-1": invoice("EUR", "Ink")}, finish=False)
    with pytest.raises(
        RecordSourceError, match=r"run r3 of workload 'entities' has published part of its answers"
    ):
        read(ledger)


def test_a_missing_field_is_a_reject_with_its_position_and_reason_and_the_others_go_on(
    ledger: Ledger,
) -> None:
    answers = {
        "inv-1": {"currency": "EUR", "line_items": [{"description": "Toner"}, {"sku": "P-4"}]},
        "inv-2": {"line_items": [{"description": "Chair"}]},  # no currency
        "inv-3": {"currency": "GBP", "line_items": "Desk, Lamp"},  # not a list
        "inv-4": {"currency": "GBP"},  # no line items: no records
    }
    answered_run(ledger, STEP1, "r1", answers)
    result, rejects = step2(ledger, "s1")
    assert (result.read, result.items, result.rejected) == (4, 1, 3)
    assert result.rejected_by_code == {"answer_field_missing": 2, "answer_not_a_list": 1}
    by_id = {r.app_id: r for r in rejects}
    assert set(by_id) == {"inv-1:1", "inv-2:0", None}
    missing = by_id["inv-1:1"]
    assert re.search(
        r"^record \d \(id 'inv-1:1'\): the answer of 'inv-1' \(workload 'entities', run r1\), element 1 of "
        r"\$\.answer\.line_items has no '\$\.item\.description' \(field 'description'\): \$\.item holds the "
        r"keys \['sku'\]; map the field",
        missing.message,
    ), missing.message
    assert missing.position == int(missing.message.split()[1])
    assert json.loads(missing.record or "")["id"] == "inv-1:1"
    assert "has no '$.answer.currency' (field 'currency'): $.answer holds the keys ['line_items']" in (
        by_id["inv-2:0"].message
    )
    assert "holds a str at '$.answer.line_items', not a list" in by_id[None].message
    # a reject with an id waits in review, as a bad row of any source does
    assert states(ledger, "s1") == {"inv-1:0": "succeeded", "inv-1:1": "review", "inv-2:0": "review"}


def test_each_naming_a_list_no_answer_has_is_refused_and_where_leaves_records_out(ledger: Ledger) -> None:
    answered_run(ledger, STEP1, "r1", INVOICES)
    typo = WorkloadSource(workload=STEP1, each="$.answer.lines")
    with pytest.raises(
        RecordSourceError, match=r"none of the 3 answers .* has a list at '\$\.answer\.lines'"
    ):
        read(ledger, typo)
    short = WorkloadSource(
        workload=STEP1,
        each="$.answer.line_items",
        fields={"description": "$.item.description"},
        where=lambda record: len(record["description"]) > 4,
    )
    assert sorted((r.value or {})["description"] for r in read(ledger, short)) == [
        "Cable",
        "Chair",
        "Paper",
        "Toner",
    ]


def test_the_answers_are_read_a_page_at_a_time_as_the_records_are_taken(ledger: Ledger) -> None:
    answered_run(ledger, STEP1, "r1", {f"inv-{n:02d}": invoice("EUR", "Toner") for n in range(12)})
    pages: list[Any] = []

    @event.listens_for(ledger.engine, "before_cursor_execute")
    def count(conn: object, cursor: object, statement: str, parameters: Any, *args: object) -> None:
        if statement.startswith("SELECT abp_results.item_key"):
            pages.append(parameters)

    records: Iterator[SourceRecord] = read_workload(
        ledger, WorkloadSource(workload=STEP1, each="$.answer.line_items", page_size=5), id_field="id"
    )
    next(records)
    assert len(pages) == 1  # one page held, not the run
    assert len(list(records)) == 11
    assert len(pages) == 3
    pages.clear()
    read(ledger, WorkloadSource(workload=STEP1, each="$.answer.line_items"))
    assert len(pages) == 1 and 1000 in list(pages[0].values() if isinstance(pages[0], dict) else pages[0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"fields": {"d": "$.description"}},
            r"field 'd': the path '\$\.description' does not start at the envelope.*\$\.answer, \$\.source_id",
        ),
        (
            {"fields": {"d": "$.item.description"}},
            r"field 'd': the path '\$\.item\.description' does not start",
        ),
        (
            {"each": "$.line_items"},
            r"each=: the path '\$\.line_items' does not start at the envelope.*\$\.answer",
        ),
        ({"key": "$.item.sku"}, r"key= names an element of each=, and each= is not given"),
        ({"fields": {"d": "answer.x"}}, r"JSON path 'answer.x' must start with '\$'"),
        ({"workload": "invoice entities"}, r"workload 'invoice entities' is not a valid workload name"),
        ({"page_size": 0}, r"page_size=0 is below 1"),
    ],
)
def test_a_source_that_cannot_be_read_is_refused_when_the_dag_is_parsed(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        WorkloadSource(**{"workload": STEP1, **kwargs})


def test_a_field_named_as_the_prompts_id_field_is_refused(ledger: Ledger) -> None:
    answered_run(ledger, STEP1, "r1", INVOICES)
    with pytest.raises(ConfigurationError, match=r"fields= maps 'id', the prompt's id field"):
        read(ledger, WorkloadSource(workload=STEP1, fields={"id": "$.source_id"}))
