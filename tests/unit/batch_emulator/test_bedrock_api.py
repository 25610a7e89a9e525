"""The emulator's Bedrock control plane and InvokeModel, through real boto3 clients over HTTP, with
input and output in a real S3-compatible server (moto, on loopback)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from batch_emulator.bedrock_api import MIN_RECORDS
from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import FaultConfig
from batch_emulator.store import Clock
from batch_emulator.testing import run_emulator

START = 1_760_000_000.0
ROLE = "arn:aws:iam::123456789012:role/BedrockBatch"
CLAUDE = "anthropic.claude-3-5-haiku-20241022-v1:0"
NOVA = "us.amazon.nova-lite-v1:0"
TITAN = "amazon.titan-embed-text-v2:0"
# default timings at time_scale 1: validating 0-2 s, in progress 2-12 s, finalizing 12-14 s
DONE_S = 15.0


class FakeTime:
    def __init__(self) -> None:
        self.value = START

    def __call__(self) -> float:
        return self.value


def claude_record(i: int, text: str | None = None, **body: Any) -> dict[str, Any]:
    return {
        "recordId": f"rec{i:05d}__a1c0",
        "modelInput": {
            "anthropic_version": "bedrock-2023-05-31",
            "max_tokens": 64,
            "system": "Label the sentiment of the comment.",
            "messages": [{"role": "user", "content": text or f"Comment {i}: the delivery was late"}],
            **body,
        },
    }


@dataclass
class Bedrock:
    url: str
    bucket: str
    s3: Any
    control: Any
    runtime: Any
    http: httpx.Client

    def advance(self, seconds: float) -> None:
        self.http.post("/_emulator/clock", json={"advance_s": seconds}).raise_for_status()

    def config(self, **patch: Any) -> None:
        self.http.put("/_emulator/config", json=patch).raise_for_status()

    def put_input(self, records: list[dict[str, Any]] | list[str], key: str = "in/batch.jsonl") -> str:
        text = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n"
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=text.encode())
        return f"s3://{self.bucket}/{key}"

    def create(self, records: list[dict[str, Any]] | list[str], model: str = CLAUDE, **kw: Any) -> str:
        uri = self.put_input(records, kw.pop("key", "in/batch.jsonl"))
        args: dict[str, Any] = {
            "jobName": kw.pop("jobName", "job-" + uuid.uuid4().hex[:8]),
            "roleArn": ROLE,
            "modelId": model,
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": uri}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": f"s3://{self.bucket}/out/"}},
            **kw,
        }
        return str(self.control.create_model_invocation_job(**args)["jobArn"])

    def get(self, arn: str) -> dict[str, Any]:
        return dict(self.control.get_model_invocation_job(jobIdentifier=arn))

    def output_lines(self, arn: str, name: str = "batch.jsonl") -> list[dict[str, Any]]:
        key = f"out/{arn.rsplit('/', 1)[-1]}/{name}.out"
        body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()
        return [json.loads(line) for line in body.splitlines() if line.strip()]

    def raw_output(self, arn: str, name: str = "batch.jsonl") -> list[str]:
        key = f"out/{arn.rsplit('/', 1)[-1]}/{name}.out"
        body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()
        return [line for line in body.splitlines() if line.strip()]

    def manifest(self, arn: str) -> dict[str, Any]:
        key = f"out/{arn.rsplit('/', 1)[-1]}/manifest.json.out"
        return dict(json.loads(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()))


BedrockFactory = Callable[..., AbstractContextManager[Bedrock]]


@pytest.fixture
def bedrock_factory(s3_endpoint: str) -> BedrockFactory:
    import boto3
    from botocore.config import Config

    @contextmanager
    def start(**config: Any) -> Iterator[Bedrock]:
        bucket = "bedrock-" + uuid.uuid4().hex[:12]
        s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket=bucket)
        no_retry = Config(retries={"max_attempts": 1, "mode": "standard"})
        with run_emulator(EmulatorConfig(s3_endpoint=s3_endpoint, **config), clock=Clock(FakeTime())) as url:
            control = boto3.client("bedrock", endpoint_url=url, region_name="us-east-1", config=no_retry)
            runtime = boto3.client(
                "bedrock-runtime", endpoint_url=url, region_name="us-east-1", config=no_retry
            )
            with httpx.Client(base_url=url, timeout=10) as http:
                yield Bedrock(url, bucket, s3, control, runtime, http)

    return start


@pytest.fixture
def bedrock(bedrock_factory: BedrockFactory) -> Iterator[Bedrock]:
    with bedrock_factory() as emulator:
        yield emulator


def error_code(exc: pytest.ExceptionInfo[Any]) -> str:
    return str(exc.value.response["Error"]["Code"])


def test_a_job_walks_through_every_bedrock_status_and_boto3_parses_each_answer(bedrock: Bedrock) -> None:
    arn = bedrock.create([claude_record(i) for i in range(120)], jobName="walk-1")
    assert arn.startswith("arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/")
    seen = []
    for step in (0.0, 0.7, 0.7, 1.0, 5.0, 5.0, 5.0):
        bedrock.advance(step)
        job = bedrock.get(arn)
        seen.append(job["status"])
    assert seen == [
        "Submitted",
        "Validating",
        "Scheduled",
        "InProgress",
        "InProgress",
        "InProgress",
        "Completed",
    ]
    assert job["jobName"] == "walk-1" and job["modelId"] == CLAUDE and job["roleArn"] == ROLE
    assert job["totalRecordCount"] == job["successRecordCount"] == job["processedRecordCount"] == 120
    assert job["errorRecordCount"] == 0
    assert job["submitTime"].year >= 2025 and job["endTime"] >= job["submitTime"]
    assert job["timeoutDurationInHours"] == 168


def test_record_counts_grow_while_the_job_is_in_progress(bedrock: Bedrock) -> None:
    arn = bedrock.create([claude_record(i) for i in range(200)])
    bedrock.advance(2.0 + 5.0)  # half-way through in_progress
    job = bedrock.get(arn)
    assert job["status"] == "InProgress"
    assert 0 < job["processedRecordCount"] < 200


def test_outputs_and_the_manifest_are_written_to_s3_when_the_job_completes(bedrock: Bedrock) -> None:
    records = [claude_record(i) for i in range(MIN_RECORDS)]
    arn = bedrock.create(records)
    bedrock.advance(DONE_S)
    assert bedrock.get(arn)["status"] == "Completed"
    lines = bedrock.output_lines(arn)
    assert sorted(line["recordId"] for line in lines) == sorted(r["recordId"] for r in records)
    first = lines[0]
    assert first["modelInput"] == next(r["modelInput"] for r in records if r["recordId"] == first["recordId"])
    output = first["modelOutput"]
    assert output["type"] == "message" and output["role"] == "assistant"
    assert output["content"][0]["type"] == "text" and output["stop_reason"] == "end_turn"
    assert output["usage"]["input_tokens"] > 0 and output["usage"]["output_tokens"] > 0
    manifest = bedrock.manifest(arn)
    assert manifest["totalRecordCount"] == manifest["processedRecordCount"] == MIN_RECORDS
    assert manifest["successRecordCount"] == MIN_RECORDS and manifest["errorRecordCount"] == 0
    assert manifest["inputTokenCount"] == sum(line["modelOutput"]["usage"]["input_tokens"] for line in lines)
    assert manifest["outputTokenCount"] == sum(
        line["modelOutput"]["usage"]["output_tokens"] for line in lines
    )


def test_nova_and_titan_embedding_inputs_get_their_own_output_shapes(bedrock: Bedrock) -> None:
    nova = [
        {
            "recordId": f"n{i:04d}",
            "modelInput": {
                "schemaVersion": "messages-v1",
                "system": [{"text": "Summarise."}],
                "messages": [{"role": "user", "content": [{"text": f"Text {i}."}]}],
                "inferenceConfig": {"maxTokens": 40},
            },
        }
        for i in range(MIN_RECORDS)
    ]
    titan = [{"recordId": f"t{i:04d}", "modelInput": {"inputText": f"text {i}"}} for i in range(MIN_RECORDS)]
    nova_arn = bedrock.create(nova, model=NOVA, key="nova/batch.jsonl")
    titan_arn = bedrock.create(titan, model=TITAN, key="titan/batch.jsonl")
    bedrock.advance(DONE_S)
    bedrock.get(nova_arn)
    bedrock.get(titan_arn)
    out = bedrock.output_lines(nova_arn)[0]["modelOutput"]
    assert out["output"]["message"]["content"][0]["text"]
    assert out["usage"]["inputTokens"] > 0 and out["stopReason"] == "end_turn"
    emb = bedrock.output_lines(titan_arn)[0]["modelOutput"]
    assert len(emb["embedding"]) == 1024 and emb["inputTextTokenCount"] > 0


def test_the_same_client_request_token_returns_the_same_job_and_creates_nothing(bedrock: Bedrock) -> None:
    records = [claude_record(i) for i in range(MIN_RECORDS)]
    first = bedrock.create(records, jobName="idem", clientRequestToken="abp-token-1")
    again = bedrock.create(records, jobName="idem", clientRequestToken="abp-token-1")
    other = bedrock.create(records, jobName="idem-2", clientRequestToken="abp-token-2")
    assert first == again != other
    stats = bedrock.http.get("/_emulator/stats").json()
    assert stats["counters"]["bedrock.batches_created"] == 2
    assert bedrock.get(first)["clientRequestToken"] == "abp-token-1"


def test_invalid_create_arguments_answer_validation_exception(bedrock: Bedrock) -> None:
    from botocore.exceptions import ClientError

    records = [claude_record(i) for i in range(MIN_RECORDS)]
    with pytest.raises(ClientError) as bad_model:
        bedrock.create(records, model="openai.gpt-4o")
    assert error_code(bad_model) == "ValidationException"
    assert "model identifier" in str(bad_model.value)
    with pytest.raises(ClientError) as bad_timeout:
        bedrock.create(records, timeoutDurationInHours=200)
    assert error_code(bad_timeout) == "ValidationException"


def test_an_unknown_job_answers_resource_not_found(bedrock: Bedrock) -> None:
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as exc:
        bedrock.get("arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/abcdef123456")
    assert error_code(exc) == "ResourceNotFoundException"


def test_a_job_below_the_minimum_record_count_fails_validation_with_the_numbers(bedrock: Bedrock) -> None:
    arn = bedrock.create([claude_record(i) for i in range(5)])
    bedrock.advance(DONE_S)
    job = bedrock.get(arn)
    assert job["status"] == "Failed"
    assert "(5)" in job["message"] and str(MIN_RECORDS) in job["message"]
    assert job["totalRecordCount"] == 0


def test_an_input_that_is_not_in_s3_fails_the_job_with_the_uri(bedrock: Bedrock) -> None:
    arn = str(
        bedrock.control.create_model_invocation_job(
            jobName="missing-input",
            roleArn=ROLE,
            modelId=CLAUDE,
            inputDataConfig={"s3InputDataConfig": {"s3Uri": f"s3://{bedrock.bucket}/nowhere/x.jsonl"}},
            outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"s3://{bedrock.bucket}/out/"}},
        )["jobArn"]
    )
    bedrock.advance(DONE_S)
    job = bedrock.get(arn)
    assert job["status"] == "Failed" and "nowhere/x.jsonl" in job["message"]


def test_item_faults_become_error_lines_with_bedrock_error_codes(bedrock_factory: BedrockFactory) -> None:
    faults = FaultConfig(
        rate_500=0.1, rate_429=0.1, rate_400=0.1, rate_context_length=0.05, rate_missing=0.05
    )
    with bedrock_factory(faults=faults, seed=3) as bedrock:
        records = [claude_record(i) for i in range(300)]
        arn = bedrock.create(records)
        bedrock.advance(DONE_S)
        job = bedrock.get(arn)
        lines = bedrock.output_lines(arn)
        errors = [line for line in lines if "error" in line]
        codes = {line["error"]["errorCode"] for line in errors}
        assert codes == {500, 429, 400}
        assert all(line["error"]["errorMessage"] for line in errors)
        assert job["errorRecordCount"] == len(errors)
        missing = 300 - len(lines)
        assert missing > 0  # rate_missing drops lines although they count as processed
        manifest = bedrock.manifest(arn)
        assert manifest["processedRecordCount"] == 300
        assert manifest["errorRecordCount"] == len(errors)


def test_duplicate_and_malformed_lines_are_written_as_configured(bedrock_factory: BedrockFactory) -> None:
    with bedrock_factory(faults=FaultConfig(rate_duplicate=0.1, rate_malformed=0.1), seed=5) as bedrock:
        arn = bedrock.create([claude_record(i) for i in range(200)])
        bedrock.advance(DONE_S)
        bedrock.get(arn)
        raw = bedrock.raw_output(arn)
        broken = 0
        for line in raw:
            try:
                json.loads(line)
            except ValueError:
                broken += 1
        assert broken > 0
        assert len(raw) > 200 - broken  # duplicates add lines


def test_an_expiring_job_is_partially_completed_or_expired_by_how_much_it_did(
    bedrock_factory: BedrockFactory,
) -> None:
    with bedrock_factory(faults=FaultConfig(expire_batches=(0,), expire_after_fraction=0.5)) as bedrock:
        arn = bedrock.create([claude_record(i) for i in range(200)])
        bedrock.advance(DONE_S)
        job = bedrock.get(arn)
        assert job["status"] == "PartiallyCompleted" and job["message"]
        assert 0 < len(bedrock.output_lines(arn)) < 200
    with bedrock_factory(faults=FaultConfig(expire_batches=(0,), expire_after_fraction=0.0)) as bedrock:
        arn = bedrock.create([claude_record(i) for i in range(200)])
        bedrock.advance(DONE_S)
        job = bedrock.get(arn)
        assert job["status"] == "Expired"
        assert bedrock.output_lines(arn) == []


def test_fail_validation_fails_the_next_job_only(bedrock_factory: BedrockFactory) -> None:
    with bedrock_factory(faults=FaultConfig(fail_validation=1)) as bedrock:
        first = bedrock.create([claude_record(i) for i in range(MIN_RECORDS)], key="a/x.jsonl")
        second = bedrock.create([claude_record(i) for i in range(MIN_RECORDS)], key="b/x.jsonl")
        bedrock.advance(DONE_S)
        assert bedrock.get(first)["status"] == "Failed"
        assert "fail_validation" in bedrock.get(first)["message"]
        assert bedrock.get(second)["status"] == "Completed"


def test_a_stop_goes_through_stopping_to_stopped_and_keeps_what_was_done(bedrock: Bedrock) -> None:
    arn = bedrock.create([claude_record(i) for i in range(200)])
    bedrock.advance(7.0)
    bedrock.control.stop_model_invocation_job(jobIdentifier=arn)
    assert bedrock.get(arn)["status"] == "Stopping"
    bedrock.advance(5.0)
    job = bedrock.get(arn)
    assert job["status"] == "Stopped"
    assert 0 < len(bedrock.output_lines(arn)) < 200


def test_stopping_a_finished_job_answers_validation_exception(bedrock: Bedrock) -> None:
    from botocore.exceptions import ClientError

    arn = bedrock.create([claude_record(i) for i in range(MIN_RECORDS)])
    bedrock.advance(DONE_S)
    with pytest.raises(ClientError) as exc:
        bedrock.control.stop_model_invocation_job(jobIdentifier=arn)
    assert error_code(exc) == "ValidationException" and "Completed" in str(exc.value)


def test_the_job_can_be_named_by_its_id_as_well_as_its_arn(bedrock: Bedrock) -> None:
    arn = bedrock.create([claude_record(i) for i in range(MIN_RECORDS)])
    assert bedrock.get(arn.rsplit("/", 1)[-1])["jobArn"] == arn


def test_list_filters_by_name_and_status_and_pages(bedrock: Bedrock) -> None:
    records = [claude_record(i) for i in range(MIN_RECORDS)]
    arns = [bedrock.create(records, jobName=f"list-{i}") for i in range(3)]
    bedrock.create(records, jobName="other")
    found = bedrock.control.list_model_invocation_jobs(nameContains="list-")["invocationJobSummaries"]
    assert [j["jobArn"] for j in found] == arns[::-1]  # newest first
    page = bedrock.control.list_model_invocation_jobs(maxResults=2)
    assert len(page["invocationJobSummaries"]) == 2 and page["nextToken"]
    rest = bedrock.control.list_model_invocation_jobs(maxResults=2, nextToken=page["nextToken"])
    assert len(rest["invocationJobSummaries"]) == 2 and "nextToken" not in rest
    paged = [
        j["jobArn"]
        for p in bedrock.control.get_paginator("list_model_invocation_jobs").paginate(
            PaginationConfig={"PageSize": 3}
        )
        for j in p["invocationJobSummaries"]
    ]
    assert len(paged) == 4
    assert (
        bedrock.control.list_model_invocation_jobs(statusEquals="Completed")["invocationJobSummaries"] == []
    )
    bedrock.advance(DONE_S)
    done = bedrock.control.list_model_invocation_jobs(statusEquals="Completed")["invocationJobSummaries"]
    assert len(done) == 4


def test_a_retrieve_fault_answers_internal_server_exception(bedrock_factory: BedrockFactory) -> None:
    from botocore.exceptions import ClientError

    with bedrock_factory(faults=FaultConfig(retrieve_5xx_rate=1.0)) as bedrock:
        arn = bedrock.create([claude_record(i) for i in range(MIN_RECORDS)])
        with pytest.raises(ClientError) as exc:
            bedrock.get(arn)
        assert error_code(exc) == "InternalServerException"


def test_invoke_model_answers_each_family_in_its_native_shape(bedrock: Bedrock) -> None:
    claude = bedrock.runtime.invoke_model(
        modelId=CLAUDE, body=json.dumps(claude_record(1, "I love this blender")["modelInput"])
    )
    body = json.loads(claude["body"].read())
    assert claude["contentType"] == "application/json"
    assert body["type"] == "message" and "positive" in body["content"][0]["text"]
    headers = claude["ResponseMetadata"]["HTTPHeaders"]
    assert int(headers["x-amzn-bedrock-input-token-count"]) == body["usage"]["input_tokens"]
    nova = bedrock.runtime.invoke_model(
        modelId=NOVA,
        body=json.dumps(
            {"schemaVersion": "messages-v1", "messages": [{"role": "user", "content": [{"text": "hi"}]}]}
        ),
    )
    assert json.loads(nova["body"].read())["output"]["message"]["role"] == "assistant"
    titan = bedrock.runtime.invoke_model(
        modelId=TITAN, body=json.dumps({"inputText": "hello", "dimensions": 256})
    )
    assert len(json.loads(titan["body"].read())["embedding"]) == 256


def test_invoke_model_refuses_a_malformed_body_with_validation_exception(bedrock: Bedrock) -> None:
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as exc:
        bedrock.runtime.invoke_model(modelId=CLAUDE, body=json.dumps({"messages": []}))
    assert error_code(exc) == "ValidationException"


def test_invoke_model_throttles_with_throttling_exception_and_retry_after(
    bedrock_factory: BedrockFactory,
) -> None:
    from botocore.exceptions import ClientError

    with bedrock_factory(faults=FaultConfig(sync_429_rate=1.0, sync_retry_after_s=2.0)) as bedrock:
        with pytest.raises(ClientError) as exc:
            bedrock.runtime.invoke_model(modelId=CLAUDE, body=json.dumps(claude_record(1)["modelInput"]))
        assert error_code(exc) == "ThrottlingException"
        assert exc.value.response["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "2"


def test_the_rpm_limiter_throttles_invoke_model(bedrock_factory: BedrockFactory) -> None:
    from botocore.exceptions import ClientError

    with bedrock_factory(faults=FaultConfig(rpm_limit=2)) as bedrock:
        body = json.dumps(claude_record(1)["modelInput"])
        bedrock.runtime.invoke_model(modelId=CLAUDE, body=body)
        bedrock.runtime.invoke_model(modelId=CLAUDE, body=body)
        with pytest.raises(ClientError) as exc:
            bedrock.runtime.invoke_model(modelId=CLAUDE, body=body)
        assert error_code(exc) == "ThrottlingException"


def test_the_command_line_takes_the_s3_endpoint() -> None:
    from batch_emulator.__main__ import _parse_args, build_config

    config = build_config(_parse_args(["--s3-endpoint", "http://127.0.0.1:9000"]))
    assert config.s3_endpoint == "http://127.0.0.1:9000"
    assert build_config(_parse_args([])).s3_endpoint is None
