from __future__ import annotations

import hashlib
import os
import urllib.request

import pytest

from tests.support.s3 import DUMMY_AWS_ENV, dummy_aws_env, start_s3


def test_real_boto3_creates_a_bucket_puts_and_streams_an_object_through_the_endpoint(
    s3_endpoint: str,
) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="abp-stream")
    payload = b"".join(b'{"custom_id": "item-%06d"}\n' % i for i in range(50_000))  # ~1.3 MB
    client.put_object(Bucket="abp-stream", Key="in/batch.jsonl", Body=payload)

    body = client.get_object(Bucket="abp-stream", Key="in/batch.jsonl")["Body"]
    digest, chunks = hashlib.sha256(), 0
    for chunk in body.iter_chunks(chunk_size=64 * 1024):
        digest.update(chunk)
        chunks += 1
    assert chunks > 1
    assert digest.hexdigest() == hashlib.sha256(payload).hexdigest()
    names = [b["Name"] for b in client.list_buckets()["Buckets"]]
    assert "abp-stream" in names

    # it is a real HTTP server: a plain GET of the service root lists the bucket
    with urllib.request.urlopen(f"{s3_endpoint}/", timeout=10) as response:
        assert b"<Name>abp-stream</Name>" in response.read()


def test_the_s3_endpoint_sets_dummy_aws_credentials_for_the_session(s3_endpoint: str) -> None:
    assert s3_endpoint.startswith("http://127.0.0.1:")
    for name, value in DUMMY_AWS_ENV.items():
        assert os.environ[name] == value
    assert "AWS_PROFILE" not in os.environ


def test_dummy_aws_env_restores_the_previous_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-the-developer")
    monkeypatch.setenv("AWS_PROFILE", "work")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    with dummy_aws_env({"EXTRA_VAR_FOR_TEST": "1"}):
        assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"
        assert os.environ["EXTRA_VAR_FOR_TEST"] == "1"
        assert "AWS_PROFILE" not in os.environ
    assert os.environ["AWS_ACCESS_KEY_ID"] == "from-the-developer"
    assert os.environ["AWS_PROFILE"] == "work"
    assert "AWS_SESSION_TOKEN" not in os.environ
    assert "EXTRA_VAR_FOR_TEST" not in os.environ


def test_a_stopped_s3_server_no_longer_answers() -> None:
    server = start_s3()
    url = f"{server.endpoint_url}/"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
    server.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)
    server.stop()  # idempotent
