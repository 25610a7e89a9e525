"""Hostile input against the record reader and renderer, with a real SQLite ledger.

Every test checks the accounting: items + rejected == read, and the good records are in the
ledger whatever came before or after the bad one.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.services.records import (
    FirstPositions,
    PrepareResult,
    Reject,
    SourceRecord,
    load_records,
    read_csv,
    read_jsonl,
    read_values,
)

PROMPT = PromptTemplate(version="v1", model="gpt-4o-mini", user="{{ channel }}: {{ comment }}")
RUN = "manual__2026-11-30T00:00:00+00:00"


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite'}")


def load(
    ledger: Ledger, records: Iterable[SourceRecord], template: PromptTemplate = PROMPT
) -> tuple[PrepareResult, list[Reject]]:
    rejects: list[Reject] = []
    result = load_records(
        ledger=ledger,
        workload="w",
        run_id=RUN,
        template=template,
        records=records,
        write_reject=rejects.append,
    )
    assert result.items + result.rejected == result.read
    assert len(rejects) == result.rejected
    return result, rejects


def states(ledger: Ledger) -> dict[str, str]:
    return {r["app_id"]: r["state"] for r in ledger.iter_items("w", RUN, columns=["app_id", "state"])}


def csv_bytes(*rows: str | bytes) -> io.BytesIO:
    return io.BytesIO(b"\r\n".join(r if isinstance(r, bytes) else r.encode() for r in rows) + b"\r\n")


def good_rows(start: int, stop: int) -> list[str]:
    return [f'c{i},email,"fine, {i}"' for i in range(start, stop)]


def test_a_non_utf8_byte_in_a_csv_rejects_only_its_row_and_the_rest_of_the_file_is_read(
    ledger: Ledger,
) -> None:
    fh = csv_bytes("id,channel,comment", *good_rows(0, 3), b"bad,email,caf\xe9", *good_rows(3, 6))
    result, (reject,) = load(ledger, read_csv(fh))
    assert (result.read, result.items, result.rejected) == (7, 6, 1)
    assert (reject.line, reject.position, reject.code) == (5, 3, "invalid_utf8")
    assert (
        "line 5 is not UTF-8 (byte 13" in reject.message and "re-encode the source as UTF-8" in reject.message
    )
    assert reject.record == "bad,email,caf\ufffd"
    assert states(ledger) == {f"c{i}": "pending" for i in range(6)}


def test_a_csv_row_with_an_extra_cell_is_rejected_for_review_and_names_the_cells(ledger: Ledger) -> None:
    fh = csv_bytes("id,channel,comment", "a,email,one", "b,email,two, with a comma", "c,email,three")
    result, (reject,) = load(ledger, read_csv(fh))
    assert (result.items, reject.code, reject.app_id, reject.line) == (2, "csv_extra_cell", "b", 3)
    assert "has 4 cells but the header has 3 columns (extra: [' with a comma'])" in reject.message
    assert "quote values that contain a comma" in reject.message
    assert states(ledger) == {"a": "pending", "b": "review", "c": "pending"}


def test_a_csv_row_with_a_missing_cell_is_rejected_naming_the_column_not_sent_as_none(ledger: Ledger) -> None:
    fh = csv_bytes("id,channel,comment", "a,email", "b,email,ok")
    _result, (reject,) = load(ledger, read_csv(fh))
    assert (reject.code, reject.app_id) == ("csv_missing_cell", "a")
    assert "no value for 'comment'" in reject.message
    assert states(ledger) == {"a": "review", "b": "pending"}
    (row,) = ledger.iter_items("w", RUN, states=["pending"], columns=["request_json"])
    assert "None" not in row["request_json"]


def test_an_empty_cell_is_a_value_and_a_blank_line_is_not_a_record(ledger: Ledger) -> None:
    fh = csv_bytes("id,channel,comment", "a,email,", "", "b,email,x")
    result, rejects = load(ledger, read_csv(fh))
    assert (result.read, result.items, rejects) == (2, 2, [])


def test_a_quoted_cell_over_several_lines_is_one_record_and_later_line_numbers_stay_right(
    ledger: Ledger,
) -> None:
    fh = csv_bytes("\ufeffid,channel,comment", 'a,email,"two\nlines"', "b,email")
    result, (reject,) = load(ledger, read_csv(fh))
    assert result.read == 2 and reject.line == 4 and reject.app_id == "b"
    (row,) = ledger.iter_items("w", RUN, states=["pending"], columns=["request_json"])
    assert "two\\nlines" in row["request_json"]


def test_an_unclosed_quote_does_not_swallow_the_rest_of_the_file_into_one_item(ledger: Ledger) -> None:
    fh = csv_bytes("id,channel,comment", "a,email,x", 'b,email,"unclosed', "c,email,y", "d,email,z")
    result, (reject,) = load(ledger, read_csv(fh))
    assert (result.read, result.items, reject.code, reject.line) == (2, 1, "csv_malformed", 3)
    assert "lines 3-5 are not a valid CSV row (unexpected end of data)" in reject.message
    # the swallowed rows are not lost: the reject keeps them whole
    assert reject.record is not None and "c,email,y" in reject.record and "d,email,z" in reject.record
    assert states(ledger) == {"a": "pending"}


def test_a_stray_quote_costs_its_rows_and_reading_goes_on_after_them(ledger: Ledger) -> None:
    fh = csv_bytes("id,channel,comment", 'b,email,"open', 'c,email,"y"', "d,email,z")
    result, (reject,) = load(ledger, read_csv(fh))
    assert (result.read, reject.code, reject.line) == (2, "csv_malformed", 2)
    assert states(ledger) == {"d": "pending"}


def test_a_value_over_the_csv_readers_limit_is_rejected_with_the_remedy(ledger: Ledger) -> None:
    fh = csv_bytes("id,channel,comment", f'a,email,"{"w" * 200_000}"', "b,email,ok")
    result, (reject,) = load(ledger, read_csv(fh))
    assert (result.read, reject.code, reject.line) == (2, "csv_malformed", 2)
    assert "give values this long in JSONL" in reject.message
    assert states(ledger) == {"b": "pending"}


def test_a_csv_column_named_self_is_an_ordinary_field(ledger: Ledger) -> None:
    fh = csv_bytes("id,self,channel,comment", "a,me,email,x")
    result, rejects = load(ledger, read_csv(fh))
    assert (result.items, rejects) == (1, [])


@pytest.mark.parametrize(
    ("header", "match"),
    [("id,comment,comment", "repeats the column"), (b"id,comm\xe9nt", "header is not UTF-8")],
)
def test_an_unreadable_csv_header_stops_the_source_with_the_reason(
    ledger: Ledger, header: str | bytes, match: str
) -> None:
    result, _ = load(ledger, read_csv(csv_bytes(header, "a,x")))
    assert result.read == 0 and result.source_error is not None and match in result.source_error


def test_a_template_that_raises_for_one_record_rejects_that_record_only(ledger: Ledger) -> None:
    template = PromptTemplate(
        version="v1", model="m", user="{{ 100 / n }} {% if n == 2 %}{{ n | nope }}{% endif %}"
    )
    values = [{"id": f"r{n}", "n": n} for n in (1, 0, 2, 3)]
    _result, rejects = load(ledger, read_values(lambda: values), template)
    assert [(r.app_id, r.code) for r in rejects] == [("r0", "template_error"), ("r2", "template_error")]
    assert "ZeroDivisionError" in rejects[0].message and "No filter named 'nope'" in rejects[1].message
    assert states(ledger) == {"r1": "pending", "r0": "review", "r2": "review", "r3": "pending"}


def test_a_callable_yielding_something_else_than_a_dict_rejects_that_value(ledger: Ledger) -> None:
    values: list[Any] = [{"id": "a", "channel": "c", "comment": "x"}, ["not", "a", "dict"], None, "text"]
    result, rejects = load(ledger, read_values(lambda: values))
    assert (result.read, result.items) == (4, 1)
    assert [(r.position, r.code) for r in rejects] == [
        (1, "invalid_record"),
        (2, "invalid_record"),
        (3, "invalid_record"),
    ]
    assert "yielded a list, not a dict" in rejects[0].message
    assert rejects[0].record == '["not", "a", "dict"]'


def test_a_callable_that_raises_midway_keeps_what_it_yielded_and_says_where_it_stopped(
    ledger: Ledger,
) -> None:
    def produce() -> Iterator[dict[str, Any]]:
        for i in range(1500):  # more than one ledger write slice
            if i == 1203:
                raise ConnectionError("warehouse went away")
            yield {"id": f"r{i}", "channel": "c", "comment": "x"}

    result, rejects = load(ledger, read_values(produce))
    assert (result.read, result.items, rejects) == (1203, 1203, [])
    assert (
        result.source_error
        == "after 1203 records, reading the source raised ConnectionError: warehouse went away"
    )
    assert len(states(ledger)) == 1203


def test_a_callable_that_raises_before_yielding_is_a_source_error_not_a_crash(ledger: Ledger) -> None:
    def produce() -> list[dict[str, Any]]:
        raise RuntimeError("no table")

    result, _ = load(ledger, read_values(produce))
    assert (
        result.read == 0
        and result.source_error is not None
        and "RuntimeError: no table" in result.source_error
    )


def test_jsonl_lines_that_are_not_objects_or_not_json_or_not_utf8_are_rejected_and_the_rest_go_on(
    ledger: Ledger,
) -> None:
    lines = [
        b'{"id": "a", "channel": "c", "comment": "x"}',
        b"[1, 2]",
        b'"just a string"',
        b'{"id": "b", "comment": ',
        b"",
        b'{"id": "lat", "channel": "c", "comment": "caf\xe9"}',
        b'{"id": "z", "channel": "c", "comment": "y"}',
    ]
    result, rejects = load(ledger, read_jsonl(io.BytesIO(b"\n".join(lines) + b"\n")))
    assert (result.read, result.items) == (6, 2)
    assert [(r.line, r.code) for r in rejects] == [
        (2, "invalid_json"),
        (3, "invalid_json"),
        (4, "invalid_json"),
        (6, "invalid_utf8"),
    ]
    assert "line 2 is a JSON list, not an object" in rejects[0].message
    assert "line 4 is not JSON" in rejects[2].message
    assert states(ledger) == {"a": "pending", "z": "pending"}


@pytest.mark.parametrize("value", ["", "   ", None, "\t"])
def test_an_empty_or_blank_id_is_rejected_and_kept_in_the_rejects_file(ledger: Ledger, value: Any) -> None:
    values = [{"id": value, "channel": "c", "comment": "x"}, {"id": "ok", "channel": "c", "comment": "x"}]
    _result, (reject,) = load(ledger, read_values(lambda: values))
    assert (
        reject.code == "missing_id"
        and reject.app_id is None
        and json.loads(reject.record or "")["comment"] == "x"
    )
    assert states(ledger) == {"ok": "pending"}


def test_a_duplicate_id_keeps_the_first_record_and_rejects_the_later_ones(ledger: Ledger) -> None:
    values = [
        {"id": "a", "channel": "c", "comment": "first"},
        {"id": "a", "channel": "c", "comment": "second"},
        {"id": 7, "channel": "c", "comment": "int"},
        {"id": "7", "channel": "c", "comment": "str"},
    ]
    _result, rejects = load(ledger, read_values(lambda: values))
    assert [(r.position, r.app_id, r.code) for r in rejects] == [
        (1, "a", "duplicate_id"),
        (3, "7", "duplicate_id"),
    ]
    assert "repeats the id of record 0; the first is kept" in rejects[0].message
    rows = {r["app_id"]: r for r in ledger.iter_items("w", RUN, columns=["app_id", "request_json"])}
    assert "first" in rows["a"]["request_json"] and "int" in rows["7"]["request_json"]
    assert states(ledger) == {"a": "pending", "7": "pending"}


def test_first_positions_hold_at_most_a_flush_of_ids_in_memory_and_still_know_every_first_position() -> None:
    first = FirstPositions(flush=100)
    for n in range(1_000):
        assert first.setdefault(f"id-{n}", n) == n
        assert first.held() < 100
    # every id, written long ago or still held, answers its first position, not the new one
    assert [first.setdefault(f"id-{n}", 5_000 + n) for n in range(0, 1_000, 37)] == list(range(0, 1_000, 37))
    first.close()
    assert first.held() == 0


def test_a_duplicate_id_far_after_its_first_record_is_still_rejected_with_the_first_position(
    ledger: Ledger,
) -> None:
    values = [{"id": f"r{n}", "channel": "c", "comment": "x"} for n in range(25_000)]
    values.append({"id": "r3", "channel": "c", "comment": "late copy"})  # 25,000 records later
    result, rejects = load(ledger, read_values(lambda: values))
    assert [(r.position, r.app_id, r.code) for r in rejects] == [(25_000, "r3", "duplicate_id")]
    assert "repeats the id of record 3; the first is kept" in rejects[0].message
    assert result.items == 25_000


def test_a_rerun_of_the_same_input_converges_to_the_same_ledger_and_counts(ledger: Ledger) -> None:
    rows = ("id,channel,comment", "a,email,x", "b,email", "c,email,y")
    first, _ = load(ledger, read_csv(csv_bytes(*rows)))
    again, _ = load(ledger, read_csv(csv_bytes(*rows)))
    assert (again.read, again.items, again.rejected) == (first.read, first.items, first.rejected)
    assert again.ledger.already_in_run == 2
    assert states(ledger) == {"a": "pending", "b": "review", "c": "pending"}


def test_the_counts_travel_as_a_small_json_dict_and_a_log_line() -> None:
    result = PrepareResult(read=3, items=2, rejected=1, rejected_by_code={"invalid_json": 1})
    assert json.loads(json.dumps(result.to_dict()))["rejected_by_code"] == {"invalid_json": 1}
    assert result.describe().startswith("3 records read: 2 items, 1 rejected {'invalid_json': 1}")
    with pytest.raises(AssertionError, match="do not add up"):
        PrepareResult(read=3, items=1, rejected=1)


def test_a_kind_the_provider_does_not_accept_is_refused_before_any_record_is_read(ledger: Ledger) -> None:
    from airflow_batch_provider.adapters.anthropic import AnthropicBatchAdapter
    from airflow_batch_provider.exceptions import ConfigurationError

    read: list[int] = []

    def produce() -> Iterator[dict[str, Any]]:
        read.append(1)
        yield {"id": "1", "channel": "web", "comment": "great"}

    template = PromptTemplate(version="v1", model="claude-haiku-4-5", user="{{ comment }}", kind="response")
    with pytest.raises(ConfigurationError) as caught:
        load_records(
            ledger=ledger,
            workload="reviews",
            run_id=RUN,
            template=template,
            records=read_values(produce),
            write_reject=lambda r: None,
            adapter=AnthropicBatchAdapter,
        )
    message = str(caught.value)
    for words in (
        "workload 'reviews'",
        "'response' requests",
        "provider 'anthropic'",
        "['chat']",
        "accept 'response': openai",
    ):
        assert words in message
    assert read == [] and states(ledger) == {}


def test_a_kind_the_provider_accepts_is_loaded(ledger: Ledger) -> None:
    from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter

    template = PromptTemplate(
        version="v1", model="omni-moderation-latest", user="{{ comment }}", kind="moderation"
    )
    result = load_records(
        ledger=ledger,
        workload="w",
        run_id=RUN,
        template=template,
        records=read_values(lambda: [{"id": "1", "comment": "great"}]),
        write_reject=lambda r: None,
        adapter=OpenAIBatchAdapter,
    )
    assert result.items == 1


# ------------------------------------------------- what a run keeps, what a rerun may change (issue 18)


@pytest.fixture
def any_ledger(ledger_url: str) -> Ledger:
    return Ledger.from_url(ledger_url)


def load_run(ledger: Ledger, run_id: str, values: list[dict[str, Any]]) -> tuple[PrepareResult, list[Reject]]:
    rejects: list[Reject] = []
    result = load_records(
        ledger=ledger,
        workload="w",
        run_id=run_id,
        template=PROMPT,
        records=read_values(lambda: values),
        write_reject=rejects.append,
    )
    return result, rejects


def rows_of(ledger: Ledger, run_id: str) -> dict[str, tuple[str, str | None]]:
    return {
        r["app_id"]: (r["state"], r["error_code"])
        for r in ledger.iter_items("w", run_id, columns=["app_id", "state", "error_code"])
    }


@pytest.mark.parametrize("bad_first", [True, False])
def test_a_good_record_is_the_item_whatever_a_bad_copy_of_its_id_says_before_or_after_it(
    any_ledger: Ledger, bad_first: bool
) -> None:
    good = {"id": "a", "channel": "email", "comment": "fine"}
    bad = {"id": "a", "channel": "email"}  # no comment: the template names it
    values = [bad, good] if bad_first else [good, bad]
    result, (reject,) = load_run(any_ledger, RUN, [*values, {"id": "b", "channel": "c", "comment": "x"}])
    assert (result.read, result.items, result.rejected) == (3, 2, 1)
    assert reject.position == (0 if bad_first else 1) and reject.app_id == "a"
    assert reject.code == "template_variable_missing" and "comment" in reject.message
    assert rows_of(any_ledger, RUN) == {"a": ("pending", None), "b": ("pending", None)}
    requests = {
        r["app_id"]: r["request_json"]
        for r in any_ledger.iter_items("w", RUN, columns=["app_id", "request_json"])
    }
    assert "fine" in requests["a"]


def test_two_bad_copies_of_an_id_go_to_review_once_with_the_first_copys_reason(any_ledger: Ledger) -> None:
    values = [{"id": "a", "channel": "email"}, {"id": "a"}]
    result, rejects = load_run(any_ledger, RUN, values)
    assert result.rejected == 2 and [r.position for r in rejects] == [0, 1]
    assert rows_of(any_ledger, RUN) == {"a": ("review", "template_variable_missing")}
    (row,) = any_ledger.iter_items("w", RUN, columns=["error_message"])
    assert row["error_message"] == rejects[0].message


def test_a_record_fixed_after_its_reject_is_prepared_again_by_the_cleared_prepare_of_the_same_run(
    any_ledger: Ledger,
) -> None:
    broken = [{"id": f"r{k}", "channel": "email"} for k in range(3)]
    first, _ = load_run(any_ledger, RUN, [*broken, {"id": "ok", "channel": "c", "comment": "x"}])
    assert first.rejected == 3 and rows_of(any_ledger, RUN)["r0"] == ("review", "template_variable_missing")
    fixed = [{**r, "comment": f"now fine {r['id']}"} for r in broken]
    again, rejects = load_run(any_ledger, RUN, [*fixed, {"id": "ok", "channel": "c", "comment": "x"}])
    assert rejects == [] and again.ledger.changed == 3 and again.ledger.already_in_run == 1
    assert rows_of(any_ledger, RUN) == {k: ("pending", None) for k in ("r0", "r1", "r2", "ok")}
    requests = {
        r["app_id"]: r["request_json"]
        for r in any_ledger.iter_items("w", RUN, columns=["app_id", "request_json"])
    }
    assert "now fine r1" in requests["r1"]


def test_a_record_edited_in_the_input_after_the_prepare_is_prepared_again_while_it_is_not_staged(
    any_ledger: Ledger,
) -> None:
    load_run(any_ledger, RUN, [{"id": "a", "channel": "c", "comment": "old"}])
    again, _ = load_run(any_ledger, RUN, [{"id": "a", "channel": "c", "comment": "new"}])
    assert again.ledger.changed == 1
    (row,) = any_ledger.iter_items("w", RUN, columns=["request_json", "state"])
    assert "new" in row["request_json"] and row["state"] == "pending"


def test_a_rerun_of_an_older_run_leaves_the_items_a_newer_run_owns_with_the_newer_run(
    any_ledger: Ledger,
) -> None:
    values = [{"id": f"r{k}", "channel": "c", "comment": "x"} for k in range(4)]
    older, newer = "scheduled__2026-11-01T00:00:00+00:00", "scheduled__2026-11-02T00:00:00+00:00"
    any_ledger.start_run("w", older, "openai", "m")
    load_run(any_ledger, older, values)
    any_ledger.start_run("w", newer, "openai", "m")
    load_run(any_ledger, newer, values)
    assert set(rows_of(any_ledger, newer)) == {f"r{k}" for k in range(4)}
    again, _ = load_run(any_ledger, older, [*values, {"id": "r0", "channel": "c"}])
    assert rows_of(any_ledger, older) == {}
    assert set(rows_of(any_ledger, newer)) == {f"r{k}" for k in range(4)}
    assert again.ledger.owned_by_newer_run == 4
    assert "4 left with a newer run that owns them" in again.describe()
    assert rows_of(any_ledger, newer)["r0"] == ("pending", None)  # the bad copy did not take it either
