"""Amazon Bedrock batch inference control plane and ``InvokeModel``, reading and writing S3.

Routes (REST paths and JSON shapes from botocore's ``bedrock`` 2023-04-20 and
``bedrock-runtime`` 2023-09-30 service models, so that real boto3 and aiobotocore clients parse
every answer):

- ``POST /model-invocation-job`` (CreateModelInvocationJob): validates the arguments
  (``ValidationException``), reads the input JSONL from S3 (one ``.jsonl`` object, or every
  ``.jsonl`` object under a prefix) and answers ``{"jobArn"}``. A second create with the same
  ``clientRequestToken`` answers the first job's ARN and creates nothing, as AWS does.
- ``GET /model-invocation-job/{jobIdentifier}`` (GetModelInvocationJob; ARN or 12-character id)
- ``GET /model-invocation-jobs`` (ListModelInvocationJobs: ``statusEquals``, ``nameContains``,
  ``submitTimeAfter``/``Before``, ``sortOrder``, ``maxResults``, ``nextToken``)
- ``POST /model-invocation-job/{jobIdentifier}/stop`` (StopModelInvocationJob)
- ``POST /model/{modelId}/invoke`` (bedrock-runtime InvokeModel, synchronous)

Status words over the shared lifecycle: ``validating`` is reported as ``Submitted``, then
``Validating``, then ``Scheduled`` (thirds of the phase); ``in_progress`` and ``finalizing`` as
``InProgress``; ``completed`` as ``Completed``; a job that fails validation as ``Failed`` with a
``message``; an expiring job as ``PartiallyCompleted`` when it finished some records (its timeout
passed mid-way) and ``Expired`` when it finished none; a stop as ``Stopping`` then ``Stopped``.

Outputs are written to S3 once, when a job is first seen terminal, under
``<outputDataConfig.s3Uri>/<job id>/``: one ``<input file name>.out`` per input file, with lines
``{"recordId", "modelInput", "modelOutput"}`` or ``{"recordId", "modelInput", "error":
{"errorCode", "errorMessage"}}`` in processing order, and ``manifest.json.out`` with
``totalRecordCount``, ``processedRecordCount``, ``successRecordCount``, ``errorRecordCount``,
``inputTokenCount`` and ``outputTokenCount``. Records a stopped or expired job never ran are in
no file. A failed job writes nothing.

The model families understood in ``modelInput``, their request checks and answers, are in
:mod:`batch_emulator.bedrock_bodies`.

Faults, in Bedrock's shapes: item faults become error lines with ``errorCode`` 500 / 429 / 400
(``rate_500`` / ``rate_429`` / ``rate_400`` / ``rate_context_length``), ``rate_missing`` drops
the line, ``rate_duplicate`` / ``rate_malformed`` damage it; ``expire_*`` gives
``PartiallyCompleted`` / ``Expired``; ``fail_validation`` gives ``Failed``; ``retrieve_5xx_rate``
answers GetModelInvocationJob with ``InternalServerException``; ``sync_429_rate``,
``sync_500_rate`` and the rpm/tpm limiter answer InvokeModel with ``ThrottlingException`` (plus a
``Retry-After`` header, an emulator convenience: AWS sends none) or ``InternalServerException``.

S3 is reached through boto3 (imported lazily, here only) at :attr:`EmulatorConfig.s3_endpoint`.
The minimum of :data:`MIN_RECORDS` records per job is enforced as AWS does: the job fails
validation.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from array import array
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Any, Final
from urllib.parse import unquote

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from batch_emulator.app import CUSTOM_ID_HEADER, ApiError, guard_create
from batch_emulator.bedrock_bodies import (
    INJECTED_ERRORS,
    PROVIDER,
    Prompt,
    cache_for,
    invoke_billed,
    model_family,
    model_output,
    request_error,
)
from batch_emulator.common import (
    InputScan,
    InputWords,
    ResultWriter,
    injected_error,
    retrieve_fails,
)
from batch_emulator.config import EmulatorConfig
from batch_emulator.faults import retry_after_header
from batch_emulator.lifecycle import ItemLog, Job, JobItem, JobView, ValidationIssue
from batch_emulator.store import EmulatorState

ACCOUNT: Final = "123456789012"
DEFAULT_REGION: Final = "us-east-1"
#: Bedrock's default quota "Minimum number of records per batch inference job".
MIN_RECORDS: Final = 100
#: Bedrock's default quota "Records per input file per batch inference job".
MAX_RECORDS_PER_FILE: Final = 50_000
#: Bedrock's default quota "Batch inference input file size" (1 GB).
MAX_FILE_BYTES: Final = 1_000_000_000
STATUSES: Final = (
    "Submitted",
    "InProgress",
    "Completed",
    "Failed",
    "Stopping",
    "Stopped",
    "PartiallyCompleted",
    "Expired",
    "Validating",
    "Scheduled",
)
TERMINAL_STATUSES: Final = frozenset({"Completed", "Failed", "Stopped", "PartiallyCompleted", "Expired"})

_JOB_NAME: Final = re.compile(r"^[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}$")
_TOKEN: Final = re.compile(r"^[a-zA-Z0-9]{1,256}(-*[a-zA-Z0-9]){0,256}$")
_ROLE: Final = re.compile(r"^arn:aws(-[^:]+)?:iam::([0-9]{12})?:role/.+$")
_S3_URI: Final = re.compile(
    r"^s3://[a-z0-9][-.a-z0-9]{1,61}[a-z0-9](?:/[-!_*'().a-z0-9A-Z]+(?:/[-!_*'().a-z0-9A-Z]+)*)?/?$"
)
_JOB_ID: Final = re.compile(
    r"^(arn:aws(-[^:]+)?:bedrock:(?P<region>[a-z0-9-]{1,20}):[0-9]{12}:model-invocation-job/)?(?P<id>[a-z0-9]{12})$"
)
_CREDENTIAL_REGION: Final = re.compile(r"Credential=[^/]+/\d{8}/(?P<region>[a-z0-9-]+)/")


def _error(status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> ApiError:
    """Return a rest-json error: the code in ``x-amzn-ErrorType`` and ``__type``, the message in the body."""
    return ApiError(
        status, {"__type": code, "message": message}, {"x-amzn-ErrorType": code, **(headers or {})}
    )


def _iso(ts: float) -> str:
    return (
        datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def _parse_iso(value: str) -> float:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        try:
            return float(value)
        except ValueError as exc:
            raise _error(400, "ValidationException", f"Invalid timestamp {value!r}.") from exc


def _refuse(status: int, headers: Mapping[str, str]) -> ApiError:
    """The answer of a create refused by an injected fault, before anything was created."""
    if status == 429:
        return _error(429, "ThrottlingException", "Too many requests (emulated create fault).", headers)
    return _error(
        status, "InternalServerException", "Internal server error (emulated create fault).", headers
    )


def _split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


INPUT_WORDS: Final = InputWords(
    too_many="Input file {name} has more than {limit} records, the quota per file.",
    bad_json="Line {number} of {name} is not valid JSON.",
    too_many_code="too_many_records",
    bad_json_code="invalid_json",
)


def build_router(state: EmulatorState) -> APIRouter:
    """Return the Bedrock router bound to the emulator state.

    :param state: the shared state
    """
    api = BedrockEmulator(state)
    state.finalizers[PROVIDER] = api.job_json
    router = APIRouter()
    router.add_api_route("/model-invocation-job", api.create_job, methods=["POST"])
    router.add_api_route("/model-invocation-jobs", api.list_jobs, methods=["GET"])
    router.add_api_route("/model-invocation-job/{identifier:path}/stop", api.stop_job, methods=["POST"])
    router.add_api_route("/model-invocation-job/{identifier:path}", api.get_job, methods=["GET"])
    router.add_api_route("/model/{model_id:path}/invoke", api.invoke_model, methods=["POST"])
    return router


class BedrockEmulator:
    """The Bedrock handlers, bound to the shared state.

    :param state: the shared state
    """

    def __init__(self, state: EmulatorState) -> None:
        self.state = state
        self._write_lock = threading.Lock()
        self._s3_client: Any = None
        self._s3_endpoint: str | None = None

    # -- S3 ------------------------------------------------------------------------------------

    def s3(self) -> Any:
        """The boto3 S3 client for the configured endpoint (dummy credentials when none are set)."""
        endpoint = self.state.config.s3_endpoint
        if self._s3_client is None or endpoint != self._s3_endpoint:
            import boto3

            session = boto3.session.Session()
            creds: dict[str, str] = {}
            if session.get_credentials() is None:
                creds = {"aws_access_key_id": "emulator", "aws_secret_access_key": "emulator"}
            self._s3_client = session.client(
                "s3",
                endpoint_url=endpoint,
                region_name=os.environ.get("AWS_DEFAULT_REGION", DEFAULT_REGION),
                **creds,
            )
            self._s3_endpoint = endpoint
        return self._s3_client

    def _input_objects(self, uri: str) -> list[tuple[str, str, int]]:
        """Return ``(bucket, key, size)`` of the input JSONL objects at an S3 URI."""
        client = self.s3()
        bucket, key = _split_s3(uri)
        if key.endswith(".jsonl"):
            head = client.head_object(Bucket=bucket, Key=key)
            return [(bucket, key, int(head["ContentLength"]))]
        prefix = key if not key or key.endswith("/") else key + "/"
        found: list[tuple[str, str, int]] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                if obj["Key"].endswith(".jsonl"):
                    found.append((bucket, obj["Key"], int(obj["Size"])))
        return found

    def _read_input(
        self, uri: str, model_id: str, config: EmulatorConfig
    ) -> tuple[ItemLog | list[JobItem], list[ValidationIssue], list[str], array[int]]:
        """Read and check the input; return items, issues, input file names and each item's file."""
        from botocore.exceptions import BotoCoreError, ClientError

        issues: list[ValidationIssue] = []
        items = self.state.item_log()
        names: list[str] = []
        item_file = array("I")
        family = model_family(model_id)
        try:
            objects = self._input_objects(uri)
        except (ClientError, BotoCoreError) as exc:
            return (
                [],
                [ValidationIssue("input_unreadable", f"Unable to read the input at {uri}: {exc}")],
                [],
                array("I"),
            )
        if not objects:
            return (
                [],
                [ValidationIssue("empty_input", f"No .jsonl input file found at {uri}.")],
                [],
                array("I"),
            )
        client = self.s3()
        faults = config.faults
        for file_index, (bucket, key, size) in enumerate(objects):
            name = key.rsplit("/", 1)[-1]
            names.append(name)
            if size > MAX_FILE_BYTES:
                issues.append(
                    ValidationIssue(
                        "file_too_large",
                        f"Input file {name} is {size} bytes, above the {MAX_FILE_BYTES} byte quota per file.",
                    )
                )
                continue
            body = client.get_object(Bucket=bucket, Key=key)["Body"]
            scan = InputScan(INPUT_WORDS, issues, MAX_RECORDS_PER_FILE, name=name)
            for number, line in scan.lines(body.iter_lines()):
                if not isinstance(line, dict) or "modelInput" not in line:
                    issues.append(
                        ValidationIssue(
                            "invalid_record",
                            f"Line {number} of {name} has no modelInput.",
                            number,
                            "modelInput",
                        )
                    )
                    continue
                record_id = line.get("recordId")
                if not isinstance(record_id, str) or not record_id:
                    record_id = self.state.new_id("rec", 8).upper()
                items.append(
                    JobItem(
                        custom_id=record_id,
                        line=number,
                        body=line["modelInput"],
                        decision=faults.decide_item(config.seed, record_id),
                        natural_error=request_error(family, line["modelInput"], config),
                    )
                )
                item_file.append(file_index)
        if not issues and len(items) < MIN_RECORDS:
            issues.append(
                ValidationIssue(
                    "too_few_records",
                    f"Batch job contains less records ({len(items)}) than the required minimum of: {MIN_RECORDS}",
                )
            )
        return items, issues, names, item_file

    # -- control plane -------------------------------------------------------------------------

    @staticmethod
    def _region(request: Request) -> str:
        found = _CREDENTIAL_REGION.search(request.headers.get("authorization", ""))
        return found.group("region") if found else DEFAULT_REGION

    def _job(self, identifier: str) -> Job:
        raw = unquote(identifier)
        match = _JOB_ID.match(raw)
        if match is None:
            raise _error(
                400,
                "ValidationException",
                f"1 validation error detected: Value '{raw}' at 'jobIdentifier' failed to satisfy constraint: "
                "Member must satisfy regular expression pattern: ((arn:aws(-[^:]+)?:bedrock:[a-z0-9-]{1,20}:"
                "[0-9]{12}:model-invocation-job/)?[a-z0-9]{12})",
            )
        job = self.state.jobs.get(match.group("id"), PROVIDER)
        if job is None:
            raise _error(404, "ResourceNotFoundException", f"The specified job {raw} was not found.")
        return job

    async def create_job(self, request: Request) -> Response:
        """``POST /model-invocation-job`` (CreateModelInvocationJob), under the create faults."""
        answer: Response = await guard_create(
            self.state, PROVIDER, "create", lambda: self._create_job(request), _refuse
        )
        return answer

    async def _create_job(self, request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError as exc:
            raise _error(400, "SerializationException", f"Could not parse the request body: {exc}") from exc
        if not isinstance(body, dict):
            raise _error(400, "SerializationException", "The request body must be a JSON object.")
        for name in ("jobName", "roleArn", "modelId", "inputDataConfig", "outputDataConfig"):
            if name not in body:
                raise _error(
                    400, "ValidationException", f"1 validation error detected: '{name}' must not be null."
                )
        token = body.get("clientRequestToken")
        if token is not None and (not isinstance(token, str) or not _TOKEN.match(token)):
            raise _error(
                400, "ValidationException", "Value at 'clientRequestToken' failed to satisfy the pattern."
            )
        replay = self._replay(token)
        if replay is not None:
            return replay
        name = body["jobName"]
        if not isinstance(name, str) or not _JOB_NAME.match(name) or len(name) > 63:
            raise _error(
                400,
                "ValidationException",
                f"1 validation error detected: Value '{name}' at 'jobName' failed to satisfy constraint: Member must "
                "have length less than or equal to 63 and satisfy regular expression pattern: "
                "[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\\+\\-\\.]){0,63}",
            )
        if not isinstance(body["roleArn"], str) or not _ROLE.match(body["roleArn"]):
            raise _error(
                400, "ValidationException", f"Value '{body['roleArn']}' at 'roleArn' is not a role ARN."
            )
        model_id = body["modelId"]
        if not isinstance(model_id, str) or model_family(model_id) is None:
            raise _error(
                400,
                "ValidationException",
                f"The provided model identifier {model_id!r} is invalid or does not support batch inference "
                "(the emulator knows anthropic.*, amazon.nova-* and amazon.titan-embed-*).",
            )
        in_uri = ((body.get("inputDataConfig") or {}).get("s3InputDataConfig") or {}).get("s3Uri")
        out_uri = ((body.get("outputDataConfig") or {}).get("s3OutputDataConfig") or {}).get("s3Uri")
        for label, uri in (
            ("inputDataConfig.s3InputDataConfig.s3Uri", in_uri),
            ("outputDataConfig.s3OutputDataConfig.s3Uri", out_uri),
        ):
            if not isinstance(uri, str) or not _S3_URI.match(uri):
                raise _error(400, "ValidationException", f"Value {uri!r} at '{label}' is not a valid S3 URI.")
        hours = body.get("timeoutDurationInHours")
        if hours is not None and (not isinstance(hours, int) or not 24 <= hours <= 168):
            raise _error(
                400,
                "ValidationException",
                f"Value '{hours}' at 'timeoutDurationInHours' failed to satisfy constraint: Member must be between 24 and 168.",
            )
        state = self.state
        config = state.config
        forced_failure = state.consume_validation_failure()
        items, issues, names, item_file = await run_in_threadpool(
            self._read_input, str(in_uri), model_id, config
        )
        if forced_failure and not issues:
            issues = [
                ValidationIssue(
                    "emulated_validation_failure", "Input validation failed (emulator fault fail_validation)."
                )
            ]
        # Read again after the await above: a retry with the same token may have created the job
        # meanwhile (a client that timed out while this request read its input). From here to
        # create_job nothing awaits, so the check and the insert are one step, as at AWS.
        replay = self._replay(token)
        if replay is not None:
            return replay
        region = self._region(request)
        job_id = state.new_id("bj", 10)
        arn = f"arn:aws:bedrock:{region}:{ACCOUNT}:model-invocation-job/{job_id}"
        state.create_job(
            PROVIDER,
            job_id,
            items,
            issues,
            config,
            {
                "jobArn": arn,
                "jobName": name,
                "modelId": model_id,
                "roleArn": body["roleArn"],
                "clientRequestToken": token,
                "inputDataConfig": body["inputDataConfig"],
                "outputDataConfig": body["outputDataConfig"],
                "timeoutDurationInHours": hours or 168,
                "input_names": names,
                "item_file": item_file,
            },
        )
        return JSONResponse({"jobArn": arn})

    def _replay(self, token: str | None) -> JSONResponse | None:
        """The first job's ARN for a ``clientRequestToken`` seen before (creating nothing), else ``None``.

        :param token: the request's token (``None``: no idempotency asked)
        """
        if token is None:
            return None
        for existing in self.state.jobs.list(PROVIDER):
            if existing.attrs.get("clientRequestToken") == token:
                self.state.bump(PROVIDER, "idempotent_replays")
                return JSONResponse({"jobArn": existing.attrs["jobArn"]})
        return None

    def status_word(self, job: Job, view: JobView, now: float) -> str:
        """Return the Bedrock status of a job's lifecycle view.

        :param job: the job
        :param view: its view at ``now``
        :param now: the current time
        """
        status = view.status
        if status == "validating":
            third = (job.t_in_progress - job.created) / 3
            if now < job.created + third:
                return "Submitted"
            return "Validating" if now < job.created + 2 * third else "Scheduled"
        if status in ("in_progress", "finalizing"):
            return "InProgress"
        if status == "expired":
            return "PartiallyCompleted" if job.done_count(now) > 0 else "Expired"
        return {
            "completed": "Completed",
            "failed": "Failed",
            "cancelling": "Stopping",
            "cancelled": "Stopped",
        }[status]

    def job_json(self, job: Job, now: float) -> dict[str, Any]:
        """Return the GetModelInvocationJob body (also a list summary), writing outputs on first terminal sight.

        :param job: the job
        :param now: the current time
        """
        with self.state.lock:
            view = job.view(now)
        word = self.status_word(job, view, now)
        if view.terminal and job.results is None:
            with self._write_lock:
                if job.results is None:
                    job.results = self._write_outputs(job, now, word)
        attrs = job.attrs
        data: dict[str, Any] = {
            "jobArn": attrs["jobArn"],
            "jobName": attrs["jobName"],
            "modelId": attrs["modelId"],
            "roleArn": attrs["roleArn"],
            "status": word,
            "submitTime": _iso(job.created),
            "lastModifiedTime": _iso(max([job.created, *view.times.values()])),
            "inputDataConfig": attrs["inputDataConfig"],
            "outputDataConfig": attrs["outputDataConfig"],
            "timeoutDurationInHours": attrs["timeoutDurationInHours"],
            "jobExpirationTime": _iso(job.created + attrs["timeoutDurationInHours"] * 3600),
            "totalRecordCount": view.total,
            "processedRecordCount": view.completed + view.failed,
            "successRecordCount": view.completed,
            "errorRecordCount": view.failed,
        }
        if attrs.get("clientRequestToken"):
            data["clientRequestToken"] = attrs["clientRequestToken"]
        if view.terminal:
            data["endTime"] = _iso(max([job.created, *view.times.values()]))
        if word == "Failed":
            data["message"] = "; ".join(i.message for i in job.issues[:5])
        elif word == "PartiallyCompleted":
            data["message"] = (
                "The job timed out before all records were processed; the processed records are in the output."
            )
        elif word == "Expired":
            data["message"] = "The job timed out before it started processing records."
        return data

    def _write_outputs(self, job: Job, now: float, word: str) -> dict[str, Any]:
        """Render the ``.out`` files and the manifest of a job that just ended, and put them in S3.

        Each ``.out`` file is written a line at a time to the data directory, then streamed to S3.
        """
        if word == "Failed":
            return {"written": []}
        out_uri = job.attrs["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"]
        bucket, prefix = _split_s3(out_uri)
        folder = "/".join(p for p in (prefix.strip("/"), job.id) if p)
        names: list[str] = job.attrs["input_names"]
        file_of: Sequence[int] = job.attrs["item_file"]
        family = model_family(job.attrs["modelId"]) or "anthropic"
        seen: set[str] = set()
        counts = {"processed": 0, "success": 0, "error": 0, "input": 0, "output": 0}
        client = self.s3()
        written = []
        with ExitStack() as stack:
            spools = [
                stack.enter_context(tempfile.TemporaryFile(dir=self.state.files.directory)) for _ in names
            ]
            per_file = [ResultWriter(spool, "recordId") for spool in spools]
            for outcome in job.outcomes(now):
                if outcome.end != "processed":
                    continue
                item = outcome.item
                counts["processed"] += 1
                out = per_file[file_of[outcome.index]]
                error = item.natural_error or injected_error(item, INJECTED_ERRORS)
                if error is not None:
                    counts["error"] += 1
                    out.write(
                        {
                            "recordId": item.custom_id,
                            "modelInput": item.body,
                            "error": {"errorCode": error["status"], "errorMessage": error["message"]},
                        }
                    )
                    continue
                counts["success"] += 1
                prompt = Prompt(family, item.body)
                cache = cache_for(prompt, seen, job.config)
                output, used_in, used_out = model_output(
                    family,
                    job.attrs["modelId"],
                    item.body,
                    message_id=self.state.new_id("msg_bdrk_", 24),
                    cache=cache,
                )
                job.bill(item.custom_id, **invoke_billed(used_in, used_out, cache))
                counts["input"] += used_in
                counts["output"] += used_out
                if item.decision.fault == "missing":
                    continue
                out.write(
                    {"recordId": item.custom_id, "modelInput": item.body, "modelOutput": output},
                    item.decision,
                )
            if per_file:
                per_file[0].write_foreign(job.faults.unknown_result_lines, job.id)
            for name, spool in zip(names, spools, strict=True):
                key = f"{folder}/{name}.out"
                spool.seek(0)
                client.put_object(Bucket=bucket, Key=key, Body=spool)
                written.append(key)
        manifest = {
            "totalRecordCount": len(job.items),
            "processedRecordCount": counts["processed"],
            "successRecordCount": counts["success"],
            "errorRecordCount": counts["error"],
            "inputTokenCount": counts["input"],
            "outputTokenCount": counts["output"],
        }
        client.put_object(
            Bucket=bucket, Key=f"{folder}/manifest.json.out", Body=json.dumps(manifest).encode()
        )
        self.state.bump(PROVIDER, "outputs_written")
        return {"written": written, "manifest": manifest}

    def get_job(self, identifier: str) -> dict[str, Any]:
        """``GET /model-invocation-job/{jobIdentifier}``; may answer an injected transient 500."""
        state = self.state
        if retrieve_fails(state, PROVIDER):
            raise _error(
                500, "InternalServerException", "Internal server error (emulated fault retrieve_5xx_rate)."
            )
        return self.job_json(self._job(identifier), state.now())

    def list_jobs(self, request: Request) -> dict[str, Any]:
        """``GET /model-invocation-jobs`` (ListModelInvocationJobs), newest first by default."""
        q = request.query_params
        now = self.state.now()
        jobs = self.state.jobs.list(PROVIDER)
        if q.get("sortOrder") == "Ascending":
            jobs = jobs[::-1]
        status = q.get("statusEquals")
        if status is not None and status not in STATUSES:
            raise _error(
                400, "ValidationException", f"Value '{status}' at 'statusEquals' is not a job status."
            )
        name = q.get("nameContains")
        after = _parse_iso(q["submitTimeAfter"]) if q.get("submitTimeAfter") else None
        before = _parse_iso(q["submitTimeBefore"]) if q.get("submitTimeBefore") else None
        try:
            limit = int(q.get("maxResults", "1000"))
            start = int(q.get("nextToken", "0"))
        except ValueError as exc:
            raise _error(400, "ValidationException", f"Invalid maxResults or nextToken: {exc}") from exc
        if not 1 <= limit <= 1000:
            raise _error(400, "ValidationException", "Value at 'maxResults' must be between 1 and 1000.")
        selected = [
            j
            for j in jobs
            if (name is None or name in j.attrs["jobName"])
            and (after is None or j.created > after)
            and (before is None or j.created < before)
        ]
        summaries = [self.job_json(j, now) for j in selected]
        if status is not None:
            summaries = [s for s in summaries if s["status"] == status]
        page = summaries[start : start + limit]
        out: dict[str, Any] = {"invocationJobSummaries": page}
        if start + limit < len(summaries):
            out["nextToken"] = str(start + limit)
        return out

    def stop_job(self, identifier: str) -> dict[str, Any]:
        """``POST /model-invocation-job/{jobIdentifier}/stop`` (StopModelInvocationJob)."""
        job = self._job(identifier)
        now = self.state.now()
        with self.state.lock:
            view = job.view(now)
            word = self.status_word(job, view, now)
            if view.terminal or not job.request_cancel(now):
                raise _error(
                    400,
                    "ValidationException",
                    f"The job {job.attrs['jobArn']} is in status {word} and cannot be stopped.",
                )
        self.state.bump(PROVIDER, "batches_cancelled")
        return {}

    # -- runtime -------------------------------------------------------------------------------

    async def invoke_model(self, model_id: str, request: Request) -> Response:
        """``POST /model/{modelId}/invoke`` (bedrock-runtime InvokeModel)."""
        model_id = unquote(model_id)
        state = self.state
        request_id = state.new_id("bedrock-req-", 32)
        headers = {"x-amzn-RequestId": request_id}
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError as exc:
            raise _error(400, "ValidationException", f"Malformed input request: {exc}", headers) from exc
        family = model_family(model_id)
        problem = request_error(family, body, state.config)
        tokens = Prompt(family, body).input_tokens if family and isinstance(body, Mapping) else 0
        counter = state.bump(PROVIDER, "sync_requests")
        config = state.config
        faults = config.faults
        if faults.request_fails(config.seed, "sync429", counter, faults.sync_429_rate):
            state.bump(PROVIDER, "sync_429")
            wait = faults.sync_retry_after_s
            raise _error(
                429,
                "ThrottlingException",
                "Too many requests, please wait before trying again (emulated).",
                {**headers, "Retry-After": retry_after_header(wait)},
            )
        if faults.request_fails(config.seed, "sync500", counter, faults.sync_500_rate):
            state.bump(PROVIDER, "sync_500")
            raise _error(500, "InternalServerException", "Internal server error (emulated).", headers)
        window = config.scaled(config.timings.rate_window_s)
        with state.lock:
            decision = state.limiter.check(state.now(), tokens, faults.rpm_limit, faults.tpm_limit, window)
        if not decision.allowed:
            state.bump(PROVIDER, "sync_429")
            raise _error(
                429,
                "ThrottlingException",
                "Too many tokens or requests, please wait before trying again.",
                {**headers, "Retry-After": retry_after_header(decision.retry_after_s)},
            )
        if problem is not None or family is None:
            assert problem is not None
            raise _error(problem["status"], problem["code"], problem["message"], headers)
        prompt = Prompt(family, body)
        with state.lock:
            cache = cache_for(prompt, state.seen_prefixes, config)
        output, used_in, used_out = model_output(
            family, model_id, body, message_id=state.new_id("msg_bdrk_", 24), cache=cache
        )
        headers["X-Amzn-Bedrock-Input-Token-Count"] = str(used_in)
        headers["X-Amzn-Bedrock-Output-Token-Count"] = str(used_out)
        state.record_realtime(
            PROVIDER, request.headers.get(CUSTOM_ID_HEADER), invoke_billed(used_in, used_out, cache)
        )
        return JSONResponse(output, headers=headers)
