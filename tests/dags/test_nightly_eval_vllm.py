"""`airflow dags test nightly_eval_vllm` end to end on the stand-ins: the real KubernetesPodOperator
(deferrable, through the triggerer path of ``dags test``) against the loopback Kubernetes API,
whose pods run the stand-in ``vllm run-batch`` over the emulator's model.

Round 1 has two chunks (two pods). The first pod's vLLM answers some lines with a 500 and a null
body (retryable) and one with a bare-string routing error (permanent); the second pod crashes
after five lines. Reconcile keeps every finished line; round 2 runs exactly the retryable and
missing items, in new pods; publish reports the pods' GPU time beside provider batch prices, and
``score`` grades the answers. The API server saw one pod per job, and every pod was deleted.

The DAG reads its Variables when the run's tasks start (``tests/dags/test_parse_time_reads.py``
shows its file reads none when parsed): the deadline run names its connection, its chunk size and
its deadline through them; a run without the deadline Variable has no deadline; a connection
Variable naming a batch API's connection is refused before anything is staged.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.ledger import Ledger
from tests.support.airflow_run import batch_env, run_airflow, tail
from tests.support.kube_api import PodFault, run_kube_api

pytest.importorskip("airflow.providers.cncf.kubernetes")
pytestmark = pytest.mark.airflow_e2e

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = WORKLOAD = "nightly_eval_vllm"
EVAL_ITEMS = 40
CHUNK = 20
CRASH_AFTER = 5
NULL_EVERY = 7  # lines 7 and 14 of chunk 0: a 500 with a null body (retryable)
STRING_EVERY = 9  # line 9 (and 18) of chunk 0: a routing error as a bare string (permanent)
RATE = 4.0


def run_eval_dag(
    airflow_home: dict[str, str],
    tmp: Path,
    faults: list[PodFault],
    variables: dict[str, str],
    host: str | None = None,
    connections: dict[str, dict[str, Any]] | None = None,
    conn_id: str = "vllm_kubernetes_default",
    succeeds: bool = True,
    **settings: str,
) -> dict[str, Any]:
    """``airflow dags test nightly_eval_vllm`` against the loopback API; what it left behind.

    :param variables: Airflow Variables (by name) set for the run
    :param conn_id: the id the ``vllm_kubernetes`` connection is defined under
    :param succeeds: whether the run must succeed (else only its output, pods and ledger return)
    :param settings: ``[batch_provider]`` settings (e.g. an ``s3://`` ``staging_root``)
    """
    exchange = tmp / "exchange"
    exchange.mkdir()
    pod_env = {  # no cloud credentials reach a pod from the environment either
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_"))},
        "PATH": f"{ROOT / 'tests' / 'support' / 'fake_vllm' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "FAKE_VLLM_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "FAKE_VLLM_REQUIRE_ENV": "HF_TOKEN",
    }
    with run_kube_api(tmp / "kube", pod_env) as api:
        api.add_secret("hf-token", {"token": "hf_test"})
        kubeconfig = tmp / "kubeconfig.json"
        kubeconfig.write_text(json.dumps(api.kubeconfig()))
        for fault in faults:
            api.add_fault(fault)
        conn = {
            "conn_type": "vllm_kubernetes",
            "extra": {
                "namespace": "llm",
                "gpu_count": 1,
                "gpu_type": "L4",
                "usd_per_gpu_hour": RATE,
                "hub_token_secret": "hf-token",
                "exchange_path": str(exchange),
                "kube_config_path": str(kubeconfig),
                "startup_timeout_s": 60,
                "schedule_timeout_s": 60,
            },
        }
        if host:
            conn["host"] = host
        env = batch_env(airflow_home, tmp, {conn_id: conn, **(connections or {})}, **settings)
        env.update({f"AIRFLOW_VAR_{k.upper()}": v for k, v in variables.items()})
        proc = run_airflow(env, "dags", "test", DAG_ID, timeout=420)
        created = list(api.created)
        live = api.live_pods()
    if not succeeds:
        ledger = Ledger.from_url(f"sqlite:///{tmp / 'ledger.sqlite'}")
        return {"proc": proc, "ledger": ledger, "created": created, "live": live}
    assert proc.returncode == 0, tail(proc)
    if "staging_root" in settings:
        return {"proc": proc, "ledger": Ledger.from_url(f"sqlite:///{tmp / 'ledger.sqlite'}"), "created": created,
                "live": live}  # fmt: skip
    staging = next((tmp / "staging" / WORKLOAD).iterdir())
    return {
        "proc": proc,
        "ledger": Ledger.from_url(f"sqlite:///{tmp / 'ledger.sqlite'}"),
        "created": created,
        "live": live,
        "report": json.loads((staging / "report.json").read_text()),
        "results": [json.loads(x) for x in (staging / "results.jsonl").read_text().splitlines()],
        "score": json.loads((staging / "eval_score.json").read_text()),
    }


@pytest.fixture(scope="module")
def finished(airflow_home: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    round_1 = {"task_id": f"{WORKLOAD}.run"}
    faults = [
        PodFault(
            "env",
            match={**round_1, "map_index": "0"},
            env={
                "FAKE_VLLM_NULL_BODY_EVERY": str(NULL_EVERY),
                "FAKE_VLLM_STRING_ERROR_EVERY": str(STRING_EVERY),
            },
        ),
        PodFault("env", match={**round_1, "map_index": "1"}, env={"FAKE_VLLM_CRASH_AFTER": "5"}),
    ]
    # no deadline Variable: the deadline task resolves none for this run, and the branch publishes
    variables = {"nightly_eval_vllm_chunk": str(CHUNK)}
    return run_eval_dag(airflow_home, tmp_path_factory.mktemp("eval-vllm"), faults, variables)


def test_without_the_deadline_variable_the_run_has_no_deadline_and_nothing_goes_to_the_fallback(
    finished: dict[str, Any],
) -> None:
    assert "rendered to nothing: no deadline this run" in finished["proc"].stdout + finished["proc"].stderr
    assert {r["route"] for r in finished["results"]}.isdisjoint({"fallback"})
    assert [j["reason"] for j in finished["report"]["self_hosted"]["jobs"]].count("deadline") == 0


def test_every_eval_prompt_ends_answered_except_the_permanent_routing_error(finished: dict[str, Any]) -> None:
    states: dict[str, int] = {}
    for row in finished["results"]:
        states[row["state"]] = states.get(row["state"], 0) + 1
    assert sum(states.values()) == EVAL_ITEMS
    # line 9 and 18 of chunk 0 got a bare-string 400: permanent, so to review; the rest succeeded
    assert states == {"succeeded": EVAL_ITEMS - 2, "review": 2}, states
    review = [r for r in finished["results"] if r["state"] == "review"]
    assert all("not a supported endpoint" in (r["error_message"] or "") for r in review)


def test_round_two_runs_exactly_the_lines_lost_in_the_crash_and_the_retryable_errors(
    finished: dict[str, Any],
) -> None:
    ledger: Ledger = finished["ledger"]
    jobs = [ledger.get_job(j) for j in _job_ids(ledger)]
    by_round: dict[int, int] = {}
    for job in jobs:
        by_round[job.round] = by_round.get(job.round, 0) + job.lines
    lost_in_crash = CHUNK - CRASH_AFTER
    null_bodies = 2  # lines 7 and 14 of chunk 0
    assert by_round == {1: EVAL_ITEMS, 2: lost_in_crash + null_bodies}, by_round
    crashed = [j for j in jobs if j.round == 1 and j.batch_state == "failed"]
    assert len(crashed) == 1 and crashed[0].error.startswith("exit_1")
    assert crashed[0].missing == lost_in_crash


def test_the_api_server_saw_one_pod_per_job_and_every_pod_was_deleted(finished: dict[str, Any]) -> None:
    labels = [m["metadata"]["labels"]["batch-job"] for m in finished["created"]]
    assert len(labels) == len(set(labels)) == len(_job_ids(finished["ledger"]))
    assert finished["live"] == []


def test_the_report_shows_gpu_time_beside_provider_batch_prices(finished: dict[str, Any]) -> None:
    report = finished["report"]
    hosted = report["self_hosted"]
    assert len(hosted["jobs"]) == len(_job_ids(finished["ledger"]))
    assert {j["outcome"] for j in hosted["jobs"]} == {"completed", "failed"}
    assert report["infrastructure_cost"] == hosted["infrastructure_usd"]
    assert {q["provider"] for q in hosted["provider_batch_equivalent"]} >= {"openai", "anthropic", "gemini"}
    assert all(q["usd"] > 0 for q in hosted["provider_batch_equivalent"])
    assert "self-hosted GPU time" in finished["proc"].stdout + finished["proc"].stderr


def test_the_answers_are_scored_after_publish(finished: dict[str, Any]) -> None:
    score = finished["score"]
    assert score["items"] == EVAL_ITEMS and score["answered"] == EVAL_ITEMS - 2
    # the stand-in model misses two of the hand-written expectations, and two items have no answer
    assert score["exact_match"] == pytest.approx((EVAL_ITEMS - 4) / EVAL_ITEMS)


def _job_ids(ledger: Ledger) -> list[str]:
    from sqlalchemy import select

    from airflow_batch_provider.ledger import schema

    with ledger.engine.connect() as conn:
        return list(
            conn.execute(select(schema.jobs.c.job_id).where(schema.jobs.c.workload == WORKLOAD)).scalars()
        )


# -- a deadline the pods do not meet: Kubernetes stops them, the fallback answers the rest ------

ANSWERED_BEFORE_DEADLINE = 5
DEADLINE_CHUNK = 10  # from the chunk Variable: four jobs where the default would make two


@pytest.fixture(scope="module")
def cut_short(airflow_home: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from batch_emulator.config import EmulatorConfig
    from batch_emulator.testing import run_emulator

    slow = {"FAKE_VLLM_SLOW_AFTER": str(ANSWERED_BEFORE_DEADLINE), "FAKE_VLLM_DELAY_S": "600"}
    faults = [PodFault("env", match={"task_id": f"{WORKLOAD}.run"}, env=slow) for _ in range(2)]
    # the connection, the chunk size and the deadline all come from Variables, read when the run starts
    variables = {
        "nightly_eval_vllm_conn_id": "eval_gpu",
        "nightly_eval_vllm_chunk": str(DEADLINE_CHUNK),
        "nightly_eval_vllm_deadline": "PT90S",
    }
    with run_emulator(EmulatorConfig()) as realtime:  # the OpenAI-compatible real-time endpoint
        return run_eval_dag(
            airflow_home,
            tmp_path_factory.mktemp("eval-vllm-deadline"),
            faults,
            variables,
            f"{realtime}/v1",
            conn_id="eval_gpu",  # no vllm_kubernetes_default: only the Variable names this connection
        )


def test_a_pod_still_running_at_the_deadline_is_stopped_and_deleted_and_every_job_says_why(
    cut_short: dict[str, Any],
) -> None:
    ledger: Ledger = cut_short["ledger"]
    jobs = [ledger.get_job(j) for j in _job_ids(ledger)]
    assert len(jobs) == EVAL_ITEMS // DEADLINE_CHUNK  # the chunk Variable; no round 2 after the deadline
    assert {j.lines for j in jobs} == {DEADLINE_CHUNK}
    assert all(j.batch_state == "failed" and j.error.startswith("deadline") for j in jobs)
    # `dags test` runs the mapped pod tasks one after another, the deferred one's trigger inline: the
    # first pod runs into the deadline, and the other jobs, reached after it, start no pod at all
    [pod] = cut_short["created"]
    assert 0 < pod["spec"]["activeDeadlineSeconds"] <= 90
    assert cut_short["live"] == []
    assert [j["reason"] for j in cut_short["report"]["self_hosted"]["jobs"]] == ["deadline"] * len(jobs)


def test_the_lines_the_pod_finished_are_kept_and_the_fallback_answers_only_the_rest(
    cut_short: dict[str, Any],
) -> None:
    results = cut_short["results"]
    assert len(results) == EVAL_ITEMS and {r["state"] for r in results} == {"succeeded"}
    routes = [r["route"] for r in results]
    assert routes.count("fallback") == EVAL_ITEMS - ANSWERED_BEFORE_DEADLINE, routes


# -- s3:// staging: the pods read and write through presigned URLs ----------------------------


@pytest.fixture(scope="module")
def on_s3(
    airflow_home: dict[str, str], tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str
) -> dict[str, Any]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="abp-eval-pods")
    aws = {
        "conn_type": "aws",
        "login": "AKIAEVALPODS",
        "password": "eval-pods-secret-never-in-a-pod",
        "extra": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }
    crash = PodFault(
        "env", match={"task_id": f"{WORKLOAD}.run", "map_index": "1"}, env={"FAKE_VLLM_CRASH_AFTER": "5"}
    )
    run = run_eval_dag(
        airflow_home,
        tmp_path_factory.mktemp("eval-vllm-s3"),
        [crash],
        {},
        connections={"eval_s3": aws},
        staging_root="s3://abp-eval-pods/stage",
        staging_conn_id="eval_s3",
    )
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="abp-eval-pods").get("Contents", [])]
    report = next(k for k in keys if k.endswith("/report.json"))
    return {
        **run,
        "keys": keys,
        "report": json.loads(s3.get_object(Bucket="abp-eval-pods", Key=report)["Body"].read()),
    }


def test_on_s3_the_pods_use_presigned_urls_only_and_a_crashed_pod_s_items_all_go_to_round_two(
    on_s3: dict[str, Any],
) -> None:
    created = on_s3["created"]
    for pod in created:
        command = pod["spec"]["containers"][0]["command"]
        assert command[command.index("-i") + 1].startswith("http://127.0.0.1")
        assert "X-Amz-Signature=" in command[command.index("-o") + 1]
    assert "eval-pods-secret-never-in-a-pod" not in json.dumps(created)
    assert "eval-pods-secret-never-in-a-pod" not in on_s3["proc"].stdout + on_s3["proc"].stderr
    ledger: Ledger = on_s3["ledger"]
    jobs = [ledger.get_job(j) for j in _job_ids(ledger)]
    # vLLM uploads only a whole file: the crashed pod's 5 finished lines are lost with it
    assert sorted((j.round, j.lines, j.batch_state) for j in jobs) == [
        (1, CHUNK, "completed"), (1, CHUNK, "failed"), (2, CHUNK, "completed")
    ]  # fmt: skip
    assert len(created) == len(jobs) and on_s3["live"] == []
    assert on_s3["report"]["items"] == EVAL_ITEMS
    assert sum(1 for k in on_s3["keys"] if "/output-" in k) == len(jobs)
    run_id = ledger.runs(WORKLOAD, limit=1)[0]["run_id"]
    assert ledger.count_states(WORKLOAD, run_id) == {"succeeded": EVAL_ITEMS}


# -- a connection Variable that names a batch API's connection: refused before anything is staged --


@pytest.fixture(scope="module")
def wrong_lane(airflow_home: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    openai = {"conn_type": "openai_batch", "host": "http://127.0.0.1:9/v1", "password": "never-used"}
    return run_eval_dag(
        airflow_home,
        tmp_path_factory.mktemp("eval-vllm-wrong-lane"),
        [],
        {"nightly_eval_vllm_conn_id": "eval_openai"},
        connections={"eval_openai": openai},
        succeeds=False,
    )


def test_a_batch_api_connection_in_the_pod_lane_fails_the_run_at_prepare_before_anything_is_staged(
    wrong_lane: dict[str, Any],
) -> None:
    proc = wrong_lane["proc"]
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, tail(proc)
    assert "connection 'eval_openai' is of type 'openai_batch'" in output
    assert "built the pod lane" in output and "lane='provider'" in output
    assert wrong_lane["created"] == [] and wrong_lane["live"] == []
    assert wrong_lane["ledger"].runs(WORKLOAD) == []
