"""Every line the provider billed is priced, whatever its fate, and the report's bill is the provider's.

The emulator's own bill (``GET /_emulator/record``: ``billed`` per item, ``billed_again`` per
second answer) is the reference; each test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_batch_provider.core.results import ItemResult, MalformedLine, Usage
from airflow_batch_provider.services.harvest import reconcile_job
from airflow_batch_provider.services.report import build_report
from airflow_batch_provider.services.result_lines import LineSorter, succeeded_ids
from tests.unit.services.test_harvest import submitted
from tests.unit.services.workload import RUN, WORKLOAD, World, world

TOKENS = ("input_tokens", "cached_input_tokens", "cache_write_tokens", "output_tokens")


def price(usage: Usage) -> Decimal:
    return Decimal(usage.input_tokens + usage.output_tokens) / 1000


def bills(w: World) -> Iterator[tuple[str, dict[str, int], bool]]:
    """``(custom_id, tokens, again)`` of every bill in the emulator's record."""
    record = httpx.get(f"{w.url}/_emulator/record").json()
    for batches in record["batches"].values():
        for batch in batches:
            for cid, usage in (batch["billed"] or {}).items():
                yield cid, usage, False
            for cid, usage in batch["billed_again"] or []:
                yield cid, usage, True


def total(usages: Iterator[dict[str, int]] | list[dict[str, int]]) -> dict[str, int]:
    out = dict.fromkeys(TOKENS, 0)
    for usage in usages:
        for key in TOKENS:
            out[key] += int(usage[key])
    return out


def reconciled(w: World, n: int) -> tuple[str, dict[str, Any]]:
    (job_id,) = submitted(w, n)
    w.wait_terminal(job_id)
    summary = reconcile_job(w.ledger, w.adapter, w.staging, job_id, w.prompt, price)
    assert summary["complete"] is True
    return job_id, summary


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_error_line_for_an_id_never_wins_over_its_success_and_a_second_answer_is_priced_as_a_duplicate(
    tmp_path: Path, ledger_url: str, provider: str
) -> None:
    faults = {"rate_error_before_success": 0.4, "rate_duplicate_other": 0.4, "rate_duplicate": 0.3}
    with world(tmp_path, provider, ledger_url=ledger_url, faults=faults) as w:
        _, summary = reconciled(w, 20)
        assert w.ledger.count_states(WORKLOAD, RUN) == {"succeeded": 20}
        assert summary["duplicates"] > 0
        if provider == "anthropic":  # one results file: the error line comes before the success
            assert summary["superseded"] > 0
        every = list(bills(w))
        again = [u for _, u, a in every if a]
        assert again, "the faults gave no second answer; raise the rates"
        report = build_report(w.ledger, WORKLOAD, RUN, provider, None)
        assert report["usage"] == total(u for _, u, _ in every)  # the provider's bill, exactly
        assert report["extra_lines"]["duplicate"] == len(again)
        assert report["discarded_usage"] == total(again)
        assert Decimal(report["paid_by_kind"]["discarded"]) > 0
        rows = {
            r["custom_id"]: r["output_json"]
            for r in w.ledger.iter_items(WORKLOAD, RUN, columns=["custom_id", "output_json"])
        }
        assert not any("answered again" in str(out) for out in rows.values())  # the first success is kept


def test_a_truncated_line_is_priced_at_an_estimate_reported_apart_as_unreadable_and_its_item_is_retried(
    tmp_path: Path, ledger_url: str
) -> None:
    with world(tmp_path, ledger_url=ledger_url, faults={"rate_malformed": 0.3}) as w:
        _, summary = reconciled(w, 20)
        damaged = summary["malformed"]
        assert damaged > 0 and summary["unreadable"] == damaged
        states = w.ledger.count_states(WORKLOAD, RUN)
        assert states == {"succeeded": 20 - damaged, "failed_retryable": damaged}  # missing, resent
        report = build_report(w.ledger, WORKLOAD, RUN, "openai", None)
        unreadable = report["unreadable"]
        assert unreadable["lines"] == damaged and Decimal(unreadable["paid"]) > 0
        estimate = unreadable["estimated_usage"]
        assert estimate["input_tokens"] > 0 and estimate["output_tokens"] >= 8 * damaged  # never free
        kept = {
            r["custom_id"]
            for r in w.ledger.iter_items(WORKLOAD, RUN, columns=["custom_id", "state"], states=["succeeded"])
        }
        readable = total(u for cid, u, _ in bills(w) if cid in kept)
        known = {k: report["usage"][k] - estimate[k] for k in TOKENS}
        assert known == readable  # every readable line priced exactly; the rest at the estimate
        assert "unreadable priced at an estimate" in report["table"]


def test_a_second_copy_with_the_same_answer_is_one_billed_answer_and_another_answer_is_a_duplicate() -> None:
    first = ItemResult("a", "succeeded", output="yes", usage=Usage(5, 1))
    same = ItemResult("a", "succeeded", output="yes", usage=Usage(5, 1))
    other = ItemResult("a", "succeeded", output="no", usage=Usage(5, 2))
    error = ItemResult("b", "failed_retryable", usage=Usage(3, 0), error_code="500")
    success = ItemResult("b", "succeeded", output="ok", usage=Usage(3, 1))
    damaged = MalformedLine(6, "JSONDecodeError", '{"custom_id":"c","resp', "c")
    lines = [first, same, other, error, success, damaged, damaged]
    sorter = LineSorter(succeeded_ids(lines), price)
    assert list(sorter.kept(lines)) == [first, success]
    assert [(x.ordinal, x.kind, x.usage) for x in sorter.extras] == [
        (2, "duplicate", Usage(5, 2)),
        (3, "superseded", Usage(3, 0)),
    ]
    assert (sorter.duplicates, sorter.superseded) == (2, 1)
    assert [(o, d.custom_id) for o, d in sorter.unreadable] == [(5, "c")]  # one damaged answer, written twice
