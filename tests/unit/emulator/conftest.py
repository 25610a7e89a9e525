"""Fixtures for the emulator tests: a served emulator with a fake clock, the real OpenAI SDK, and
validation of every response the SDK receives against the official OpenAPI description."""

from __future__ import annotations

import base64
import json
import os
import re
import struct
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from airflow_batch_provider.emulator.config import EmulatorConfig
from airflow_batch_provider.emulator.store import Clock
from airflow_batch_provider.emulator.testing import run_emulator

REPO_ROOT = Path(__file__).resolve().parents[3]
START = 1_760_000_000.0

# (method, path pattern) -> schema of a 2xx answer; every non-2xx answer must be an ErrorResponse
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(r"^/v1/files$"), "OpenAIFile"),
    ("GET", re.compile(r"^/v1/files$"), "ListFilesResponse"),
    ("GET", re.compile(r"^/v1/files/[^/]+$"), "OpenAIFile"),
    ("DELETE", re.compile(r"^/v1/files/[^/]+$"), "DeleteFileResponse"),
    ("POST", re.compile(r"^/v1/batches$"), "Batch"),
    ("GET", re.compile(r"^/v1/batches$"), "ListBatchesResponse"),
    ("GET", re.compile(r"^/v1/batches/[^/]+$"), "Batch"),
    ("POST", re.compile(r"^/v1/batches/[^/]+/cancel$"), "Batch"),
    ("POST", re.compile(r"^/v1/chat/completions$"), "CreateChatCompletionResponse"),
    ("POST", re.compile(r"^/v1/embeddings$"), "CreateEmbeddingResponse"),
]


def spec_path() -> Path:
    override = os.environ.get("OPENAI_OPENAPI_SPEC")
    return Path(override) if override else REPO_ROOT.parent / "shared" / "specs" / "openai-openapi.yaml"


class SpecChecker:
    """Validates JSON objects against named component schemas of the OpenAI OpenAPI description."""

    def __init__(self, components: dict[str, Any]) -> None:
        self._components = components
        self._validators: dict[str, Any] = {}

    def errors(self, schema: str, instance: Any) -> list[str]:
        from openapi_schema_validator import OAS31Validator

        validator = self._validators.get(schema)
        if validator is None:
            validator = OAS31Validator(
                {"$ref": f"#/components/schemas/{schema}", "components": self._components}
            )
            self._validators[schema] = validator
        return [
            f"{schema}: {'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(instance)
        ]

    def validate(self, schema: str, instance: Any) -> None:
        problems = self.errors(schema, instance)
        assert not problems, "\n".join(problems)


@pytest.fixture(scope="session")
def spec() -> SpecChecker:
    path = spec_path()
    if not path.is_file():
        pytest.fail(f"OpenAI OpenAPI description not found at {path}; set OPENAI_OPENAPI_SPEC to its path.")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open("rb") as fh:
        document = yaml.load(fh, Loader=loader)
    return SpecChecker(document["components"])


class FakeTime:
    """A time source that moves only when told."""

    def __init__(self, start: float = START) -> None:
        self.value = start

    def __call__(self) -> float:
        return self.value


@dataclass
class Emulator:
    """A served emulator, an OpenAI client pointed at it, and the spec checks made so far."""

    url: str
    client: Any
    http: httpx.Client
    checked: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def sdk(self, **kwargs: Any) -> Any:
        """Another OpenAI client on the same emulator (e.g. ``max_retries=0``), also spec-checked."""
        return self.client.with_options(**kwargs)

    def advance(self, seconds: float) -> None:
        response = self.http.post("/_emulator/clock", json={"advance_s": seconds})
        response.raise_for_status()

    def config(self, **patch: Any) -> dict[str, Any]:
        response = self.http.put("/_emulator/config", json=patch)
        response.raise_for_status()
        return dict(response.json())

    def stats(self) -> dict[str, Any]:
        return dict(self.http.get("/_emulator/stats").json())

    def upload_jsonl(self, lines: list[dict[str, Any]] | list[str], name: str = "input.jsonl") -> Any:
        text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n"
        return self.client.files.create(file=(name, text.encode()), purpose="batch")

    def create_batch(
        self, lines: list[dict[str, Any]] | list[str], endpoint: str = "/v1/chat/completions", **kw: Any
    ) -> Any:
        upload = self.upload_jsonl(lines)
        return self.client.batches.create(
            input_file_id=upload.id, endpoint=endpoint, completion_window="24h", **kw
        )

    def lines(self, file_id: str | None) -> list[dict[str, Any]]:
        if file_id is None:
            return []
        text = self.client.files.content(file_id).text
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def raw_lines(self, file_id: str) -> list[str]:
        return [line for line in self.client.files.content(file_id).text.splitlines() if line.strip()]


def _response_hook(spec: SpecChecker, emulator_ref: list[Emulator]) -> Callable[[Any], None]:
    def hook(response: Any) -> None:
        request = response.request
        path = request.url.path
        if not path.startswith("/v1/") or path.endswith("/content"):
            return
        response.read()
        emu = emulator_ref[0]
        try:
            body = response.json()
        except ValueError:
            emu.problems.append(f"{request.method} {path}: answer is not JSON")
            return
        if response.status_code >= 400:
            schema = "ErrorResponse"
        else:
            schema = next((s for m, p, s in _ROUTES if m == request.method and p.match(path)), "")
            if not schema:
                emu.problems.append(f"{request.method} {path}: no schema known for this route")
                return
            if schema == "CreateEmbeddingResponse":
                body = _decode_base64_embeddings(body)
            if schema == "ListFilesResponse" and not body.get("data"):
                # the live API (and the emulator) send null cursors on an empty page
                body = {**body, "first_id": "", "last_id": ""}
        emu.checked.append(schema)
        emu.problems.extend(spec.errors(schema, body))

    return hook


def _decode_base64_embeddings(body: dict[str, Any]) -> dict[str, Any]:
    data = []
    for item in body.get("data", []):
        value = item.get("embedding")
        if isinstance(value, str):
            raw = base64.b64decode(value)
            value = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        data.append({**item, "embedding": value})
    return {**body, "data": data}


EmulatorFactory = Callable[..., AbstractContextManager[Emulator]]


@pytest.fixture
def emulator_factory(spec: SpecChecker) -> Iterator[EmulatorFactory]:
    """Start emulators: ``with emulator_factory(seed=3, faults=FaultConfig(...)) as emu: ...``.

    The clock is fake (it moves only with ``emu.advance``) unless ``real_clock=True``. Every
    response the SDK gets is validated against the OpenAPI description; the test fails at exit
    if any did not conform.
    """
    import openai

    @contextmanager
    def start(*, real_clock: bool = False, **config: Any) -> Iterator[Emulator]:
        clock = None if real_clock else Clock(FakeTime())
        ref: list[Emulator] = []
        with run_emulator(EmulatorConfig(**config), clock=clock) as url:
            http_client = openai.DefaultHttpxClient(event_hooks={"response": [_response_hook(spec, ref)]})
            client = openai.OpenAI(
                base_url=url + "/v1", api_key="sk-test", http_client=http_client, max_retries=0
            )
            with httpx.Client(base_url=url, timeout=10) as http:
                emu = Emulator(url=url, client=client, http=http)
                ref.append(emu)
                try:
                    yield emu
                finally:
                    client.close()
        assert not emu.problems, "responses that do not match the OpenAPI description:\n" + "\n".join(
            emu.problems
        )

    yield start


@pytest.fixture
def emu(emulator_factory: EmulatorFactory) -> Iterator[Emulator]:
    """An emulator with default settings and a fake clock."""
    with emulator_factory() as emulator:
        yield emulator
