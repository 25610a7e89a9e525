"""One DAG, two providers: the same workload runs against the OpenAI emulator and then against the
Bedrock emulator (input staged to and output read from a real S3-compatible server), and the only
things that change between the runs are the connection and the model id."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_batch_provider.ledger import Ledger
from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator
from tests.support.airflow_run import batch_env, run_airflow, tail
from tests.support.scripts import load_script

pytestmark = pytest.mark.airflow_e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "provider_switch_feedback"
WORKLOAD = "provider_switch"
ITEMS = 300  # two chunks of 150: both above Bedrock's 100-record minimum
OPENAI_MODEL = "gpt-4o-mini"
BEDROCK_MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
ROLE = "arn:aws:iam::123456789012:role/BedrockBatch"


def write_records(path: Path) -> str:
    generator = load_script(REPO_ROOT / "include" / "generate_feedback_data.py", "generate_feedback_data")
    generator.ensure_dataset(path, n=ITEMS, seed=3)
    return f"file://{path}"


class Switch:
    """Both runs' outputs and handles."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module")
def switch(
    airflow_home: dict[str, str], s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Switch]:
    import boto3

    bucket = "abp-switch-" + uuid.uuid4().hex[:8]
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    records = write_records(tmp_path_factory.mktemp("records") / "comments.jsonl")
    connections: dict[str, dict[str, Any]] = {}
    result = Switch()
    with run_emulator(EmulatorConfig(time_scale=0.05, s3_endpoint=s3_endpoint)) as base_url:
        connections["openai"] = {"conn_type": "openai_batch", "host": f"{base_url}/v1", "password": "sk-test"}
        connections["bedrock"] = {
            "conn_type": "bedrock_batch",
            "host": base_url,
            "extra": {
                # credentials through the Amazon provider's AwsBaseHook, from this aws connection
                "aws_conn_id": "abp_aws",
                "region_name": "us-east-1",
                "role_arn": ROLE,
                "s3_uri": f"s3://{bucket}/llm-batch/input",
                "output_s3_uri": f"s3://{bucket}/llm-batch/output",
                "s3_endpoint_url": s3_endpoint,
                "model_id": BEDROCK_MODEL,
            },
        }
        runs = (
            ("openai", OPENAI_MODEL, "150"),
            ("bedrock", BEDROCK_MODEL, "150"),
            ("bedrock_small", BEDROCK_MODEL, "250"),
        )
        for name, model, chunk in runs:
            provider = name.removesuffix("_small")
            tmp = tmp_path_factory.mktemp(name)
            aws = {"conn_type": "aws", "login": "testing", "password": "testing"}
            env = batch_env(airflow_home, tmp, {"llm_batch": connections[provider], "abp_aws": aws})
            env.update(
                {
                    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "tests" / "dags" / "dags"),
                    "ABP_SWITCH_RECORDS": records,
                    "ABP_SWITCH_MODEL": model,
                    "ABP_SWITCH_CHUNK": chunk,
                    "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1",
                }
            )
            proc = run_airflow(env, "dags", "test", DAG_ID)
            assert proc.returncode == 0, tail(proc)
            ledger = Ledger.from_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
            (latest,) = ledger.runs(WORKLOAD, limit=1)
            result.runs[name] = {
                "ledger": ledger,
                "run_id": latest["run_id"],
                "env": env,
                "output": proc.stdout + proc.stderr,
            }
        result.runs["stats"] = httpx.get(f"{base_url}/_emulator/stats").json()
        result.runs["bucket"] = {"name": bucket, "client": s3}
        yield result


def test_both_providers_label_every_item(switch: Switch) -> None:
    for provider in ("openai", "bedrock"):
        run = switch.runs[provider]
        states = run["ledger"].count_states(WORKLOAD, run["run_id"])
        assert states == {"succeeded": ITEMS}, (provider, states)


def test_each_run_went_through_its_own_provider_with_its_own_model(switch: Switch) -> None:
    for provider, model in (("openai", OPENAI_MODEL), ("bedrock", BEDROCK_MODEL)):
        run = switch.runs[provider]
        jobs = run["ledger"].get_jobs(WORKLOAD, run["run_id"])
        assert len(jobs) == 2 and all(j.lines == 150 for j in jobs)
        assert {j.provider for j in jobs} == {provider}
        assert {j.model for j in jobs} == {model}
    bedrock_jobs = switch.runs["bedrock"]["ledger"].get_jobs(WORKLOAD, switch.runs["bedrock"]["run_id"])
    assert all(j.batch_id.startswith("arn:aws:bedrock:us-east-1:") for j in bedrock_jobs)
    counters = switch.runs["stats"]["counters"]
    # 2 for the OpenAI run; 2 for the Bedrock run and 1 (the 250-line chunk) for the small-remainder run
    assert counters["openai.batches_created"] == 2 and counters["bedrock.batches_created"] == 3


def test_the_bedrock_run_staged_its_input_and_read_its_output_in_s3(switch: Switch) -> None:
    bucket = switch.runs["bucket"]
    listing = bucket["client"].list_objects_v2(Bucket=bucket["name"], Prefix="llm-batch/")
    keys = sorted(obj["Key"] for obj in listing.get("Contents", []))
    inputs = [k for k in keys if k.startswith("llm-batch/input/") and k.endswith(".jsonl")]
    outputs = [k for k in keys if k.endswith(".jsonl.out")]
    manifests = [k for k in keys if k.endswith("manifest.json.out")]
    # two jobs of the Bedrock run, one of the small-remainder run (its 50-line chunk went real-time)
    assert len(inputs) == len(outputs) == len(manifests) == 3
    first = bucket["client"].get_object(Bucket=bucket["name"], Key=inputs[0])["Body"].read().splitlines()[0]
    line = json.loads(first)
    assert set(line) == {"recordId", "modelInput"}
    assert line["modelInput"]["anthropic_version"] == "bedrock-2023-05-31"


def test_both_runs_publish_the_same_labels(switch: Switch) -> None:
    labels = {}
    for provider in ("openai", "bedrock"):
        staging = Path(
            switch.runs[provider]["env"]["AIRFLOW__BATCH_PROVIDER__STAGING_ROOT"].removeprefix("file://")
        )
        (folder,) = (staging / WORKLOAD).iterdir()
        rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
        assert len(rows) == ITEMS
        labels[provider] = {r["id"]: r["output"] for r in rows}
        assert all(r["state"] == "succeeded" and r["route"] == "batch" for r in rows)
        report = json.loads((folder / "report.json").read_text())
        assert float(report["paid"]) > 0
    # the stand-in model answers the same prompt the same way through either provider's format
    assert labels["openai"] == labels["bedrock"]
    assert {label["sentiment"] for label in labels["bedrock"].values()} <= {"positive", "negative", "neutral"}


def test_the_dag_code_names_no_provider(switch: Switch) -> None:
    source = (REPO_ROOT / "tests" / "dags" / "dags" / "provider_switch_feedback.py").read_text()
    code = source.split('"""', 2)[2]  # after the module docstring
    for word in ("openai", "bedrock", "anthropic", "gpt-", "claude"):
        assert word not in code.lower(), word
    assert switch.runs["openai"]["run_id"] and switch.runs["bedrock"]["run_id"]


def test_a_chunk_below_bedrocks_minimum_goes_through_the_real_time_api_at_full_price(switch: Switch) -> None:
    run = switch.runs["bedrock_small"]
    ledger = run["ledger"]
    assert ledger.count_states(WORKLOAD, run["run_id"]) == {"succeeded": ITEMS}
    jobs = {j.lines: j for j in ledger.get_jobs(WORKLOAD, run["run_id"])}
    assert set(jobs) == {250, 50}
    assert jobs[50].state == "sync" and jobs[50].batch_id is None
    assert jobs[250].batch_id.startswith("arn:aws:bedrock:")
    routes = ledger.count_routes(WORKLOAD, run["run_id"])
    assert routes == {("succeeded", "batch"): 250, ("succeeded", "fallback"): 50}
    assert "below bedrock's minimum of 100 per batch" in run["output"]
    totals = ledger.attempt_totals(WORKLOAD, run["run_id"])
    assert sum(t["lines"] for t in totals if t["mode"] == "sync") == 50
