"""The Bedrock adapter's contract, through real boto3 / aiobotocore clients over HTTP to the emulator,
with input and output in a real S3-compatible server (moto) on loopback."""

from __future__ import annotations

import asyncio
import io
import json
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from airflow_batch_provider.adapters.base import AdapterSettings, BatchRef, BatchStatus, InputRef
from airflow_batch_provider.adapters.bedrock import (
    MAX_FILE_BYTES,
    MAX_RECORDS,
    MIN_RECORDS,
    BedrockBatchAdapter,
    job_name,
    request_token,
)
from airflow_batch_provider.core.requests import CanonicalRequest
from airflow_batch_provider.core.results import ItemResult, MalformedLine
from airflow_batch_provider.exceptions import ConfigurationError, SubmitError
from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import FaultConfig
from batch_emulator.store import Clock
from batch_emulator.testing import run_emulator
from tests.support.aws_conns import ROLE, aws_and_bedrock, bedrock_conn

from .faults import FAST_CREATE, arm, batches

CLAUDE = "anthropic.claude-3-5-haiku-20241022-v1:0"
NOVA = "us.amazon.nova-lite-v1:0"
TITAN = "amazon.titan-embed-text-v2:0"
DONE_S = 15.0  # default emulator timings at time_scale 1: everything ends by 14 s
JOB_NAME = re.compile(r"^[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}$")
TOKEN = re.compile(r"^[a-zA-Z0-9]{1,256}(-*[a-zA-Z0-9]){0,256}$")


class FakeTime:
    def __init__(self) -> None:
        self.value = 1_760_000_000.0

    def __call__(self) -> float:
        return self.value


def request(i: int = 0, model: str = CLAUDE, **params: Any) -> CanonicalRequest:
    return CanonicalRequest(
        app_id=f"item{i}",
        prompt_version="v1",
        model=model,
        system="Label the sentiment of the comment.",
        messages=({"role": "user", "content": f"Comment {i}: the delivery was late and I am angry"},),
        params={"max_tokens": 60, "temperature": 0, **params},
    )


def settings(url: str | None, s3_endpoint: str | None, bucket: str, **extra: Any) -> AdapterSettings:
    return AdapterSettings(
        api_key="testing",
        base_url=url,
        extra={
            "aws_access_key_id": "testing",
            "region_name": "us-east-1",
            "role_arn": ROLE,
            "s3_uri": f"s3://{bucket}/llm-batch/input",
            "output_s3_uri": f"s3://{bucket}/llm-batch/output",
            "s3_endpoint_url": s3_endpoint,
            "max_retries": 0,
            **extra,
        },
    )


@dataclass
class Env:
    url: str
    bucket: str
    adapter: BedrockBatchAdapter
    http: httpx.Client

    def advance(self, seconds: float) -> None:
        self.http.post("/_emulator/clock", json={"advance_s": seconds}).raise_for_status()

    def jobs_created(self) -> int:
        return int(self.http.get("/_emulator/stats").json()["counters"].get("bedrock.batches_created", 0))

    def chunk(self, n: int, key: str, model: str = CLAUDE) -> InputRef:
        data = b"".join(
            self.adapter.format_line(request(i, model), f"item{i}__a1c0") + b"\n" for i in range(n)
        )
        return self.adapter.stage(io.BytesIO(data), f"{key}.jsonl", len(data))

    def submit(self, n: int, key: str, model: str = CLAUDE) -> BatchRef:
        return self.adapter.submit(self.chunk(n, key, model), key, {"model": model, "workload": "test"})

    def results(self, ref: BatchRef) -> list[ItemResult | MalformedLine]:
        sink = io.BytesIO()
        self.adapter.download(ref, "output", sink)
        sink.seek(0)
        return list(self.adapter.parse_results(sink))


EnvFactory = Callable[..., AbstractContextManager[Env]]


@pytest.fixture
def env_factory(s3_endpoint: str) -> EnvFactory:
    import boto3

    @contextmanager
    def start(extra: dict[str, Any] | None = None, **config: Any) -> Iterator[Env]:
        bucket = "abp-" + uuid.uuid4().hex[:12]
        boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        with run_emulator(EmulatorConfig(s3_endpoint=s3_endpoint, **config), clock=Clock(FakeTime())) as url:
            adapter = BedrockBatchAdapter(settings(url, s3_endpoint, bucket, **(extra or {})))
            with httpx.Client(base_url=url, timeout=10) as http:
                yield Env(url, bucket, adapter, http)

    return start


@pytest.fixture
def env(env_factory: EnvFactory) -> Iterator[Env]:
    with env_factory() as e:
        yield e


def offline(**extra: Any) -> BedrockBatchAdapter:
    return BedrockBatchAdapter(settings(None, None, "abp-offline", **extra))


# -- limits and formatting -----------------------------------------------------------------------


def test_limits_are_bedrocks_quotas_including_the_minimum_record_count() -> None:
    limits = BedrockBatchAdapter.limits
    assert (limits.max_requests, limits.max_bytes, limits.min_requests) == (
        MAX_RECORDS,
        MAX_FILE_BYTES,
        MIN_RECORDS,
    )
    assert (MAX_RECORDS, MAX_FILE_BYTES, MIN_RECORDS) == (50_000, 1_000_000_000, 100)
    assert limits.custom_id_pattern == r"^[A-Za-z0-9_-]{1,64}$"
    assert offline().min_records == 100
    assert offline(min_records=10).min_records == 10


def test_the_adapter_is_registered_under_its_connection_type() -> None:
    from airflow_batch_provider.adapters.registry import adapter_class

    assert adapter_class("bedrock_batch") is BedrockBatchAdapter
    assert (BedrockBatchAdapter.name, BedrockBatchAdapter.conn_type) == ("bedrock", "bedrock_batch")


def test_a_claude_line_carries_the_anthropic_messages_body_under_model_input() -> None:
    line = json.loads(
        offline().format_line(request(3, response_format={"type": "json_object"}, stop="END"), "item3__a1c0")
    )
    assert line["recordId"] == "item3__a1c0"
    body = line["modelInput"]
    (block,) = body.pop("system")
    assert block["text"].startswith(
        "Label the sentiment of the comment.\n\nAnswer with exactly one JSON object"
    )
    assert block["cache_control"] == {"type": "ephemeral"}
    assert body == {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 60,
        "messages": [{"role": "user", "content": "Comment 3: the delivery was late and I am angry"}],
        "temperature": 0,
        "stop_sequences": ["END"],
    }


def test_the_shared_prefix_is_unmarked_when_the_connection_turns_prompt_caching_off() -> None:
    line = json.loads(offline(prompt_caching=False).format_line(request(), "a__a1c0"))
    assert line["modelInput"]["system"] == [{"type": "text", "text": "Label the sentiment of the comment."}]


def test_a_nova_line_carries_the_messages_v1_body() -> None:
    line = json.loads(offline().format_line(request(1, NOVA, top_p=0.9), "item1__a1c0"))
    body = line["modelInput"]
    assert body["schemaVersion"] == "messages-v1"
    assert body["system"] == [{"text": "Label the sentiment of the comment."}]
    assert body["messages"][0] == {
        "role": "user",
        "content": [{"text": "Comment 1: the delivery was late and I am angry"}],
    }
    assert body["inferenceConfig"] == {"maxTokens": 60, "temperature": 0, "topP": 0.9}


def test_an_embedding_line_carries_the_titan_input_text() -> None:
    req = CanonicalRequest(
        "e1",
        "v1",
        TITAN,
        kind="embedding",
        messages=({"role": "user", "content": "hello"},),
        params={"dimensions": 256},
    )
    assert json.loads(offline().format_line(req, "e1__a1c0")) == {
        "recordId": "e1__a1c0",
        "modelInput": {"inputText": "hello", "dimensions": 256},
    }


def test_a_model_outside_the_known_families_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match=r"'gpt-4o-mini'.*anthropic\.\*"):
        offline().format_line(request(model="gpt-4o-mini"), "x__a1c0")


def test_job_names_and_tokens_from_keys_fit_bedrocks_patterns() -> None:
    for key in ("abp-" + "f" * 32, "x" * 100, "a key/with:odd chars", "-leading"):
        name, token = job_name(key), request_token(key)
        assert JOB_NAME.match(name) and len(name) <= 63, name
        assert TOKEN.match(token) and len(token) <= 256, token
        assert job_name(key) == name  # deterministic
    assert job_name("abp-1234") == "abp-1234" == request_token("abp-1234")
    assert job_name("x" * 100) != job_name("x" * 99 + "y")


# -- status mapping ------------------------------------------------------------------------------


def _walk(env: Env, ref: BatchRef, steps: list[float]) -> list[BatchStatus]:
    seen = []
    for step in steps:
        env.advance(step)
        seen.append(env.adapter.status(ref))
    return seen


def test_a_job_reports_submitted_validating_scheduled_in_progress_and_completed(env: Env) -> None:
    ref = env.submit(MIN_RECORDS, "abp-walk")
    seen = _walk(env, ref, [0.0, 0.7, 0.7, 1.0, 6.0, 6.0])
    assert [s.raw_state for s in seen] == [
        "Submitted",
        "Validating",
        "Scheduled",
        "InProgress",
        "InProgress",
        "Completed",
    ]
    assert [s.state for s in seen] == ["validating"] * 3 + ["in_progress"] * 2 + ["completed"]
    assert seen[3].completed + seen[4].completed > 0
    assert (seen[-1].total, seen[-1].completed, seen[-1].failed) == (MIN_RECORDS, MIN_RECORDS, 0)


def test_partially_completed_and_expired_jobs_are_expired_with_the_reason(env_factory: EnvFactory) -> None:
    with env_factory(faults=FaultConfig(expire_batches=(0,), expire_after_fraction=0.5)) as env:
        status = _walk(env, env.submit(200, "abp-partial"), [DONE_S])[-1]
        assert (status.raw_state, status.state) == ("PartiallyCompleted", "expired")
        assert status.reason and 0 < status.completed < 200
    with env_factory(faults=FaultConfig(expire_batches=(0,), expire_after_fraction=0.0)) as env:
        status = _walk(env, env.submit(200, "abp-expired"), [DONE_S])[-1]
        assert (status.raw_state, status.state, status.completed) == ("Expired", "expired", 0)


def test_a_job_that_fails_validation_is_failed_with_the_providers_message(env_factory: EnvFactory) -> None:
    with env_factory(faults=FaultConfig(fail_validation=1)) as env:
        status = _walk(env, env.submit(MIN_RECORDS, "abp-failed"), [DONE_S])[-1]
        assert (status.raw_state, status.state, status.terminal) == ("Failed", "failed", True)
        assert status.reason and "validation" in status.reason


def test_the_async_client_reads_status_through_aiobotocore(env: Env) -> None:
    ref = env.submit(MIN_RECORDS, "abp-async")
    env.advance(DONE_S)

    async def poll() -> BatchStatus:
        client = env.adapter.async_client()
        try:
            return await client.status(ref)
        finally:
            await client.close()

    status = asyncio.run(poll())
    assert (status.state, status.total, status.completed) == ("completed", MIN_RECORDS, MIN_RECORDS)


# -- staging and submit --------------------------------------------------------------------------


class Unreadable(io.BytesIO):
    def read(self, *args: Any) -> bytes:
        raise AssertionError("stage read the chunk although an identical upload exists")


def test_stage_uploads_to_the_s3_prefix_and_reuses_an_upload_of_the_same_size(env: Env) -> None:
    first = env.chunk(MIN_RECORDS, "abp-stage")
    assert first == InputRef("uri", f"s3://{env.bucket}/llm-batch/input/abp-stage.jsonl")
    head = env.adapter.s3.head_object(Bucket=env.bucket, Key="llm-batch/input/abp-stage.jsonl")
    assert head["Metadata"]["abp-records"] == str(MIN_RECORDS)
    again = env.adapter.stage(Unreadable(), "abp-stage.jsonl", int(head["ContentLength"]))
    assert again == first


def test_a_second_submit_with_the_same_key_returns_the_same_job(env: Env) -> None:
    input_ref = env.chunk(MIN_RECORDS, "abp-idem")
    first = env.adapter.submit(input_ref, "abp-idem", {"model": CLAUDE})
    second = env.adapter.submit(input_ref, "abp-idem", {"model": CLAUDE})
    assert first == second and first.batch_id.startswith("arn:aws:bedrock:")
    assert env.jobs_created() == 1
    assert env.adapter.find("abp-idem") == first
    assert env.adapter.find("abp-never-submitted") is None


def test_a_create_whose_reply_was_lost_is_found_and_a_retried_create_returns_its_arn(env: Env) -> None:
    input_ref = env.chunk(MIN_RECORDS, "abp-lost")
    lost = env.adapter.bedrock.create_model_invocation_job(
        jobName=job_name("abp-lost"),
        roleArn=ROLE,
        modelId=CLAUDE,
        clientRequestToken=request_token("abp-lost"),
        inputDataConfig={"s3InputDataConfig": {"s3Uri": input_ref.value}},
        outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"s3://{env.bucket}/llm-batch/output/"}},
    )["jobArn"]
    assert env.adapter.find("abp-lost") == BatchRef("bedrock", lost, "abp-lost")
    assert env.adapter.submit(input_ref, "abp-lost", {"model": CLAUDE}).batch_id == lost
    assert env.jobs_created() == 1


def test_a_chunk_below_the_minimum_is_refused_before_any_job_is_created(env: Env) -> None:
    input_ref = env.chunk(7, "abp-small")
    with pytest.raises(SubmitError) as exc:
        env.adapter.submit(input_ref, "abp-small", {"model": CLAUDE})
    message = str(exc.value)
    assert "7 records" in message and "minimum of 100" in message
    assert "ChunkOptions(max_requests=...)" in message and "synchronous" in message
    assert env.jobs_created() == 0


def test_a_submit_without_a_model_id_is_refused_before_any_job_is_created(env: Env) -> None:
    input_ref = env.chunk(MIN_RECORDS, "abp-nomodel")
    with pytest.raises(SubmitError, match="model id"):
        env.adapter.submit(input_ref, "abp-nomodel", {"workload": "test"})
    assert env.jobs_created() == 0


def test_the_model_id_extra_is_used_when_the_submit_metadata_has_no_model(env_factory: EnvFactory) -> None:
    with env_factory(extra={"model_id": NOVA}) as env:
        ref = env.adapter.submit(env.chunk(MIN_RECORDS, "abp-extra-model", NOVA), "abp-extra-model", {})
        assert env.adapter.bedrock.get_model_invocation_job(jobIdentifier=ref.batch_id)["modelId"] == NOVA


def test_the_minimum_follows_the_connections_min_records(env_factory: EnvFactory) -> None:
    with (
        env_factory(extra={"min_records": 200}) as env,
        pytest.raises(SubmitError, match=r"150 records.*minimum of 200"),
    ):
        env.submit(150, "abp-quota")


def test_a_connection_without_role_staging_or_a_whole_key_pair_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="role_arn"):
        _ = offline(role_arn=None).role_arn
    with pytest.raises(ConfigurationError, match="s3_uri"):
        _ = offline(s3_uri=None, output_s3_uri=None).input_uri
    with pytest.raises(ConfigurationError, match="half of an AWS key pair"):
        _ = BedrockBatchAdapter(AdapterSettings(api_key="secret", extra={"region_name": "us-east-1"})).bedrock
    assert offline(s3_uri="s3://b/p/", output_s3_uri=None).output_uri == "s3://b/p/output"
    assert offline(s3_uri=None, input_bucket="b", input_prefix="/in/").input_uri == "s3://b/in"


# -- results -------------------------------------------------------------------------------------


def test_results_are_streamed_from_the_out_file_and_parsed_with_usage(env: Env) -> None:
    ref = env.submit(MIN_RECORDS, "abp-results")
    env.advance(DONE_S)
    assert env.adapter.status(ref).state == "completed"
    assert env.adapter.download(ref, "errors", io.BytesIO()) == 0
    results = env.results(ref)
    assert sorted(r.custom_id for r in results if isinstance(r, ItemResult)) == sorted(
        f"item{i}__a1c0" for i in range(MIN_RECORDS)
    )
    first = results[0]
    assert isinstance(first, ItemResult) and first.outcome == "succeeded"
    assert json.loads(first.output)["sentiment"] == "negative"
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    assert first.raw["finish_reason"] == "end_turn"
    manifest = env.adapter.manifest(ref)
    assert manifest is not None and manifest["successRecordCount"] == MIN_RECORDS
    assert manifest["inputTokenCount"] == sum(
        r.usage.input_tokens for r in results if isinstance(r, ItemResult)
    )


def test_error_lines_split_into_retryable_and_permanent_and_damaged_lines_are_malformed(
    env_factory: EnvFactory,
) -> None:
    faults = FaultConfig(rate_500=0.1, rate_429=0.1, rate_400=0.1, rate_missing=0.05, rate_malformed=0.05)
    with env_factory(faults=faults, seed=9) as env:
        ref = env.submit(300, "abp-faults")
        env.advance(DONE_S)
        status = env.adapter.status(ref)
        results = env.results(ref)
    parsed = [r for r in results if isinstance(r, ItemResult)]
    by_code = {(r.error_code, r.outcome) for r in parsed if r.outcome != "succeeded"}
    assert by_code == {("500", "failed_retryable"), ("429", "failed_retryable"), ("400", "failed_permanent")}
    assert status.failed == sum(1 for r in parsed if r.outcome != "succeeded")
    assert any(isinstance(r, MalformedLine) for r in results)
    assert len(results) < 300  # missing lines are in no file


# -- cancel --------------------------------------------------------------------------------------


def test_cancel_stops_the_job_and_what_it_finished_stays_downloadable(env: Env) -> None:
    ref = env.submit(200, "abp-cancel")
    env.advance(7.0)
    env.adapter.cancel(ref)
    assert env.adapter.status(ref).state == "cancelling"
    env.advance(5.0)
    status = env.adapter.status(ref)
    assert (status.state, status.raw_state) == ("cancelled", "Stopped")
    done = [r for r in env.results(ref) if isinstance(r, ItemResult)]
    assert 0 < len(done) < 200


def test_cancelling_a_job_that_already_ended_is_not_an_error(env: Env) -> None:
    ref = env.submit(MIN_RECORDS, "abp-late-cancel")
    env.advance(DONE_S)
    env.adapter.cancel(ref)
    assert env.adapter.status(ref).state == "completed"


# -- real-time -----------------------------------------------------------------------------------


def _complete(adapter: BedrockBatchAdapter, req: CanonicalRequest) -> Any:
    async def go() -> Any:
        client = adapter.realtime_client()
        try:
            return await client.complete(req, "rt__a1c0")
        finally:
            await client.close()

    return asyncio.run(go())


def test_the_realtime_client_answers_through_invoke_model(env: Env) -> None:
    reply = _complete(env.adapter, request(1))
    assert reply.result.outcome == "succeeded" and reply.result.custom_id == "rt__a1c0"
    assert json.loads(reply.result.output)["sentiment"] == "negative"
    assert reply.result.usage.input_tokens > 0 and reply.retry_after is None
    nova = _complete(env.adapter, request(1, NOVA))
    assert nova.result.outcome == "succeeded" and nova.result.output


def test_a_throttled_realtime_call_is_retryable_with_the_retry_after(env_factory: EnvFactory) -> None:
    with env_factory(faults=FaultConfig(sync_429_rate=1.0, sync_retry_after_s=3.0)) as env:
        reply = _complete(env.adapter, request(1))
    assert (reply.result.outcome, reply.result.error_code, reply.retry_after) == (
        "failed_retryable",
        "ThrottlingException",
        3.0,
    )


def test_a_realtime_call_the_model_refuses_is_permanent(env: Env) -> None:
    huge = CanonicalRequest("big", "v1", CLAUDE, messages=({"role": "user", "content": "word " * 200_000},))
    refused = _complete(env.adapter, huge)
    assert (refused.result.outcome, refused.result.error_code) == ("failed_permanent", "ValidationException")
    assert "too long" in (refused.result.error_message or "")


def test_an_unreachable_endpoint_is_a_retryable_realtime_failure() -> None:
    adapter = BedrockBatchAdapter(settings("http://127.0.0.1:9", None, "abp-x"))
    reply = _complete(adapter, request(1))
    assert reply.result.outcome == "failed_retryable"


# -- hook ----------------------------------------------------------------------------------------


def test_a_job_runs_on_the_credentials_and_endpoints_of_the_aws_connection(
    env: Env, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys and the S3 endpoint come from the aws connection (through AwsBaseHook), none from the
    bedrock_batch connection; a whole job is staged, created, finished and downloaded with them."""
    from airflow_batch_provider.hooks.batch import BatchHook

    aws_and_bedrock(
        monkeypatch,
        {
            "login": "AKIDFROMAWSCONN",
            "password": "secret-from-aws-conn",
            "extra": {"service_config": {"s3": {"endpoint_url": s3_endpoint}}},
        },
        bedrock_conn(env.url, env.bucket),
    )
    adapter = BatchHook("abp_bedrock").get_adapter()
    assert isinstance(adapter, BedrockBatchAdapter)
    assert adapter.settings.extra["s3_endpoint_url"] == s3_endpoint
    assert adapter.bedrock._request_signer._credentials.access_key == "AKIDFROMAWSCONN"
    assert adapter.s3._request_signer._credentials.access_key == "AKIDFROMAWSCONN"
    env.adapter = adapter
    ref = env.submit(MIN_RECORDS, "abp-aws-conn")
    env.advance(DONE_S)
    assert adapter.status(ref).state == "completed"
    assert (
        sum(isinstance(r, ItemResult) and r.outcome == "succeeded" for r in env.results(ref)) == MIN_RECORDS
    )


def test_an_assume_role_aws_connection_signs_with_the_roles_temporary_keys(
    env: Env, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """assume-role comes for free from the Amazon provider: STS (moto) hands out temporary keys."""
    from airflow_batch_provider.hooks.batch import BatchHook

    aws_and_bedrock(
        monkeypatch,
        {
            "login": "AKIDBASE",
            "password": "base-secret",
            "extra": {
                "role_arn": "arn:aws:iam::123456789012:role/abp-batch-caller",
                # STS and S3 at moto (assume-role reads only the service's own endpoint);
                # Bedrock at the emulator (the bedrock_batch connection's host)
                "endpoint_url": s3_endpoint,
                "service_config": {"sts": {"endpoint_url": s3_endpoint}},
            },
        },
        bedrock_conn(env.url, env.bucket),
    )
    adapter = BatchHook("abp_bedrock").get_adapter()
    assumed = adapter.bedrock._request_signer._credentials
    assert assumed.method == "sts-assume-role"
    assert assumed.access_key not in ("AKIDBASE", "testing")
    env.adapter = adapter
    ref = env.submit(MIN_RECORDS, "abp-assumed")
    assert adapter.find("abp-assumed") == ref


async def test_the_triggers_async_client_gets_the_aws_connections_credentials(
    env: Env, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batch_provider.hooks.batch import BatchHook

    aws_and_bedrock(
        monkeypatch,
        {"login": "AKIDASYNC", "password": "async-secret", "extra": {"endpoint_url": s3_endpoint}},
        bedrock_conn(env.url, env.bucket),
    )
    ref = env.submit(MIN_RECORDS, "abp-async-creds")
    adapter = await BatchHook.aget_adapter("abp_bedrock")
    client = adapter.async_client()
    try:
        status = await client.status(ref)
        signer = client._client._request_signer  # type: ignore[attr-defined]
        assert (await signer._credentials.get_frozen_credentials()).access_key == "AKIDASYNC"
    finally:
        await client.close()
    assert status.state == "validating"  # the job the sync client created, read by the async one


def test_the_test_button_lists_jobs_and_checks_the_bucket(
    env: Env, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.models.connection import Connection

    aws_and_bedrock(
        monkeypatch,
        {"login": "AKID", "password": "secret", "extra": {"endpoint_url": s3_endpoint}},
        bedrock_conn(env.url, env.bucket),
    )
    ok, message = Connection.get_connection_from_secrets("abp_bedrock").test_connection()
    assert ok, message
    assert f"bucket {env.bucket} is reachable" in message
    missing = bedrock_conn(env.url, "abp-no-such-bucket")
    monkeypatch.setenv("AIRFLOW_CONN_ABP_BEDROCK", json.dumps({"conn_type": "bedrock_batch", **missing}))
    ok, message = Connection.get_connection_from_secrets("abp_bedrock").test_connection()
    assert not ok and "404" in message, message


# -- the create rule under faults ------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["500_after", "drop_after", "slow_after"])
def test_a_lost_create_reply_is_found_by_its_job_name_and_not_created_again(
    env_factory: EnvFactory, fault: str
) -> None:
    with env_factory(extra={**FAST_CREATE, "max_retries": 3}) as env:
        input_ref = env.chunk(MIN_RECORDS, "abp-lost-reply")
        arm(env.url, f"create:{fault}")
        ref = env.adapter.submit(input_ref, "abp-lost-reply", {"model": CLAUDE})
        (job,) = batches(env.url, "bedrock")
        assert ref.batch_id.endswith(f"/{job['id']}")
        assert job["keys"]["job_name"] == job_name("abp-lost-reply")


def test_a_throttled_create_is_sent_again_and_makes_one_job(env_factory: EnvFactory) -> None:
    with env_factory(extra=FAST_CREATE) as env:
        input_ref = env.chunk(MIN_RECORDS, "abp-throttled")
        arm(env.url, "create:429", create_retry_after_s=0)
        ref = env.adapter.submit(input_ref, "abp-throttled", {"model": CLAUDE})
        assert [j["id"] for j in batches(env.url, "bedrock")] == [ref.batch_id.rsplit("/", 1)[1]]


def test_a_failed_job_carries_a_normalised_error_code(env_factory: EnvFactory) -> None:
    with env_factory(faults=FaultConfig(fail_validation=1)) as env:
        status = _walk(env, env.submit(MIN_RECORDS, "abp-failed-code"), [DONE_S])[-1]
        assert (status.state, status.error_code) == ("failed", "invalid_file")
        assert status.error_message == status.reason


def test_a_responses_request_is_refused_at_formatting_naming_the_provider_that_takes_it() -> None:
    req = CanonicalRequest("r1", "v1", CLAUDE, kind="response", messages=({"role": "user", "content": "x"},))
    with pytest.raises(ConfigurationError, match=r"provider 'bedrock' accepts only \['chat', 'embedding'\]"):
        offline().format_line(req, "r1__a1c0")
