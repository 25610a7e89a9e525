"""Bad input gets a clear error naming the item, the limit and the fix; the other items go on,
and nothing is lost: every rejected record is kept, whole, with its reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.ledger import Ledger
from tests.support.airflow_run import openai_dag_env, run_airflow, tail

pytestmark = pytest.mark.airflow_e2e
DAGS = Path(__file__).parent / "dags"


def good(i: int) -> dict[str, Any]:
    return {
        "id": f"c{i:03d}",
        "channel": "email",
        "product": "Lamp",
        "comment": f"I love the lamp, great {i}",
    }


def write_input(path: Path) -> None:
    lines = [json.dumps(good(i)).encode() for i in range(40)]
    lines.append(json.dumps({"channel": "email", "product": "Lamp", "comment": "no id here"}).encode())
    lines.append(json.dumps({**good(1), "comment": "a second c001"}).encode())
    lines.append(json.dumps({**good(2), "comment": "a second c002"}).encode())
    lines.append(json.dumps({**good(0), "id": "huge", "comment": "word " * 8000}).encode())
    lines.append(b'{"id": "latin1", "channel": "email", "product": "Lamp", "comment": "caf\xe9"}')
    lines.append(json.dumps({"id": "nocomment", "channel": "email", "product": "Lamp"}).encode())
    lines.append(b'{"id": "broken", "comment": ')
    path.write_bytes(b"\n".join(lines) + b"\n")


def write_csv(path: Path) -> None:
    """40 good rows and, among them, one bad row of each kind a spreadsheet export produces."""
    rows = [b"id,channel,product,comment,self"]
    rows += [f'c{i:03d},email,Lamp,"I love the lamp, great {i}",me'.encode() for i in range(20)]
    rows.append(b"latin1,email,Lamp,caf\xe9,me")  # not UTF-8: only this row is rejected
    rows.append(b"extra,email,Lamp,good,me,surplus")  # one cell too many
    rows.append(b"short,email,Lamp")  # no comment, no self: would render "None"
    rows.append(b"  ,email,Lamp,blank id,me")
    rows += [f'c{i:03d},email,Lamp,"great, {i}",me'.encode() for i in range(20, 40)]
    path.write_bytes(b"\r\n".join(rows) + b"\r\n")


def run_dag(
    airflow_home: dict[str, str], tmp: Path, ratio: str, name: str = "input.jsonl"
) -> tuple[Any, dict[str, str]]:
    source = tmp / name
    (write_csv if name.endswith(".csv") else write_input)(source)
    with openai_dag_env(airflow_home, tmp, dags=DAGS) as (_, env):
        env.update({"ABP_BAD_INPUT_PATH": str(source), "ABP_MAX_REJECT_RATIO": ratio})
        return run_airflow(env, "dags", "test", "bad_input_classification"), env


def test_bad_records_are_named_kept_and_the_good_ones_go_on(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    proc, env = run_dag(airflow_home, tmp_path, "0.2")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, tail(proc)
    ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
    run_id = ledger.runs("bad_input", limit=1)[0]["run_id"]
    rows = {r["app_id"]: r for r in ledger.iter_items("bad_input", run_id)}
    assert {k for k, r in rows.items() if r["state"] == "succeeded"} == {f"c{i:03d}" for i in range(40)}
    assert rows["huge"]["state"] == "review" and rows["huge"]["error_code"] == "item_too_large"
    assert "bytes after headroom" in rows["huge"]["error_message"]
    assert rows["nocomment"]["state"] == "review"
    assert rows["nocomment"]["error_code"] == "template_variable_missing"
    assert "'comment' is undefined" in rows["nocomment"]["error_message"]
    # the duplicates kept the first record's content
    assert "a second" not in rows["c001"]["request_json"]
    # each message names the record and the fix
    assert "record 40: has no 'id' field" in output
    assert "record 41 (id 'c001'): repeats the id of record 1" in output
    assert "line 45 is not UTF-8" in output and "re-encode the source as UTF-8" in output
    assert "line 47 is not JSON" in output
    staging = Path(env["AIRFLOW__BATCH_PROVIDER__STAGING_ROOT"].removeprefix("file://"))
    (rejects,) = staging.glob("bad_input/*/rejects.jsonl")
    kept = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert sorted(k["code"] for k in kept) == sorted(
        [
            "missing_id",
            "duplicate_id",
            "duplicate_id",
            "invalid_utf8",
            "template_variable_missing",
            "invalid_json",
        ]
    )
    assert json.loads(next(k for k in kept if k["code"] == "missing_id")["record"])["comment"] == "no id here"
    assert "47 records read: 41 items, 6 rejected" in output
    summary = json.loads((rejects.parent / "prepare_summary.json").read_text())
    assert (summary["read"], summary["items"], summary["rejected"]) == (47, 41, 6)


def test_too_many_bad_records_fail_the_run_after_recording_them(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    proc, _ = run_dag(airflow_home, tmp_path, "0.05")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    # the 6 bad records of the other tests' input, and the ratio they were held to
    assert "6 of 47 records were rejected (12.8%), more than max_reject_ratio=5.0%" in output, tail(proc)
    assert "raise ChunkOptions(max_reject_ratio=...)" in output


def test_bad_csv_rows_are_rejected_one_by_one_and_every_other_row_goes_on(
    airflow_home: dict[str, str], tmp_path: Path
) -> None:
    proc, env = run_dag(airflow_home, tmp_path, "0.2", "input.csv")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, tail(proc)
    ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
    run_id = ledger.runs("bad_input", limit=1)[0]["run_id"]
    rows = {r["app_id"]: r for r in ledger.iter_items("bad_input", run_id)}
    # the rows after the bad byte are not dropped, and a column named self is harmless
    assert {k for k, r in rows.items() if r["state"] == "succeeded"} == {f"c{i:03d}" for i in range(40)}
    assert rows["short"]["state"] == "review" and rows["short"]["error_code"] == "csv_missing_cell"
    assert "'comment'" in rows["short"]["error_message"]
    assert rows["extra"]["state"] == "review" and rows["extra"]["error_code"] == "csv_extra_cell"
    assert "line 22 is not UTF-8" in output
    staging = Path(env["AIRFLOW__BATCH_PROVIDER__STAGING_ROOT"].removeprefix("file://"))
    (rejects,) = staging.glob("bad_input/*/rejects.jsonl")
    kept = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert [(k["line"], k["code"]) for k in kept] == [
        (22, "invalid_utf8"),
        (23, "csv_extra_cell"),
        (24, "csv_missing_cell"),
        (25, "missing_id"),
    ]
    summary = json.loads((rejects.parent / "prepare_summary.json").read_text())
    assert (summary["read"], summary["items"], summary["rejected"]) == (44, 40, 4)
    assert "44 records read: 40 items, 4 rejected" in output
