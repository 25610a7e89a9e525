"""Vertex AI batch prediction (``batchPredictionJobs``) with input and output in GCS.

Also the OAuth2 token endpoint that ``google-auth`` service-account credentials call, and the IAM
Credentials ``generateAccessToken`` method that impersonated credentials call.

The routes are the ones ``google-genai`` calls in Vertex mode when its ``base_url`` points at the
emulator: ``/{v1,v1beta1}/projects/{project}/locations/{location}/batchPredictionJobs[/{id}[:cancel]]``.
A job reads its JSONL input (``{"key", "request"}`` per line) from the ``gs://`` URIs of
``inputConfig.gcsSource`` and, once it ends, writes
``<outputUriPrefix>/prediction-model-<stamp>/predictions.jsonl`` there; GCS is reached over its
JSON API at :attr:`EmulatorConfig.gcs_endpoint` (a GCS server on loopback in tests). Lines are
validated, run and billed by the Gemini router's code (one model of Gemini for both).

Every Vertex call must carry ``Authorization: Bearer <token>`` with a token this emulator issued
at ``POST /token`` (what a service-account key whose ``token_uri`` names the emulator exchanges
its signed JWT for), or at ``POST /v1/projects/-/serviceAccounts/{email}:generateAccessToken``
(impersonation: the caller shows a token issued here; the counter
``vertex.impersonated.<delegates and target joined by '>'>`` counts each chain), so a test proves
that the credentials came from the connection.
"""

from __future__ import annotations

import secrets
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any, Final

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from batch_emulator.app import ApiError
from batch_emulator.common import settle
from batch_emulator.gemini_api import (
    BATCH_STATES,
    _fail,
    _json_body,
    _page_args,
    _rfc3339,
)
from batch_emulator.gemini_lines import parse_file, write_results
from batch_emulator.lifecycle import Job, ValidationIssue
from batch_emulator.store import CHUNK, EmulatorState, StoredFile

PROVIDER: Final = "vertex"
_JOBS: Final = "/{version}/projects/{project}/locations/{location}/batchPredictionJobs"


def _split_gs(uri: str) -> tuple[str, str]:
    if not uri.startswith("gs://"):
        raise _fail(400, f"{uri!r} is not a gs:// URI.", "INVALID_ARGUMENT")
    bucket, _, name = uri[len("gs://") :].partition("/")
    return bucket, name


class GcsClient:
    """The GCS JSON API over plain HTTP (no SDK in the emulator).

    :param endpoint: e.g. ``http://127.0.0.1:PORT``
    """

    def __init__(self, endpoint: str | None) -> None:
        self.endpoint = (endpoint or "https://storage.googleapis.com").rstrip("/")

    def read_into(self, uri: str, sink: Any) -> None:
        """Copy an object's bytes into ``sink`` a block at a time.

        :param uri: ``gs://bucket/name``
        :param sink: has ``write(bytes)``
        """
        bucket, name = _split_gs(uri)
        url = f"{self.endpoint}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media"
        with urllib.request.urlopen(url, timeout=30) as answer:
            while block := answer.read(CHUNK):
                sink.write(block)

    def write(self, uri: str, data: bytes | Iterable[bytes], size: int | None = None) -> None:
        """Create or replace an object.

        :param uri: ``gs://bucket/name``
        :param data: its bytes, or its blocks (then ``size`` is required)
        :param size: the byte count of ``data`` given as blocks
        """
        bucket, name = _split_gs(uri)
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        headers = {"Content-Type": "application/octet-stream"}
        if size is not None:
            headers["Content-Length"] = str(size)
        request = urllib.request.Request(
            f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?{query}",
            data=data,
            method="POST",
            headers=headers,
        )
        with urllib.request.urlopen(request, timeout=30):
            pass


def build_router(state: EmulatorState) -> APIRouter:
    """Return the Vertex router bound to the emulator state.

    :param state: the shared state
    """
    api = VertexEmulator(state)
    state.finalizers[PROVIDER] = api.job_json
    router = APIRouter()
    router.add_api_route("/token", api.token, methods=["POST"])
    router.add_api_route(
        "/v1/projects/{project}/serviceAccounts/{account}", api.impersonate, methods=["POST"]
    )
    router.add_api_route(_JOBS, api.create_job, methods=["POST"])
    router.add_api_route(_JOBS, api.list_jobs, methods=["GET"])
    router.add_api_route(_JOBS + "/{job_ref}", api.get_job, methods=["GET"])
    router.add_api_route(_JOBS + "/{job_ref}", api.job_action, methods=["POST"])
    return router


class VertexEmulator:
    """The endpoint handlers, bound to the shared state.

    :param state: the shared state
    """

    def __init__(self, state: EmulatorState) -> None:
        self.state = state
        self._tokens: set[str] = set()

    # -- auth ------------------------------------------------------------------------------

    async def token(self, request: Request) -> dict[str, Any]:
        """``POST /token``: exchange a service account's signed JWT (not verified) for a token."""
        form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
        if not form.get("assertion"):
            raise ApiError(400, {"error": "invalid_request", "error_description": "no assertion"})
        token = "abp-vertex-" + secrets.token_hex(12)
        self._tokens.add(token)
        self.state.bump(PROVIDER, "tokens_issued")
        return {"access_token": token, "expires_in": 3600, "token_type": "Bearer"}

    async def impersonate(self, project: str, account: str, request: Request) -> dict[str, Any]:
        """``POST /v1/projects/-/serviceAccounts/{email}:generateAccessToken`` for a caller holding a token."""
        self.check_auth(request)
        target, _, method = account.partition(":")
        if method != "generateAccessToken":
            raise _fail(
                404, f"Unknown method {method!r}; the emulator serves ':generateAccessToken'.", "NOT_FOUND"
            )
        body = await _json_body(request)
        if not body.get("scope"):
            raise _fail(400, "scope is required.")
        chain = [*(str(d) for d in body.get("delegates") or []), target]
        token = "abp-vertex-" + secrets.token_hex(12)
        self._tokens.add(token)
        self.state.bump(PROVIDER, "impersonated." + ">".join(chain))
        # google-auth compares the expiry with the wall clock, not the emulator's
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
        return {"accessToken": token, "expireTime": expires}

    def check_auth(self, request: Request) -> None:
        """Refuse a call without a bearer token this emulator issued."""
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if given not in self._tokens:
            raise _fail(
                401,
                "Request had invalid authentication credentials. Expected OAuth 2 access token.",
                "UNAUTHENTICATED",
            )

    # -- jobs ------------------------------------------------------------------------------

    @property
    def gcs(self) -> GcsClient:
        """The GCS client of the configured endpoint."""
        return GcsClient(self.state.config.gcs_endpoint)

    async def create_job(self, version: str, project: str, location: str, request: Request) -> dict[str, Any]:
        """``POST .../batchPredictionJobs``: read the input from GCS and start the job."""
        self.check_auth(request)
        body = await _json_body(request)
        uris = ((body.get("inputConfig") or {}).get("gcsSource") or {}).get("uris") or []
        prefix = ((body.get("outputConfig") or {}).get("gcsDestination") or {}).get("outputUriPrefix")
        if not uris or not isinstance(prefix, str):
            raise _fail(
                400,
                "inputConfig.gcsSource.uris and outputConfig.gcsDestination.outputUriPrefix are required.",
            )
        model_name = "models/" + str(body.get("model") or "").rsplit("/", 1)[-1]
        state = self.state
        try:
            meta = await run_in_threadpool(self._stage_input, [str(uri) for uri in uris])
        except OSError as exc:
            raise _fail(400, f"cannot read the batch input {uris}: {exc}", "FAILED_PRECONDITION") from exc
        items, issues = parse_file(state, meta, model_name, "generate", state.config)
        attrs: dict[str, Any] = {
            "kind": "generate",
            "model": model_name,
            "display_name": str(body.get("displayName") or ""),
            "input": {"fileName": f"files/{meta.id}"},
            "body": {k: body[k] for k in ("model", "inputConfig", "outputConfig") if k in body},
            "path": f"projects/{project}/locations/{location}/batchPredictionJobs",
            "output_prefix": prefix,
            "version": version,
        }
        job = state.create_job(PROVIDER, str(secrets.randbelow(10**18)), items, issues, state.config, attrs)
        return self.job_json(job, state.now())

    def job_json(self, job: Job, now: float) -> dict[str, Any]:
        """Return the ``BatchPredictionJob`` at ``now``, writing its output to GCS on first terminal sight.

        :param job: the job
        :param now: the current time
        """
        view = settle(self.state, job, now, self._write_output)
        results = job.results or {}
        out: dict[str, Any] = {
            "name": f"{job.attrs['path']}/{job.id}",
            "displayName": job.attrs["display_name"],
            **job.attrs["body"],
            "state": BATCH_STATES[view.status].replace("BATCH_STATE_", "JOB_STATE_"),
            "createTime": _rfc3339(job.created),
            "updateTime": _rfc3339(max([job.created, *view.times.values()])),
            "completionStats": {
                "successfulCount": str(view.completed),
                "failedCount": str(view.failed),
                "incompleteCount": str(0 if view.terminal else len(job.items) - view.completed - view.failed),
            },
        }
        if results.get("directory"):
            out["outputInfo"] = {"gcsOutputDirectory": results["directory"]}
        if view.status == "failed":
            issue: ValidationIssue | None = job.issues[0] if job.issues else None
            out["error"] = {
                "code": 3,
                "message": issue.message if issue else "The batch prediction job failed.",
            }
        return out

    def _stage_input(self, uris: list[str]) -> StoredFile:
        """Copy the input objects, one after the other, into one file of the data directory."""
        state = self.state
        with state.files.writer() as sink:
            for uri in uris:
                self.gcs.read_into(uri, sink)
            meta = StoredFile(
                id=state.new_id("vi", 20),
                filename=uris[0].rsplit("/", 1)[-1],
                purpose="batch",
                bytes=0,
                created_at=int(state.now()),
                sha256="",
                provider=PROVIDER,
            )
            sink.keep(meta)
        return meta

    def _write_output(self, job: Job, now: float, status: str) -> dict[str, Any]:
        rendered = write_results(self.state, job, now, status)
        file_ref = (rendered.get("output") or {}).get("responsesFile")
        if not file_ref:
            return {"written": True}
        file_id = str(file_ref).removeprefix("files/")
        meta = self.state.files.get(file_id)
        assert meta is not None
        directory = f"{job.attrs['output_prefix'].rstrip('/')}/prediction-model-{int(job.created)}"
        self.gcs.write(f"{directory}/predictions.jsonl", self.state.files.iter_bytes(file_id), meta.bytes)
        self.state.bump(PROVIDER, "outputs_written")
        return {"directory": directory}

    def _job(self, job_ref: str) -> Job:
        job_id = job_ref.rsplit("/", 1)[-1]
        job = self.state.jobs.get(job_id, PROVIDER)
        if job is None:
            raise _fail(404, f"BatchPredictionJob {job_id} not found.", "NOT_FOUND")
        return job

    def get_job(
        self, version: str, project: str, location: str, job_ref: str, request: Request
    ) -> dict[str, Any]:
        """``GET .../batchPredictionJobs/{id}``."""
        self.check_auth(request)
        return self.job_json(self._job(job_ref), self.state.now())

    def job_action(
        self, version: str, project: str, location: str, job_ref: str, request: Request
    ) -> Mapping[str, Any]:
        """``POST .../batchPredictionJobs/{id}:cancel``."""
        self.check_auth(request)
        job_id, _, action = job_ref.partition(":")
        if action != "cancel":
            raise _fail(404, f"Unknown method {action!r}; the emulator serves ':cancel'.", "NOT_FOUND")
        job = self._job(job_id)
        with self.state.lock:
            if not job.request_cancel(self.state.now()):
                raise _fail(400, f"BatchPredictionJob {job.id} has already ended.", "FAILED_PRECONDITION")
        return {}

    def list_jobs(self, version: str, project: str, location: str, request: Request) -> dict[str, Any]:
        """``GET .../batchPredictionJobs?pageSize=&pageToken=``, newest first."""
        self.check_auth(request)
        start, size = _page_args(request, 50, 1000)
        path = f"projects/{project}/locations/{location}/batchPredictionJobs"
        jobs = [j for j in self.state.jobs.list(PROVIDER) if j.attrs["path"] == path]
        now = self.state.now()
        out: dict[str, Any] = {
            "batchPredictionJobs": [self.job_json(j, now) for j in jobs[start : start + size]]
        }
        if start + size < len(jobs):
            out["nextPageToken"] = str(start + size)
        return out
