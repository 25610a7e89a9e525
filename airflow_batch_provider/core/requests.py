"""The canonical, provider-neutral request and the prompt template that renders it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Final, Literal, get_args

import jinja2
import jinja2.nodes
import jinja2.sandbox

from airflow_batch_provider.core.hashing import canonical_json, sha256_hex
from airflow_batch_provider.exceptions import ConfigurationError, ItemError

#: What a request asks for: ``chat`` (chat completions / messages / generateContent),
#: ``embedding``, ``response`` (OpenAI's Responses API) and ``moderation`` (OpenAI's moderations).
#: Each adapter declares the kinds it accepts (``BatchAdapter.kinds``).
RequestKind = Literal["chat", "embedding", "response", "moderation"]
REQUEST_KINDS: Final[tuple[str, ...]] = get_args(RequestKind)


class _NullValue(Exception):
    """A template expression rendered ``None`` (a null field); raised by :func:`_finalize`."""


def _finalize(value: Any) -> Any:
    # Without this, a null field renders the text "None" and is sent to the model.
    if value is None:
        raise _NullValue
    return value


_ENV = jinja2.sandbox.SandboxedEnvironment(
    undefined=jinja2.StrictUndefined, autoescape=False, finalize=_finalize
)

#: Names that Jinja resolves itself at a template's top level: a record field of that name is
#: never what ``{{ name }}`` reads.
_JINJA_RESERVED: frozenset[str] = frozenset({"self"})


@dataclass(frozen=True)
class CanonicalRequest:
    """One item's request, before any provider formats it.

    :param app_id: the application's own id for the item (any string)
    :param prompt_version: version of the prompt that rendered it
    :param model: model name as the provider knows it
    :param kind: ``chat`` (messages), ``embedding`` (``input`` text), ``response`` (OpenAI's
        Responses API: the messages become its ``input``) or ``moderation`` (the text is classified)
    :param system: shared system prompt, placed first so that providers can cache it
    :param messages: the conversation after the system prompt, as role/content dicts
    :param params: generation parameters (``max_tokens``, ``temperature``, ``response_format`` ...)
    """

    app_id: str
    prompt_version: str
    model: str
    kind: RequestKind = "chat"
    system: str | None = None
    messages: tuple[Mapping[str, Any], ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def input_hash(self) -> str:
        """SHA-256 over everything that decides the output (not the application id)."""
        return sha256_hex(
            canonical_json(
                {
                    "kind": self.kind,
                    "model": self.model,
                    "prompt_version": self.prompt_version,
                    "system": self.system,
                    "messages": [dict(m) for m in self.messages],
                    "params": dict(self.params),
                }
            )
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable form (stored in the ledger for resubmission and fallback)."""
        return {
            "app_id": self.app_id,
            "prompt_version": self.prompt_version,
            "model": self.model,
            "kind": self.kind,
            "system": self.system,
            "messages": [dict(m) for m in self.messages],
            "params": dict(self.params),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CanonicalRequest:
        """Rebuild a request from :meth:`to_dict` output.

        :param data: the stored dict
        """
        return cls(
            app_id=str(data["app_id"]),
            prompt_version=str(data["prompt_version"]),
            model=str(data["model"]),
            kind=data.get("kind", "chat"),
            system=data.get("system"),
            messages=tuple(data.get("messages") or ()),
            params=dict(data.get("params") or {}),
        )

    @property
    def text(self) -> str:
        """All prompt text, for token estimates and embeddings."""
        parts = [self.system or ""] + [str(m.get("content", "")) for m in self.messages]
        return "\n".join(p for p in parts if p)


@dataclass(frozen=True)
class ToolSpec:
    """One function tool, provider-neutral; each adapter writes it in its provider's native form.

    :param name: the function's name
    :param description: what it does, for the model
    :param parameters: the JSON Schema of its arguments
    :param strict: OpenAI's strict argument validation (``None``: the provider's default); carried
        to OpenAI only
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


def _tool(entry: Any, position: int) -> ToolSpec:
    if not isinstance(entry, Mapping):
        raise ConfigurationError(f"tool {position} is {entry!r}; give each tool as a mapping with a name.")
    inner = entry.get("function")
    if isinstance(inner, Mapping):  # OpenAI chat: {"type": "function", "function": {...}}
        entry = inner
    elif entry.get("type") not in (None, "function", "custom"):
        raise ConfigurationError(
            f"tool {position} has type {entry.get('type')!r}; only function tools are carried across "
            "providers. Give {name, description, parameters}."
        )
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"tool {position} has no name; every function tool needs a string name.")
    schema = entry.get("parameters", entry.get("input_schema"))  # Anthropic: input_schema
    if schema is None:
        schema = {"type": "object", "properties": {}}
    if not isinstance(schema, Mapping):
        raise ConfigurationError(f"tool {name!r}: parameters must be a JSON Schema object, not {schema!r}.")
    strict = entry.get("strict")
    return ToolSpec(
        name, str(entry.get("description") or ""), dict(schema), strict if isinstance(strict, bool) else None
    )


def canonical_tools(tools: Any) -> tuple[ToolSpec, ...]:
    """Read a prompt's ``tools`` in any of the forms users write them.

    Accepted: the neutral ``{name, description, parameters}``, OpenAI chat's
    ``{"type": "function", "function": {...}}``, OpenAI Responses' ``{"type": "function", "name",
    ...}``, Anthropic's ``{name, description, input_schema}``, and Gemini's
    ``{"function_declarations": [...]}`` (each declaration one tool).

    :param tools: the ``tools`` param (a list)
    :raises ConfigurationError: a tool that is not a named function tool
    """
    if tools is None:
        return ()
    if not isinstance(tools, (list, tuple)):
        raise ConfigurationError(f"tools must be a list of function tools, not {type(tools).__name__}.")
    out: list[ToolSpec] = []
    for position, entry in enumerate(tools):
        declarations = None
        if isinstance(entry, Mapping):
            declarations = entry.get("function_declarations", entry.get("functionDeclarations"))
        if isinstance(declarations, (list, tuple)):
            out.extend(_tool(d, position) for d in declarations)
        else:
            out.append(_tool(entry, position))
    return tuple(out)


def canonical_tool_choice(choice: Any) -> str | None:
    """Read a prompt's ``tool_choice``: ``auto``, ``none``, ``required`` or the name of one tool.

    Accepted: those strings (``any`` means ``required``), OpenAI chat's
    ``{"type": "function", "function": {"name"}}``, Responses' ``{"type": "function", "name"}``
    and Anthropic's ``{"type": "auto" | "any" | "none" | "tool", "name"}``.

    :param choice: the ``tool_choice`` param
    :raises ConfigurationError: a form none of the providers knows
    """
    if choice is None:
        return None
    if isinstance(choice, str):
        value = {"any": "required"}.get(choice, choice)
        if value in ("auto", "none", "required"):
            return value
    if isinstance(choice, Mapping):
        inner = choice.get("function")
        name = inner.get("name") if isinstance(inner, Mapping) else choice.get("name")
        if isinstance(name, str) and name:
            return name
        kind = choice.get("type")
        if kind in ("auto", "none", "any", "required"):
            return "required" if kind == "any" else str(kind)
    raise ConfigurationError(
        f"tool_choice {choice!r} is not understood; give 'auto', 'none', 'required' or "
        '{"name": "<tool>"}.'
    )


@lru_cache(maxsize=64)
def _compiled(source: str) -> jinja2.Template:
    return _ENV.from_string(source)


@dataclass(frozen=True)
class PromptTemplate:
    """A versioned prompt: a shared system prompt and a per-record user template.

    Templates use Jinja2 with strict undefined variables, so a record that lacks a field the
    template names is rejected with the field's name instead of sending an empty prompt.

    :param version: prompt version; part of the input hash and of the ledger key
    :param model: model name
    :param user: Jinja2 template of the user message, rendered with the record's fields
    :param system: shared prefix (rubric, instructions, few-shot examples); not templated so
        that it is byte-identical across items and cacheable
    :param params: generation parameters passed through to the provider
    :param kind: ``chat``, ``embedding``, ``response`` or ``moderation`` (for embeddings and
        moderations ``user`` renders the input text)
    :param id_field: the record field that holds the application id
    :param output_format: what a result must be: ``text``, ``json`` or ``vector`` (embeddings)
    :param output_schema: JSON Schema a ``json`` output must satisfy (else ``invalid_output``)
    :param name: a human name for logs
    """

    version: str
    model: str
    user: str
    system: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    kind: RequestKind = "chat"
    id_field: str = "id"
    output_format: Literal["text", "json", "vector"] = "text"
    output_schema: Mapping[str, Any] | None = None
    name: str = ""

    @classmethod
    def load(cls, prompt: PromptTemplate | str | Path) -> PromptTemplate:
        """Return ``prompt`` itself, or the prompt in the YAML file it names.

        :param prompt: a prompt, or the path of its YAML file
        """
        return prompt if isinstance(prompt, PromptTemplate) else cls.from_yaml(prompt)

    @classmethod
    def from_yaml(cls, path: str | Path) -> PromptTemplate:
        """Load a prompt file.

        Keys: ``name``, ``version``, ``model``, ``system``, ``user``, ``params``, ``kind``,
        ``id_field``, ``output_format``, ``output_schema``.

        :param path: the YAML file
        """
        import yaml

        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ConfigurationError(f"prompt file {path} must hold a mapping; see include/prompts/.")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigurationError(
                f"prompt file {path}: unknown keys {unknown}; known keys are {sorted(known)}."
            )
        missing = [k for k in ("version", "model", "user") if not data.get(k)]
        if missing:
            raise ConfigurationError(
                f"prompt file {path}: missing {missing}; every prompt needs version, model, user."
            )
        data["version"] = str(data["version"])
        return cls(**data)

    def __post_init__(self) -> None:
        if not self.version:
            raise ConfigurationError("PromptTemplate.version is empty: give every prompt a version string.")
        if self.kind not in REQUEST_KINDS:
            raise ConfigurationError(
                f"PromptTemplate {self.version!r}: kind {self.kind!r} is not a request kind; give one of "
                f"{list(REQUEST_KINDS)}."
            )
        try:
            # Compiling (not only parsing) also catches a filter or test that does not exist.
            _compiled(self.user)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigurationError(
                f"PromptTemplate {self.version!r}: user template does not parse at line {exc.lineno}: "
                f"{exc.message}. Fix the template."
            ) from exc
        used = {
            node.name
            for node in _ENV.parse(self.user).find_all(jinja2.nodes.Name)
            if node.ctx == "load" and node.name in _JINJA_RESERVED
        }
        if used:
            name = sorted(used)[0]
            raise ConfigurationError(
                f"PromptTemplate {self.version!r}: the user template reads {{{{ {name} }}}}, but {name!r} is "
                f"Jinja's name for the template itself, never a record field. Rename the field in the "
                "records (e.g. with a records callable) and in the template."
            )

    @property
    def fields(self) -> tuple[str, ...]:
        """The record fields the user template reads, sorted (a Parquet source reads only these)."""
        import jinja2.meta

        return tuple(sorted(jinja2.meta.find_undeclared_variables(_ENV.parse(self.user))))

    @property
    def fingerprint(self) -> str:
        """The sha256 of the prompt's content: every field, the version and the output schema included.

        A run records it at prepare: a prompt edited during the run (a new schema, another
        template) has another fingerprint, even under the same version.
        """
        content = {name: getattr(self, name) for name in self.__dataclass_fields__}
        # ``default``: a parameter JSON cannot write (a mapping proxy) still counts, by its text
        return sha256_hex(json.dumps(content, sort_keys=True, separators=(",", ":"), default=repr))

    def render(self, record: Mapping[str, Any], position: int | None = None) -> CanonicalRequest:
        """Render one record into a request.

        :param record: the input record
        :param position: the record's position in the input, for error messages
        :raises ItemError: the id is missing or a template variable is missing
        """
        raw_id = record.get(self.id_field)
        if raw_id is None or (isinstance(raw_id, str) and not raw_id.strip()):
            raise ItemError(
                None,
                "missing_id",
                f"has no {self.id_field!r} field; every record needs a non-empty application id "
                f"in {self.id_field!r} (or set PromptTemplate.id_field).",
                position,
            )
        if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
            raise ItemError(
                None,
                "invalid_id",
                f"its {self.id_field!r} is {raw_id!r} ({type(raw_id).__name__}); an application id "
                "must be a string or an integer. Fix the record's id.",
                position,
            )
        app_id = str(raw_id)
        odd = next((k for k in record if not isinstance(k, str)), None)
        if odd is not None:
            raise ItemError(
                app_id,
                "invalid_record",
                f"field name {odd!r} is not a string; records must be dicts with string keys.",
                position,
            )
        try:
            # The record goes in as one dict, not as keywords: a field named ``self`` (or any
            # other name) cannot collide with the render method's own arguments.
            text = _compiled(self.user).render(dict(record))
        except jinja2.UndefinedError as exc:
            raise ItemError(
                app_id,
                "template_variable_missing",
                f"prompt {self.version!r} needs a field the record lacks ({exc.message}); "
                "add the field to the record or change the template.",
                position,
            ) from exc
        except _NullValue as exc:
            raise ItemError(
                app_id,
                "null_value",
                f"prompt {self.version!r} renders a null value from this record (instead of sending the "
                "text 'None'); give the field a value, or write {{ field or '' }} in the template.",
                position,
            ) from exc
        except Exception as exc:  # one record's failure must not fail the others
            raise ItemError(
                app_id,
                "template_error",
                f"prompt {self.version!r} raised {type(exc).__name__}: {exc} while rendering this record; "
                "fix the template or the record.",
                position,
            ) from exc
        return CanonicalRequest(
            app_id=app_id,
            prompt_version=self.version,
            model=self.model,
            kind=self.kind,
            system=self.system,
            messages=({"role": "user", "content": text},),
            params=dict(self.params),
        )
