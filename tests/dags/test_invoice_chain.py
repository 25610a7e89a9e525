"""Two workloads chained in one DAG (``tests/dags/dags/invoice_chain.py``), run for real three times.

Real Airflow (``airflow dags test``), the real ``anthropic`` SDK over HTTP to the emulator, one
ledger. Step 1 extracts invoices; step 2 categorises each billed line step 1 found, reading step 1's
published answers (``WorkloadSource``). Night 1 runs both; before night 2 one line of one invoice
is edited and another invoice leaves the input; night 3 changes nothing. What each night sent is
read from the emulator's own record of the batches it was given, mapped to items by the ledger.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger import schema as s
from batch_emulator import model
from batch_emulator.testing import run_emulator
from tests.support.airflow_run import FAST, anthropic_connection, batch_env, run_airflow, tail
from tests.support.invoices import generated_invoices

pytestmark = pytest.mark.airflow_e2e

DAGS = Path(__file__).parent / "dags"
STEP1, STEP2 = "chain_invoices", "chain_lines"
EDITED_LINE = "Freight surcharge"


@dataclass
class Night:
    """One ``dags test`` of the chain: each step's run and the items its batches carried."""

    runs: dict[str, str]
    items: dict[str, dict[str, dict[str, Any]]]
    sent: dict[str, set[str]]
    output: str


@dataclass
class Chain:
    ledger: Ledger
    invoices: list[dict[str, Any]]
    nights: list[Night] = field(default_factory=list)
    edited: str = ""
    removed: str = ""

    def items(self, workload: str, night: int) -> dict[str, dict[str, Any]]:
        """The workload's items in that night's run, as they were when the night ended."""
        return self.nights[night].items[workload]


def write(path: Path, invoices: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(i) + "\n" for i in invoices), encoding="utf-8")


def night(env: dict[str, str], ledger: Ledger, url: str, seen: set[str]) -> Night:
    """Run the DAG once; return each workload's new run and the app ids the batches it created carried."""
    before = {w: {r["run_id"] for r in ledger.runs(w)} for w in (STEP1, STEP2)}
    proc = run_airflow(env, "dags", "test", "invoice_chain")
    assert proc.returncode == 0, tail(proc)
    runs = {}
    for workload in (STEP1, STEP2):
        (new,) = [r["run_id"] for r in ledger.runs(workload) if r["run_id"] not in before[workload]]
        runs[workload] = new
    batches = [b for b in httpx.get(f"{url}/_emulator/record").json()["batches"].get("anthropic", [])]
    new_batches = {b["id"]: set(b["custom_ids"]) for b in batches if b["id"] not in seen}
    seen.update(b["id"] for b in batches)
    a, i, j = s.attempts.c, s.items.c, s.jobs.c
    sent: dict[str, set[str]] = {STEP1: set(), STEP2: set()}
    with ledger.engine.connect() as conn:
        rows = conn.execute(
            select(j.batch_id, a.custom_id, a.workload, i.app_id)
            .select_from(
                s.attempts.join(s.jobs, j.job_id == a.job_id).join(
                    s.items, (i.workload == a.workload) & (i.item_key == a.item_key)
                )
            )
            .where(j.batch_id.in_(sorted(new_batches)))
        ).all()
    for batch_id, custom_id, workload, app_id in rows:
        assert custom_id in new_batches[batch_id]
        sent[str(workload)].add(str(app_id))
    # every line the emulator was given is an attempt the ledger recorded, and no other
    assert sorted((b, c) for b, c, _, _ in rows) == sorted(
        (b, c) for b, cs in new_batches.items() for c in cs
    )
    # an item's row moves to the next run that takes it: keep each night's as it ended
    items = {w: {str(r["app_id"]): dict(r) for r in ledger.iter_items(w, runs[w])} for w in runs}
    return Night(runs, items, sent, proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def chain(airflow_home: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    tmp = tmp_path_factory.mktemp("chain")
    invoices = generated_invoices(24)
    path = tmp / "invoices.jsonl"
    with run_emulator(FAST) as url:
        env = batch_env(
            airflow_home,
            tmp,
            {"anthropic_batch_default": anthropic_connection(url)},
        )
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS)
        env["ABP_CHAIN_INVOICES"] = str(path)
        ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
        chain = Chain(ledger, invoices)
        seen: set[str] = set()
        write(path, invoices)
        chain.nights.append(night(env, ledger, url, seen))
        # one line of one invoice edited, another invoice gone
        clean = [inv for inv in invoices if inv["_variant"] == "clean" and len(lines_of(inv)) >= 2]
        chain.edited, chain.removed = clean[0]["id"], clean[1]["id"]
        old = lines_of(clean[0])[1]["description"]
        edited = {**clean[0], "document": clean[0]["document"].replace(f"  {old}:", f"  {EDITED_LINE}:")}
        write(path, [edited if inv is clean[0] else inv for inv in invoices if inv is not clean[1]])
        chain.nights.append(night(env, ledger, url, seen))
        chain.nights.append(night(env, ledger, url, seen))  # nothing changed
        yield chain


def lines_of(invoice: dict[str, Any]) -> list[dict[str, Any]]:
    """The billed lines the stand-in model extracts from an invoice (what step 1 answers)."""
    return list(model.extract_invoice(invoice["document"])["line_items"])


def test_step_two_gets_one_item_per_line_of_each_answered_invoice_and_none_of_an_invoice_in_review(
    chain: Chain,
) -> None:
    step1 = chain.items(STEP1, 0)
    answered = {app_id for app_id, r in step1.items() if r["state"] == "succeeded"}
    assert answered and {r["state"] for r in step1.values()} == {"succeeded", "review"}
    by_id = {inv["id"]: inv for inv in chain.invoices}
    expected = {f"{i}:{n}": line for i in answered for n, line in enumerate(lines_of(by_id[i]))}
    step2 = chain.items(STEP2, 0)
    assert set(step2) == set(expected) and {r["state"] for r in step2.values()} == {"succeeded"}
    assert chain.nights[0].sent == {STEP1: set(step1), STEP2: set(expected)}
    for app_id, row in step2.items():
        line, currency = expected[app_id], json.loads(step1[app_id.split(":")[0]]["output_json"])["currency"]
        text = f"Line: {line['description']} ({currency} {line['amount']})"
        assert json.loads(row["output_json"]) == model.categorise(text), app_id


def test_an_edited_line_is_the_one_item_step_two_sends_again_and_a_gone_invoice_takes_its_lines_along(
    chain: Chain,
) -> None:
    second = chain.nights[1]
    assert second.sent[STEP1] == {chain.edited}
    edited = f"{chain.edited}:1"
    assert second.sent[STEP2] == {edited}
    step2 = chain.items(STEP2, 1)
    assert json.loads(step2[edited]["output_json"])["category"] == "logistics"  # the freight line
    before = chain.items(STEP2, 0)
    gone = {app_id for app_id in before if app_id.startswith(f"{chain.removed}:")}
    assert gone and set(step2) == set(before) - gone
    assert {app_id for app_id, r in step2.items() if r["state"] != "unchanged"} == {edited}
    assert f"ledger: 0 new, 1 changed, {len(step2) - 1} unchanged (skipped)" in second.output


def test_a_night_with_nothing_changed_sends_nothing_in_either_step(chain: Chain) -> None:
    third = chain.nights[2]
    assert third.sent == {STEP1: set(), STEP2: set()}
    step2 = chain.items(STEP2, 2)
    assert step2 and {r["state"] for r in step2.values()} == {"unchanged"}
    assert set(step2) == set(chain.items(STEP2, 1))
