"""Amazon Bedrock batch inference (model invocation jobs) through ``boto3``, input and output in S3.

Each JSONL line is ``{"recordId": <custom_id>, "modelInput": <the model's InvokeModel body>}``:
the Claude Messages body for ``anthropic.*`` models, built by
:func:`~airflow_batch_provider.adapters.claude.claude_body` exactly as for Anthropic (so an
OpenAI-style ``response_format`` becomes the same JSON instruction, the system block carries the
same ``prompt_caching`` cache marker, tools are carried), the ``messages-v1`` body for
``amazon.nova-*`` and ``{"inputText"}`` for ``amazon.titan-embed-*`` (embeddings). Nova takes no
structured-output parameter, so ``response_format`` is dropped there (outputs are still validated
after download).

Flow: :meth:`stage` uploads the chunk to ``<s3_uri>/<name>`` (reused when an object of that key
and size exists), :meth:`submit` calls ``create_model_invocation_job`` with a job name and a
``clientRequestToken`` both derived from the idempotency key (so a retried create returns the
same job ARN, as AWS promises for a repeated token), :meth:`find` lists jobs by name, and
:meth:`download` streams the ``<input file>.out`` objects that Bedrock writes under
``<output_s3_uri>/<job id>/`` (successes and errors share one file: the ``errors`` download is
always empty). :meth:`manifest` reads ``manifest.json.out``.

The create rule: ``create_model_invocation_job`` is sent by a client with botocore's retries off
(``max_attempts`` 1) under :func:`~airflow_batch_provider.adapters.base.create_once`: a
``ThrottlingException`` (429) is sent again after backoff; a timeout, dropped connection or 5xx is
followed by :meth:`find` (the job name) before the create is sent again, with the same
``clientRequestToken``, so even a job the list does not show yet comes back as the same ARN. The
S3 upload of a chunk is a ``PUT`` of one fixed key: repeating it overwrites the same object, so it
keeps boto3's retries, and :meth:`stage` first looks for an object of that key and size.

Limits used (AWS default quotas, checked against the Bedrock user guide and service quotas in
November 2025): at most 50,000 records and 1 GB per input file, at least 100 records per job
(``Minimum number of records per batch inference job``; set ``min_records`` in the connection
extras where your account's quota differs).

**Chunks below the minimum (the documented choice).** Nothing is padded. :meth:`submit`
refuses a job with fewer records than the minimum, before anything is created, with a
:class:`~airflow_batch_provider.exceptions.SubmitError` that names the chunk size, the minimum
and the remedies: keep chunks large (``ChunkOptions(max_requests=...)`` of at least the minimum, so only
the last chunk of a run can be short, and size runs so it is not), or run tiny workloads through
the synchronous path (:meth:`realtime_client`, used by the deadline fallback) instead of batch.
Retry rounds with fewer retryable items than the minimum hit the same refusal; route them to the
synchronous fallback.

Connection: credentials come from the Amazon provider's ``AwsBaseHook`` of the connection's
``aws_conn_id`` (the hook passes it as :attr:`AdapterSettings.credentials`); adapters built
without Airflow read ``aws_access_key_id``/``aws_secret_access_key`` extras (or the api key as
the secret), else boto3's default credential chain; ``host`` (or extra
``bedrock_endpoint_url``) overrides the Bedrock endpoint (the emulator); extras ``region_name``,
``role_arn`` (the service role Bedrock assumes; required to submit), ``s3_uri`` (input staging
prefix, or ``input_bucket`` + ``input_prefix``; required to stage), ``output_s3_uri`` (default
``<s3_uri>/output``), ``s3_endpoint_url``, ``bedrock_runtime_endpoint_url`` (default: the
Bedrock endpoint override), ``aws_session_token``, ``timeout_hours`` (24 to 168, default 24),
``min_records``, ``max_retries``, ``prompt_caching`` (Claude: mark the system block with
``cache_control``, default true; the old name ``cache_system_prompt`` is read with a deprecation
warning), ``json_output`` and ``default_max_tokens`` (Claude, as for Anthropic), ``model_id``.

The model id is needed when the job is created (``modelId``), but an Anthropic ``modelInput``
does not carry it: :meth:`submit` takes it from ``metadata["model"]`` (the job's model, passed by
the submit operator), else from the ``model_id`` extra.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import tempfile
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import IO, Any, ClassVar, Final, Literal

from airflow_batch_provider.adapters.base import (
    AdapterSettings,
    AmbiguousReply,
    AsyncRealtimeClient,
    AsyncStatusClient,
    BatchAdapter,
    BatchRef,
    BatchStatus,
    CreateFailure,
    InputRef,
    Limits,
    RealtimeReply,
    create_once,
    http_failure,
    parse_jsonl_results,
    unsupported_reply,
)
from airflow_batch_provider.adapters.bedrock_clients import _bedrock_endpoint, _runtime_endpoint, _split_s3
from airflow_batch_provider.adapters.bedrock_clients import aio_client as aio_client
from airflow_batch_provider.adapters.bedrock_clients import boto_client as boto_client
from airflow_batch_provider.adapters.bedrock_results import STATES as STATES
from airflow_batch_provider.adapters.bedrock_results import _is_manifest, _line_result, _status
from airflow_batch_provider.adapters.bedrock_results import error_result as error_result
from airflow_batch_provider.adapters.bedrock_results import model_family as model_family
from airflow_batch_provider.adapters.bedrock_results import output_result as output_result
from airflow_batch_provider.adapters.claude import (
    BEDROCK_ANTHROPIC_VERSION,
    claude_body,
)
from airflow_batch_provider.adapters.declaration import ProviderDeclaration
from airflow_batch_provider.adapters.registry import classify_outcome
from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.core.ratelimit import parse_retry_after
from airflow_batch_provider.core.requests import CanonicalRequest, RequestKind
from airflow_batch_provider.core.results import ItemResult, MalformedLine
from airflow_batch_provider.exceptions import ConfigurationError, SubmitError

MIN_RECORDS: Final = 100
MAX_RECORDS: Final = 50_000
MAX_FILE_BYTES: Final = 1_000_000_000
ANTHROPIC_VERSION: Final = BEDROCK_ANTHROPIC_VERSION
DEFAULT_MAX_TOKENS: Final = 1024
RECORDS_METADATA: Final = "abp-records"

_JOB_NAME_BAD: Final = re.compile(r"[^a-zA-Z0-9+.-]")
_TOKEN: Final = re.compile(r"^[a-zA-Z0-9]{1,256}(-*[a-zA-Z0-9]){0,256}$")


def job_name(key: str) -> str:
    """Return the Bedrock job name of an idempotency key (at most 63 of ``[a-zA-Z0-9+.-]``).

    :param key: the idempotency key
    """
    name = _JOB_NAME_BAD.sub("-", key).lstrip("-+.")
    if name and name == key and len(name) <= 63:
        return name
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    head = name[: 63 - len(digest) - 1].rstrip("-+.")
    return f"{head}-{digest}" if head else f"abp{digest}"


def request_token(key: str) -> str:
    """Return the ``clientRequestToken`` of an idempotency key.

    :param key: the idempotency key
    """
    if _TOKEN.match(key) and len(key) <= 256:
        return key
    return "abp" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def job_id(batch_id: str) -> str:
    """Return the 12-character job id of a job ARN (or of an id).

    :param batch_id: the job ARN
    """
    return batch_id.rsplit("/", 1)[-1]


def _classify(exc: Exception) -> CreateFailure | None:
    """Read a failed create: throttling refused, 5xx/timeout/connection ambiguous, other 4xx raised."""
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, ClientError):
        meta = exc.response.get("ResponseMetadata") or {}
        code = (exc.response.get("Error") or {}).get("Code")
        status = (
            429 if code in ("ThrottlingException", "TooManyRequestsException") else meta.get("HTTPStatusCode")
        )
        return http_failure(int(status) if status else None, meta.get("HTTPHeaders"))
    if isinstance(exc, (HTTPClientError, BotoConnectionError)):
        return http_failure(None)
    return None


class _AsyncBedrockStatus(AsyncStatusClient):
    """GetModelInvocationJob through aiobotocore's native async client."""

    def __init__(self, settings: AdapterSettings) -> None:
        self._settings = settings
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None

    async def _get(self) -> Any:
        if self._client is None:
            from aiobotocore.config import AioConfig

            self._client = await aio_client(
                self._stack,
                self._settings,
                "bedrock",
                _bedrock_endpoint(self._settings),
                AioConfig(retries={"max_attempts": 1, "mode": "standard"}),
            )
        return self._client

    async def status(self, ref: BatchRef) -> BatchStatus:
        client = await self._get()
        return _status(await client.get_model_invocation_job(jobIdentifier=ref.batch_id))

    async def close(self) -> None:
        await self._stack.aclose()
        self._client = None


class _AsyncBedrockRealtime(AsyncRealtimeClient):
    """InvokeModel through aiobotocore's ``bedrock-runtime`` client; SDK retries off."""

    def __init__(self, adapter: BedrockBatchAdapter) -> None:
        self._adapter = adapter
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None

    async def _get(self) -> Any:
        if self._client is None:
            from aiobotocore.config import AioConfig

            settings = self._adapter.settings
            self._client = await aio_client(
                self._stack,
                settings,
                "bedrock-runtime",
                _runtime_endpoint(settings),
                AioConfig(
                    retries={"max_attempts": 1, "mode": "standard"},
                    read_timeout=float(settings.extra.get("timeout", 120.0)),
                ),
            )
        return self._client

    async def complete(self, request: CanonicalRequest, custom_id: str) -> RealtimeReply:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            body = self._adapter.model_input(request)
        except ConfigurationError as exc:
            return unsupported_reply(custom_id, exc)
        try:
            client = await self._get()
            response = await client.invoke_model(
                modelId=request.model,
                body=json.dumps(body).encode("utf-8"),
                contentType="application/json",
                accept="application/json",
            )
            async with response["body"] as stream:
                payload = json.loads(await stream.read())
        except ClientError as exc:
            err = exc.response.get("Error", {})
            meta = exc.response.get("ResponseMetadata", {})
            headers = {str(k).lower(): str(v) for k, v in (meta.get("HTTPHeaders") or {}).items()}
            code = str(err.get("Code") or meta.get("HTTPStatusCode") or "error")
            status = meta.get("HTTPStatusCode")
            outcome = classify_outcome(int(status) if status else None, code)
            result = ItemResult(custom_id, outcome, error_code=code, error_message=err.get("Message"))
            return RealtimeReply(result, retry_after=parse_retry_after(headers))
        except (BotoCoreError, OSError, ValueError) as exc:
            return RealtimeReply(
                ItemResult(
                    custom_id, "failed_retryable", error_code=type(exc).__name__, error_message=str(exc)
                )
            )
        try:
            return RealtimeReply(output_result(custom_id, payload))
        except (ValueError, AttributeError, TypeError) as exc:
            return RealtimeReply(
                ItemResult(
                    custom_id, "failed_retryable", error_code="malformed_output", error_message=str(exc)
                )
            )

    async def close(self) -> None:
        await self._stack.aclose()
        self._client = None


class BedrockBatchAdapter(BatchAdapter):
    """Amazon Bedrock batch inference; see the module docstring for the connection and the limits."""

    declaration: ClassVar[ProviderDeclaration] = ProviderDeclaration(
        name="bedrock",
        conn_type="bedrock_batch",
        limits=Limits(max_requests=MAX_RECORDS, max_bytes=MAX_FILE_BYTES, min_requests=MIN_RECORDS),
        retryable_errors=frozenset(
            {
                "ThrottlingException",
                "TooManyRequestsException",
                "InternalServerException",
                "ServiceUnavailableException",
                "ModelTimeoutException",
                "ModelNotReadyException",
                "ModelErrorException",
            }
        ),
        compare_model="amazon.nova-lite",
    )
    result_id_field: ClassVar[str] = "recordId"
    kinds: ClassVar[frozenset[RequestKind]] = frozenset({"chat", "embedding"})

    def __init__(self, settings: AdapterSettings) -> None:
        super().__init__(settings)
        self._bedrock: Any = None
        self._creator: Any = None
        self._s3: Any = None

    # -- clients and settings ------------------------------------------------------------------

    def _config(self, attempts: int | None = None) -> Any:
        from botocore.config import Config

        extra = self.settings.extra
        tries = attempts if attempts is not None else int(extra.get("max_retries", 3)) + 1
        timeout = float(extra.get("timeout", 60.0))
        return Config(
            retries={"max_attempts": tries, "mode": "standard"}, read_timeout=timeout, connect_timeout=timeout
        )

    @property
    def _create_bedrock(self) -> Any:
        """The ``bedrock`` client for creates: botocore's retries off (see :func:`create_once`)."""
        if self._creator is None:
            self._creator = boto_client(
                self.settings, "bedrock", _bedrock_endpoint(self.settings), self._config(attempts=1)
            )
        return self._creator

    @property
    def bedrock(self) -> Any:
        """The blocking ``bedrock`` control-plane client, built on first use."""
        if self._bedrock is None:
            self._bedrock = boto_client(
                self.settings, "bedrock", _bedrock_endpoint(self.settings), self._config()
            )
        return self._bedrock

    @property
    def s3(self) -> Any:
        """The blocking S3 client (endpoint from the ``s3_endpoint_url`` extra), built on first use."""
        if self._s3 is None:
            self._s3 = boto_client(
                self.settings, "s3", self.settings.extra.get("s3_endpoint_url") or None, self._config()
            )
        return self._s3

    def probe(self) -> str:
        """List one model invocation job and, when an input prefix is set, check its bucket."""
        jobs = self._create_bedrock.list_model_invocation_jobs(maxResults=1)
        found = len(jobs.get("invocationJobSummaries") or [])
        detail = f"Bedrock listed {found} job(s) on the first page"
        if self.settings.extra.get("s3_uri") or self.settings.extra.get("input_bucket"):
            bucket = self.input_uri[len("s3://") :].split("/", 1)[0]
            self.s3.head_bucket(Bucket=bucket)
            detail += f"; bucket {bucket} is reachable"
        return detail

    @property
    def min_records(self) -> int:
        """Fewest records a job may hold (extra ``min_records``, default 100)."""
        return int(self.settings.extra.get("min_records", self.limits.min_requests))

    @property
    def input_uri(self) -> str:
        """Where chunks are staged: ``s3://bucket/prefix`` without a trailing slash."""
        extra = self.settings.extra
        uri = extra.get("s3_uri")
        if not uri and extra.get("input_bucket"):
            uri = f"s3://{extra['input_bucket']}/{str(extra.get('input_prefix') or '').strip('/')}"
        if not uri:
            raise ConfigurationError(
                "the Bedrock connection has no staging location; set the extra s3_uri to an S3 prefix the "
                'Bedrock service role can read, e.g. {"s3_uri": "s3://my-bucket/llm-batch/input"}.'
            )
        return str(uri).rstrip("/")

    @property
    def output_uri(self) -> str:
        """Where Bedrock writes outputs (extra ``output_s3_uri``, default ``<s3_uri>/output``)."""
        uri = self.settings.extra.get("output_s3_uri")
        return str(uri).rstrip("/") if uri else f"{self.input_uri}/output"

    @property
    def role_arn(self) -> str:
        """The service role Bedrock assumes (extra ``role_arn``)."""
        role = self.settings.extra.get("role_arn")
        if not role:
            raise ConfigurationError(
                "the Bedrock connection has no role_arn; set the extra role_arn to the service role that "
                "Bedrock assumes to read the input and write the output (arn:aws:iam::<account>:role/<name>)."
            )
        return str(role)

    # -- formatting ----------------------------------------------------------------------------

    def model_input(self, request: CanonicalRequest) -> dict[str, Any]:
        """Return the model's native ``InvokeModel`` body for a canonical request.

        :param request: the canonical request
        :raises ConfigurationError: the model is not one of the families this adapter formats
        """
        self.check_kind(request)
        family = model_family(request.model)
        params = dict(request.params)
        if request.kind == "embedding" or family == "titan-embed":
            if family != "titan-embed":
                raise ConfigurationError(
                    f"model {request.model!r} is not a Bedrock embedding model this adapter formats; use "
                    "amazon.titan-embed-text-v2:0 (or another amazon.titan-embed-* model)."
                )
            body: dict[str, Any] = {"inputText": request.text}
            if "dimensions" in params:
                body["dimensions"] = params["dimensions"]
            if "normalize" in params:
                body["normalize"] = params["normalize"]
            return body
        max_tokens = int(
            params.get("max_tokens") or params.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
        )
        stop = params.get("stop_sequences", params.get("stop"))
        if isinstance(stop, str):
            stop = [stop]
        if family == "anthropic":
            return claude_body(request, self.settings.extra, "bedrock")
        if family == "nova":
            inference: dict[str, Any] = {"maxTokens": max_tokens}
            for ours, theirs in (("temperature", "temperature"), ("top_p", "topP"), ("top_k", "topK")):
                if ours in params:
                    inference[theirs] = params[ours]
            if stop:
                inference["stopSequences"] = list(stop)
            body = {"schemaVersion": "messages-v1"}
            if request.system:
                body["system"] = [{"text": request.system}]
            body["messages"] = [
                {"role": m.get("role", "user"), "content": [{"text": str(m.get("content", ""))}]}
                for m in request.messages
            ]
            body["inferenceConfig"] = inference
            return body
        raise ConfigurationError(
            f"model {request.model!r} is not a Bedrock model family this adapter formats; use an "
            "anthropic.* (Claude), amazon.nova-* or amazon.titan-embed-* model id."
        )

    def format_line(self, request: CanonicalRequest, custom_id: str) -> bytes:
        line = {"recordId": custom_id, "modelInput": self.model_input(request)}
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    # -- lifecycle -----------------------------------------------------------------------------

    def stage(self, chunk: IO[bytes], name: str, size: int) -> InputRef:
        from botocore.exceptions import ClientError

        bucket, prefix = _split_s3(self.input_uri)
        key = f"{prefix}/{name}" if prefix else name
        uri = f"s3://{bucket}/{key}"
        try:
            head = self.s3.head_object(Bucket=bucket, Key=key)
            if int(head["ContentLength"]) == size:
                return InputRef("uri", uri)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
        with tempfile.SpooledTemporaryFile(max_size=64 * 1024 * 1024) as spool:
            records = 0
            last = b""
            while block := chunk.read(1 << 20):
                records += block.count(b"\n")
                last = block[-1:]
                spool.write(block)
            if size and last != b"\n":
                records += 1
            spool.seek(0)
            self.s3.upload_fileobj(
                spool,
                bucket,
                key,
                ExtraArgs={"ContentType": "application/jsonl", "Metadata": {RECORDS_METADATA: str(records)}},
            )
        return InputRef("uri", uri)

    def _records(self, uri: str) -> int | None:
        """Return the record count of a staged object (from its metadata, else by counting lines)."""
        from botocore.exceptions import ClientError

        bucket, key = _split_s3(uri)
        try:
            head = self.s3.head_object(Bucket=bucket, Key=key)
        except ClientError:
            return None
        meta = head.get("Metadata") or {}
        if RECORDS_METADATA in meta:
            return int(meta[RECORDS_METADATA])
        body = self.s3.get_object(Bucket=bucket, Key=key)["Body"]
        return sum(1 for line in body.iter_lines() if line.strip())

    def submit(
        self,
        input_ref: InputRef,
        key: str,
        metadata: Mapping[str, str],
        kind: RequestKind = "chat",
        *,
        created_after: datetime | None = None,
    ) -> BatchRef:
        found = self.find(key)
        if found is not None:
            return found
        if input_ref.kind != "uri" or not input_ref.value.startswith("s3://"):
            raise SubmitError(
                f"Bedrock reads its input from S3; got {input_ref.kind} {input_ref.value!r}. Stage the chunk "
                "with this adapter's stage() first."
            )
        records = self._records(input_ref.value)
        if records is not None and records < self.min_records:
            raise SubmitError(
                f"chunk {input_ref.value} holds {records} records, below Bedrock's minimum of "
                f"{self.min_records} records per batch job, so no job was created (nothing is padded). "
                f"Merge: set ChunkOptions(max_requests=...) to at least {self.min_records} so chunks stay large; "
                "or send this workload through the synchronous path (the sync fallback) when runs are "
                "this small; or, if your account's quota is lower, set the connection extra min_records."
            )
        model = str(metadata.get("model") or self.settings.extra.get("model_id") or "")
        if not model:
            raise SubmitError(
                f"job {key}: Bedrock needs the model id when the job is created and none was given; pass it "
                "in the submit metadata as 'model', or set the connection extra model_id."
            )
        request: dict[str, Any] = {
            "jobName": job_name(key),
            "roleArn": self.role_arn,
            "modelId": model,
            "clientRequestToken": request_token(key),
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": input_ref.value, "s3InputFormat": "JSONL"}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": self.output_uri + "/"}},
            "timeoutDurationInHours": int(self.settings.extra.get("timeout_hours", 24)),
        }
        tags = [
            {"key": k[:128], "value": str(v)[:256]}
            for k, v in metadata.items()
            if k != "model" and re.fullmatch(r"[a-zA-Z0-9\s._:/=+@-]*", str(v)[:256])
        ][:50]
        if tags:
            request["tags"] = tags
        del kind

        def create() -> BatchRef:
            response = self._create_bedrock.create_model_invocation_job(**request)
            arn = response.get("jobArn")
            if not arn:
                raise AmbiguousReply(f"Bedrock answered the create of job {key} without a jobArn")
            return BatchRef(self.name, str(arn), key)

        started = utcnow()
        return create_once(
            key=key,
            what="model invocation job create",
            create=create,
            lookup=lambda: self.find(key),
            classify=_classify,
            policy=self.create_policy(),
            created_after=created_after or started,
            request_count=records or 0,
        )

    def find(self, key: str, *, created_after: datetime | None = None) -> BatchRef | None:
        del created_after  # the name filter keeps the scan short; the job name is exact
        name = job_name(key)
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"nameContains": name, "maxResults": 100}
            if token:
                kwargs["nextToken"] = token
            page = self.bedrock.list_model_invocation_jobs(**kwargs)
            for job in page.get("invocationJobSummaries") or []:
                if job.get("jobName") == name:
                    return BatchRef(self.name, str(job["jobArn"]), key)
            token = page.get("nextToken")
            if not token:
                return None

    def status(self, ref: BatchRef) -> BatchStatus:
        return _status(self.bedrock.get_model_invocation_job(jobIdentifier=ref.batch_id))

    def async_client(self) -> AsyncStatusClient:
        return _AsyncBedrockStatus(self.settings)

    def realtime_client(self) -> AsyncRealtimeClient:
        return _AsyncBedrockRealtime(self)

    def _output_folder(self, ref: BatchRef) -> tuple[str, str]:
        job = self.bedrock.get_model_invocation_job(jobIdentifier=ref.batch_id)
        uri = job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"]
        bucket, prefix = _split_s3(uri)
        return bucket, "/".join(p for p in (prefix, job_id(ref.batch_id)) if p) + "/"

    def download(self, ref: BatchRef, kind: Literal["output", "errors"], sink: IO[bytes]) -> int:
        if kind == "errors":
            return 0  # Bedrock writes error lines into the same .out file as the outputs
        bucket, folder = self._output_folder(ref)
        keys: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=folder):
            keys.extend(
                obj["Key"]
                for obj in page.get("Contents", [])
                if obj["Key"].endswith(".out") and not obj["Key"].endswith("manifest.json.out")
            )
        written = 0
        for key in sorted(keys):
            body = self.s3.get_object(Bucket=bucket, Key=key)["Body"]
            ended = True
            for piece in body.iter_chunks(chunk_size=1 << 20):
                sink.write(piece)
                written += len(piece)
                ended = piece.endswith(b"\n")
            if not ended:
                sink.write(b"\n")
                written += 1
        return written

    def manifest(self, ref: BatchRef) -> dict[str, Any] | None:
        """Return the job's ``manifest.json.out`` (record and token counts), or ``None`` if not written.

        :param ref: the job
        """
        from botocore.exceptions import ClientError

        bucket, folder = self._output_folder(ref)
        try:
            body = self.s3.get_object(Bucket=bucket, Key=folder + "manifest.json.out")["Body"].read()
        except ClientError:
            return None
        data = json.loads(body)
        return dict(data) if isinstance(data, Mapping) else None

    @classmethod
    def is_result_line(cls, line: Mapping[str, Any]) -> bool:
        return not _is_manifest(line)

    def parse_results(self, lines: IO[bytes]) -> Iterator[ItemResult | MalformedLine]:
        # a manifest.json.out read through the same stream is not a result line
        return parse_jsonl_results(lines, self.result_id_field, _line_result, skip=_is_manifest)

    def cancel(self, ref: BatchRef) -> None:
        from botocore.exceptions import ClientError

        try:
            self.bedrock.stop_model_invocation_job(jobIdentifier=ref.batch_id)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("ValidationException", "ConflictException") and self.status(ref).terminal:
                return  # it ended before the stop arrived: completed work stays downloadable
            raise
