"""``airflow-batch``, run as a real subprocess against real SQLite and PostgreSQL ledgers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from airflow_batch_provider.core.custom_ids import item_key
from airflow_batch_provider.core.results import ItemResult, Usage
from airflow_batch_provider.ledger import Ledger
from tests.unit.ledger.store_support import WL, prep, stage, submit

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "airflow_batch_provider.cli", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def two_in_review(ledger: Ledger) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b")])
    job, cids = submit(ledger, "r1", ["a", "b"])
    ledger.apply_results(
        job,
        [
            ItemResult(cids["a"], "failed_permanent", usage=Usage(), error_code="context_length_exceeded"),
            ItemResult(cids["b"], "failed_permanent", usage=Usage(), error_code="content_filter"),
        ],
        lambda _usage: Decimal(0),
    )
    ledger.retry_candidates(WL, "r1", max_attempts=3)


def test_review_list_then_redrive_by_app_id_moves_the_item_and_records_who(
    ledger: Ledger, ledger_url: str
) -> None:
    two_in_review(ledger)
    listed = cli("--ledger-url", ledger_url, "review", "list", "--workload", WL, "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(r["app_id"] for r in json.loads(listed.stdout)) == ["a", "b"]

    done = cli(
        "--ledger-url", ledger_url, "review", "redrive", "--workload", WL, "--app-id", "a",
        "--actor", "alice", "--reason", "context raised",
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert "re-drove 1 item(s)" in done.stdout
    assert [r.app_id for r in ledger.review_items(WL)] == ["b"]
    [entry] = ledger.audit_log(WL)
    assert (entry.actor, entry.action, entry.reason) == ("alice", "redrive", "context raised")


def test_review_resolve_and_skip_by_error_code_and_key_empty_the_queue(
    ledger: Ledger, ledger_url: str
) -> None:
    two_in_review(ledger)
    resolved = cli(
        "--ledger-url", ledger_url, "review", "resolve", "--workload", WL,
        "--error-code", "content_filter", "--note", "answered by hand",
    )  # fmt: skip
    skipped = cli(
        "--ledger-url", ledger_url, "review", "skip", "--workload", WL,
        "--item-key", item_key("a"), "--reason", "not needed",
    )  # fmt: skip
    assert (resolved.returncode, skipped.returncode) == (0, 0), resolved.stderr + skipped.stderr
    assert ledger.review_items(WL) == []
    assert cli("--ledger-url", ledger_url, "review", "list", "--workload", WL).stdout == "(none)\n"


def test_jobs_in_doubt_are_listed_and_resolved_from_the_shell(ledger: Ledger, ledger_url: str) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b")])
    found, _ = stage(ledger, "r1", ["a"], chunk=0)
    absent, _ = stage(ledger, "r1", ["b"], chunk=1)
    for job_id in (found, absent):
        ledger.mark_job_in_doubt(job_id, "lost create reply")
    listed = cli("--ledger-url", ledger_url, "jobs", "in-doubt", "--json")
    assert sorted(j["job_id"] for j in json.loads(listed.stdout)) == sorted([found, absent])

    one = cli(
        "--ledger-url", ledger_url, "jobs", "resolve", found, "--batch-id", "batch_9", "--note", "console"
    )
    two = cli("--ledger-url", ledger_url, "jobs", "resolve", absent, "--absent", "--note", "listed: none")

    assert "is now 'submitted' (batch batch_9)" in one.stdout, one.stderr
    assert "is now 'staged'" in two.stdout, two.stderr
    assert ledger.jobs_in_doubt() == []
    again = cli("--ledger-url", ledger_url, "jobs", "resolve", found, "--absent", "--note", "oops")
    assert again.returncode == 2
    assert "not in doubt" in again.stderr


def test_redriving_in_doubt_items_before_their_job_is_resolved_is_refused_naming_the_job(
    ledger: Ledger, ledger_url: str
) -> None:
    ledger.upsert_items(WL, "r1", [prep("a"), prep("b")])
    job_id, _ = stage(ledger, "r1", ["a", "b"])
    ledger.mark_job_in_doubt(job_id, "lost create reply")
    keys = [(item_key(a), "v1") for a in ("a", "b")]
    ledger.transition(WL, "r1", "review", ["staged"], keys=keys, error_code="in_doubt")
    redrive = ("review", "redrive", "--workload", WL, "--error-code", "in_doubt", "--reason", "as told")

    refused = cli("--ledger-url", ledger_url, *redrive)
    assert refused.returncode == 2, refused.stdout
    assert job_id in refused.stderr and "airflow-batch jobs resolve" in refused.stderr
    assert [r.state for r in ledger.review_items(WL)] == ["review", "review"]

    resolved = cli(
        "--ledger-url", ledger_url, "jobs", "resolve", job_id, "--batch-id", "b1", "--note", "console"
    )
    assert "run 'r1' harvests the batch once it has ended" in resolved.stdout, resolved.stderr
    # its items now wait for the batch: nothing left in review to send again
    again = cli("--ledger-url", ledger_url, *redrive)
    assert again.returncode == 0 and "re-drove 0 item(s)" in again.stdout, again.stderr


def test_resolving_a_job_of_a_finished_run_to_its_batch_says_the_next_run_harvests_it(
    ledger: Ledger, ledger_url: str
) -> None:
    ledger.upsert_items(WL, "r1", [prep("a")])
    job_id, _ = stage(ledger, "r1", ["a"])
    ledger.mark_job_in_doubt(job_id, "lost create reply")
    ledger.start_run(WL, "r1", "openai", "gpt-4o-mini")
    ledger.finish_run(WL, "r1", {"paid": "0"})
    resolved = cli(
        "--ledger-url", ledger_url, "jobs", "resolve", job_id, "--batch-id", "b1", "--note", "console"
    )
    assert resolved.returncode == 0, resolved.stderr
    assert "the next run of the workload harvests the batch" in resolved.stdout
    assert "late_harvest" in resolved.stdout and "clear" not in resolved.stdout


def test_lease_release_frees_only_the_named_run(ledger: Ledger, ledger_url: str) -> None:
    ledger.acquire_workload_lease(WL, "dead-run", "t1", dag_id="nightly")
    shown = cli("--ledger-url", ledger_url, "lease", "show", "--workload", WL)
    assert "dead-run" in shown.stdout and "nightly" in shown.stdout
    wrong = cli(
        "--ledger-url", ledger_url, "lease", "release", "--workload", WL, "--run-id", "other", "--reason", "x"
    )
    assert wrong.returncode == 1 and "'dead-run' holds it" in wrong.stdout
    done = cli(
        "--ledger-url", ledger_url, "lease", "release", "--workload", WL, "--run-id", "dead-run",
        "--actor", "bob", "--reason", "worker was lost",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert ledger.workload_lease(WL) is None
    assert ledger.audit_log(WL)[0].actor == "bob"


def test_without_a_url_the_ledger_comes_from_airflows_config(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'configured.sqlite'}"
    Ledger.from_url(url).acquire_workload_lease(WL, "r1", "t1")
    env = {"AIRFLOW_HOME": str(tmp_path / "home"), "AIRFLOW__BATCH_PROVIDER__LEDGER_URL": url}
    shown = cli("lease", "show", "--workload", WL, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "r1" in shown.stdout


def test_without_a_url_the_configured_ledger_connection_is_used(tmp_path: Path) -> None:
    path = tmp_path / "by-connection.sqlite"
    Ledger.from_url(f"sqlite:///{path}").acquire_workload_lease(WL, "r-conn", "t1")
    env = {
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__BATCH_PROVIDER__LEDGER_CONN_ID": "my_ledger",
        "AIRFLOW_CONN_MY_LEDGER": json.dumps({"conn_type": "sqlite", "host": str(path)}),
    }
    shown = cli("lease", "show", "--workload", WL, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "r-conn" in shown.stdout


def test_the_console_script_is_declared() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '[project.scripts]\nairflow-batch = "airflow_batch_provider.cli:main"\n' in pyproject


def test_a_dead_runs_fallback_items_are_listed_refused_while_it_holds_the_workload_then_redriven(
    ledger: Ledger, ledger_url: str
) -> None:
    from tests.unit.services.test_stranded import DEAD, killed_mid_fallback

    killed_mid_fallback(ledger, ["a", "b"])
    listed = cli("--ledger-url", ledger_url, "fallback", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert (row["workload"], row["run_id"], row["items"], row["holds_lease"]) == (WL, DEAD, 2, True)

    args = ["--ledger-url", ledger_url, "fallback", "redrive", "--workload", WL, "--run-id", DEAD]
    refused = cli(*args, "--actor", "alice", "--reason", "killed")
    assert refused.returncode == 2 and "lease release" in refused.stderr
    assert ledger.count_states(WL, DEAD).get("fallback") == 2

    assert ledger.release_workload_lease(WL, DEAD, actor="alice", reason="worker lost")
    done = cli(*args, "--actor", "alice", "--reason", "killed at 02:14")
    assert done.returncode == 0, done.stderr
    assert "re-drove 2 item(s)" in done.stdout
    assert ledger.count_states(WL, DEAD).get("pending") == 3
    entry = ledger.audit_log(WL)[0]
    assert (entry.actor, entry.action, entry.item_count) == ("alice", "redrive", 2)
    again = cli(*args, "--actor", "alice", "--reason", "killed at 02:14")
    assert again.returncode == 1 and "re-drove 0 item(s)" in again.stdout


def test_a_dead_runs_fallback_items_can_be_resolved_from_the_shell(ledger: Ledger, ledger_url: str) -> None:
    from tests.unit.services.test_stranded import DEAD, killed_mid_fallback

    killed_mid_fallback(ledger, ["a"])
    ledger.release_workload_lease(WL, DEAD)
    done = cli(
        "--ledger-url", ledger_url, "fallback", "resolve", "--workload", WL, "--run-id", DEAD,
        "--actor", "bob", "--note", "answered by hand",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "resolved 1 item(s)" in done.stdout
    assert ledger.count_states(WL, DEAD).get("review") == 1 and ledger.review_items(WL) == []
    assert ledger.audit_log(WL)[0].action == "resolve_review"


def test_ledger_prune_dry_run_prints_what_would_go_and_then_prunes_it(
    ledger: Ledger, ledger_url: str
) -> None:
    from tests.unit.ledger.nights import night

    for number in range(3):
        night(ledger, WL, f"n{number}", {"a": f"text {number}", "b": "same"})
    with_history = ledger.attempt_totals(WL, "n0")
    base = ("--ledger-url", ledger_url, "ledger", "prune", "--workload", WL, "--keep-runs", "1")

    dry = cli(*base, "--dry-run")

    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[:3] == [
        f"workload {WL!r}: would remove 3 row(s) of 2 run(s) past the policy (dry run: nothing removed)",
        "  abp_attempts\t2",
        "  abp_jobs\t1",
    ], dry.stdout
    assert ledger.attempt_totals(WL, "n0") == with_history
    done = cli(*base, "--actor", "ops", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["rows"]["abp_attempts"] == 2
    assert [(e.actor, e.action) for e in ledger.audit_log(WL)] == [("ops", "prune")]


def test_ledger_prune_refuses_a_policy_that_keeps_no_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_batch_provider.cli import main

    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    assert main(["--ledger-url", url, "ledger", "prune", "--workload", WL, "--keep-runs", "0"]) == 2
    assert "keep_runs=0 keeps no run; give 1 or more" in capsys.readouterr().err


def test_review_list_shows_the_rows_a_sink_refused_with_the_sinks_message(
    ledger: Ledger, ledger_url: str
) -> None:
    from airflow_batch_provider.ledger.deliveries import Delivery, record_deliveries

    two_in_review(ledger)
    message = 'IntegrityError: new row violates check constraint "confidence_range"'
    record_deliveries(
        ledger,
        WL,
        "tickets",
        "r1",
        [
            Delivery(item_key("c"), "c", "v1", "refused", "h", message),
            Delivery(item_key("d"), "d", "v1", "delivered", "h"),
        ],
    )
    table = cli("--ledger-url", ledger_url, "review", "list", "--workload", WL)
    listed = cli("--ledger-url", ledger_url, "review", "list", "--workload", WL, "--json")
    only = cli(
        "--ledger-url",
        ledger_url,
        "review",
        "list",
        "--workload",
        WL,
        "--error-code",
        "sink_refused",
        "-o",
        "json",
    )
    assert (table.returncode, listed.returncode, only.returncode) == (0, 0, 0), table.stderr + listed.stderr
    assert (
        "rows a sink refused" in table.stdout and message in table.stdout and "tickets\tc\tv1" in table.stdout
    )
    rows = json.loads(listed.stdout)
    assert sorted(r["app_id"] for r in rows) == ["a", "b", "c"]  # the delivered row is not listed
    [refused] = [r for r in rows if r["error_code"] == "sink_refused"]
    assert (refused["sink"], refused["error_message"], refused["item_key"]) == (
        "tickets",
        message,
        item_key("c"),
    )
    assert [r["app_id"] for r in json.loads(only.stdout)] == ["c"]
