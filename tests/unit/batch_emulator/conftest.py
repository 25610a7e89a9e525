"""Fixtures for the emulator tests: a served emulator with a fake clock, the real OpenAI SDK, and
validation of every response the SDK receives against the OpenAI API's schemas (carried in
``schemas/``; also against a full OpenAPI description where ``$OPENAI_OPENAPI_SPEC`` names one)."""

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

from batch_emulator.config import EmulatorConfig
from batch_emulator.store import Clock
from batch_emulator.testing import run_emulator

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
    ("POST", re.compile(r"^/v1/responses$"), "Response"),
    ("POST", re.compile(r"^/v1/moderations$"), "CreateModerationResponse"),
]


SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
#: Names an OpenAI OpenAPI description to validate against as well (optional; never needed).
SPEC_ENV = "OPENAI_OPENAPI_SPEC"


def bundled_components() -> dict[str, Any]:
    """The component schemas this repository carries: the objects the emulator serves, copied from
    the official description by ``scripts/extract_openai_schemas.py``, and the batch line formats."""
    schemas: dict[str, Any] = {}
    for name in ("openai-components.json", "batch-lines.json"):
        document = json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))
        schemas.update(document["components"]["schemas"])
    return {"schemas": schemas}


def full_description_components() -> dict[str, Any] | None:
    """The components of the description named by ``$OPENAI_OPENAPI_SPEC``, or ``None`` when unset."""
    override = os.environ.get(SPEC_ENV)
    if not override:
        return None
    path = Path(override)
    if not path.is_file():
        pytest.fail(f"{SPEC_ENV}={override} is not a file; unset it or point it at openai-openapi.yaml.")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open("rb") as fh:
        document = yaml.load(fh, Loader=loader)
    return dict(document["components"])


class SpecChecker:
    """Validates JSON objects against named component schemas: the bundled ones always, and those
    of a full OpenAI OpenAPI description too where ``$OPENAI_OPENAPI_SPEC`` names one. A schema the
    full description lacks (the batch line formats) is checked against the bundled one alone."""

    def __init__(self, *component_sets: dict[str, Any]) -> None:
        self._component_sets = component_sets
        self._validators: dict[tuple[int, str], Any] = {}

    def errors(self, schema: str, instance: Any) -> list[str]:
        from openapi_schema_validator import OAS31Validator

        problems: list[str] = []
        known = False
        for index, components in enumerate(self._component_sets):
            if schema not in components.get("schemas", {}):
                continue
            known = True
            validator = self._validators.get((index, schema))
            if validator is None:
                validator = OAS31Validator(
                    {"$ref": f"#/components/schemas/{schema}", "components": components}
                )
                self._validators[(index, schema)] = validator
            problems.extend(
                f"{schema}: {'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in validator.iter_errors(instance)
            )
        if not known:
            raise KeyError(
                f"no schema named {schema!r}; add it to ROOTS in scripts/extract_openai_schemas.py"
            )
        return sorted(set(problems))

    def validate(self, schema: str, instance: Any) -> None:
        problems = self.errors(schema, instance)
        assert not problems, "\n".join(problems)


@pytest.fixture(scope="session")
def spec() -> SpecChecker:
    full = full_description_components()
    return SpecChecker(bundled_components(), *([full] if full is not None else []))


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
        if not path.startswith("/v1/"):
            return
        response.read()
        emu = emulator_ref[0]
        if path.endswith("/content"):
            if response.status_code < 400:
                _check_result_lines(spec, emu, f"{request.method} {path}", response.content)
            return
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


def _check_result_lines(spec: SpecChecker, emu: Emulator, where: str, content: bytes) -> None:
    """Validate the lines of a batch output or error file (input files are the caller's own)."""
    for number, raw in enumerate(content.splitlines(), start=1):
        try:
            line = json.loads(raw)
        except ValueError:
            continue  # a deliberately malformed line (a fault knob); the adapter tests cover those
        if isinstance(line, dict) and "response" in line:
            emu.checked.append("BatchRequestOutput")
            emu.problems.extend(
                f"{where} line {number}: {p}" for p in spec.errors("BatchRequestOutput", line)
            )


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
