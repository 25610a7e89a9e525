from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.core.requests import CanonicalRequest, PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError, ItemError

REPO_ROOT = Path(__file__).resolve().parents[3]
FEEDBACK_PROMPT = REPO_ROOT / "include" / "prompts" / "feedback_classification.yaml"


def template(**overrides: Any) -> PromptTemplate:
    fields: dict[str, Any] = {
        "version": "v1",
        "model": "gpt-4o-mini",
        "user": "Classify ({{ channel }}): {{ comment }}",
        "system": "You label feedback.",
        "params": {"max_tokens": 60, "temperature": 0},
    }
    fields.update(overrides)
    return PromptTemplate(**fields)


def request(**overrides: Any) -> CanonicalRequest:
    fields: dict[str, Any] = {
        "app_id": "fb-1",
        "prompt_version": "v1",
        "model": "gpt-4o-mini",
        "system": "You label feedback.",
        "messages": ({"role": "user", "content": "Classify: late parcel"},),
        "params": {"max_tokens": 60, "temperature": 0},
    }
    fields.update(overrides)
    return CanonicalRequest(**fields)


def test_a_record_renders_into_a_request_with_the_system_prompt_first() -> None:
    req = template().render({"id": "fb-1", "channel": "email", "comment": "late parcel"})
    assert req == CanonicalRequest(
        app_id="fb-1",
        prompt_version="v1",
        model="gpt-4o-mini",
        kind="chat",
        system="You label feedback.",
        messages=({"role": "user", "content": "Classify (email): late parcel"},),
        params={"max_tokens": 60, "temperature": 0},
    )


def test_a_non_string_id_becomes_its_string() -> None:
    assert template(user="x").render({"id": 42}).app_id == "42"


def test_the_id_field_can_be_renamed() -> None:
    assert template(user="x", id_field="ticket").render({"ticket": "T-9"}).app_id == "T-9"


def test_rendering_does_not_escape_html_in_the_record() -> None:
    req = template(user="{{ comment }}").render({"id": "a", "comment": "<b>5 > 3 & ok</b>"})
    assert req.messages[0]["content"] == "<b>5 > 3 & ok</b>"


def test_a_missing_template_variable_names_the_record_the_field_and_the_fix() -> None:
    with pytest.raises(ItemError) as caught:
        template().render({"id": "fb-9", "comment": "x"}, position=12)
    err = caught.value
    assert err.code == "template_variable_missing"
    assert err.app_id == "fb-9"
    assert err.position == 12
    message = str(err)
    assert message.startswith("record 12 (id 'fb-9'):")
    assert "'channel' is undefined" in message
    assert "'v1'" in message
    assert "add the field to the record or change the template" in message


def test_a_missing_attribute_of_a_nested_field_is_also_refused() -> None:
    with pytest.raises(ItemError) as caught:
        template(user="{{ customer.name }}").render({"id": "a", "customer": {}})
    assert caught.value.code == "template_variable_missing"


@pytest.mark.parametrize("record", [{}, {"id": None}, {"id": ""}, {"id": "   "}, {"other": "x"}])
def test_a_record_without_an_id_is_refused_with_missing_id(record: dict[str, Any]) -> None:
    with pytest.raises(ItemError) as caught:
        template(user="x").render(record, position=4)
    err = caught.value
    assert err.code == "missing_id"
    assert err.app_id is None
    assert str(err).startswith("record 4: has no 'id' field")
    assert "PromptTemplate.id_field" in str(err)


def test_a_template_that_does_not_parse_is_refused_at_construction() -> None:
    with pytest.raises(ConfigurationError, match=r"'v1'.*does not parse at line 1.*Fix the template"):
        template(user="{{ unclosed ")


def test_a_template_without_a_version_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="version is empty"):
        template(version="")


def test_the_sandbox_refuses_reaching_into_python_internals() -> None:
    bad = template(user="{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ItemError, match="unsafe") as caught:
        bad.render({"id": "a"})
    assert caught.value.code == "template_error"


def test_a_field_named_self_renders_like_any_other_field() -> None:
    req = template(user="{{ comment }}").render({"id": "a", "self": "me", "comment": "hi"})
    assert req.messages[0]["content"] == "hi"


@pytest.mark.parametrize("name", ["self", "args", "kwargs", "__class__", "range", "namespace"])
def test_a_field_named_like_a_python_or_jinja_internal_does_not_break_rendering(name: str) -> None:
    req = template(user="{{ comment }}").render({"id": "a", name: "x", "comment": "hi"}, 3)
    assert req.messages[0]["content"] == "hi"


def test_a_template_reading_self_is_refused_at_construction_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="'self' is Jinja's name for the template"):
        template(user="{{ self }}")


def test_a_filter_that_does_not_exist_is_refused_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="No filter named 'nosuch'"):
        template(user="{{ comment | nosuch }}")


@pytest.mark.parametrize(
    ("user", "record", "match", "good"),
    [
        ("{{ 10 / n }}", {"n": 0}, "ZeroDivisionError: division by zero", 2),
        ("{% if n %}{{ n | nosuch }}{% endif %}", {"n": 1}, "No filter named 'nosuch'", 0),
        ("{{ n + 'a' }}", {"n": 1}, "TypeError", "b"),
    ],
)
def test_a_template_that_raises_for_one_record_rejects_that_record_only(
    user: str, record: dict[str, Any], match: str, good: Any
) -> None:
    prompt = template(user=user)
    with pytest.raises(ItemError, match=match) as caught:
        prompt.render({"id": "a", **record}, 7)
    assert caught.value.code == "template_error" and caught.value.app_id == "a"
    assert "fix the template or the record" in str(caught.value)
    assert prompt.render({"id": "b", "n": good}).app_id == "b"


def test_a_null_value_is_refused_instead_of_rendering_the_text_none() -> None:
    with pytest.raises(ItemError, match="renders a null value") as caught:
        template(user="{{ comment }}").render({"id": "a", "comment": None})
    assert caught.value.code == "null_value"
    assert template(user="{{ comment or '' }}!").render({"id": "a", "comment": None}).text.endswith("!")


def test_a_record_with_a_non_string_field_name_is_refused_naming_it() -> None:
    with pytest.raises(ItemError, match="field name 1 is not a string") as caught:
        template(user="{{ comment }}").render({"id": "a", 1: "x", "comment": "c"})  # type: ignore[dict-item]
    assert caught.value.code == "invalid_record"


@pytest.mark.parametrize("value", [["a"], {"k": 1}, True, 1.5])
def test_an_id_that_is_not_a_string_or_an_integer_is_refused(value: Any) -> None:
    with pytest.raises(ItemError, match="must be a string or an integer") as caught:
        template(user="x").render({"id": value})
    assert caught.value.code == "invalid_id"


def test_the_input_hash_is_stable() -> None:
    assert request().input_hash == request().input_hash
    assert len(request().input_hash) == 64
    reordered = request(params={"temperature": 0, "max_tokens": 60})
    assert reordered.input_hash == request().input_hash


def test_the_input_hash_ignores_the_application_id() -> None:
    assert request(app_id="fb-1").input_hash == request(app_id="another").input_hash


@pytest.mark.parametrize(
    "change",
    [
        {"model": "gpt-4o"},
        {"prompt_version": "v2"},
        {"system": "You label feedback!"},
        {"system": None},
        {"params": {"max_tokens": 61, "temperature": 0}},
        {"params": {"max_tokens": 60}},
        {"messages": ({"role": "user", "content": "Classify: late parcels"},)},
        {"kind": "embedding"},
    ],
)
def test_the_input_hash_changes_with_anything_that_decides_the_output(change: dict[str, Any]) -> None:
    assert request(**change).input_hash != request().input_hash


def test_a_request_round_trips_through_its_json_dict() -> None:
    req = request(kind="chat", params={"response_format": {"type": "json_object"}, "max_tokens": 5})
    data = json.loads(json.dumps(req.to_dict()))
    back = CanonicalRequest.from_dict(data)
    assert back == req
    assert back.input_hash == req.input_hash
    embedding = request(kind="embedding", system=None, params={})
    assert CanonicalRequest.from_dict(embedding.to_dict()) == embedding


def test_from_dict_fills_the_defaults_for_a_minimal_dict() -> None:
    back = CanonicalRequest.from_dict({"app_id": 7, "prompt_version": 3, "model": "m"})
    assert back == CanonicalRequest(app_id="7", prompt_version="3", model="m")


def test_the_text_joins_system_and_messages_for_estimates() -> None:
    assert request().text == "You label feedback.\nClassify: late parcel"
    assert request(system=None).text == "Classify: late parcel"


def test_the_shipped_feedback_prompt_loads_and_renders() -> None:
    prompt = PromptTemplate.from_yaml(FEEDBACK_PROMPT)
    assert (prompt.name, prompt.version, prompt.model, prompt.kind) == (
        "feedback_classification",
        "v3",
        "gpt-4o-mini",
        "chat",
    )
    assert prompt.output_format == "json"
    assert prompt.output_schema is not None
    assert prompt.output_schema["required"] == ["sentiment", "topic", "confidence"]
    assert prompt.params["response_format"]["json_schema"]["schema"] == prompt.output_schema
    assert prompt.system is not None and prompt.system.startswith("You label customer feedback")
    req = prompt.render(
        {"id": "fb-1", "channel": "email", "product": "Aurora Blender", "comment": "Slow refund."}
    )
    assert req.messages == ({"role": "user", "content": "Comment (email, Aurora Blender): Slow refund."},)
    assert req.prompt_version == "v3"


def test_a_numeric_version_in_yaml_becomes_a_string(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: 2\nmodel: m\nuser: '{{ x }}'\n", encoding="utf-8")
    assert PromptTemplate.from_yaml(path).version == "2"


def test_unknown_keys_in_a_prompt_file_are_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("version: v1\nmodel: m\nuser: x\ntemprature: 0\nsytem: s\n", encoding="utf-8")
    with pytest.raises(ConfigurationError) as caught:
        PromptTemplate.from_yaml(path)
    message = str(caught.value)
    assert str(path) in message
    assert "unknown keys ['sytem', 'temprature']" in message
    assert "'system'" in message  # the known keys are listed, so the typo is obvious


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("model: m\nuser: x\n", "['version']"),
        ("version: v1\nuser: x\n", "['model']"),
        ("version: v1\nmodel: m\nuser: ''\n", "['user']"),
        ("name: only\n", "['version', 'model', 'user']"),
    ],
)
def test_missing_keys_in_a_prompt_file_are_refused_by_name(tmp_path: Path, text: str, missing: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigurationError, match="every prompt needs version, model, user") as caught:
        PromptTemplate.from_yaml(path)
    assert f"missing {missing}" in str(caught.value)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", ""])
def test_a_prompt_file_that_is_not_a_mapping_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigurationError, match="must hold a mapping"):
        PromptTemplate.from_yaml(path)


def test_load_returns_a_prompt_as_is_and_reads_a_path_as_yaml() -> None:
    from pathlib import Path

    from airflow_batch_provider.core.requests import PromptTemplate

    path = Path(__file__).resolve().parents[3] / "include" / "prompts" / "feedback_classification.yaml"
    loaded = PromptTemplate.load(str(path))
    assert loaded == PromptTemplate.from_yaml(path)
    assert PromptTemplate.load(loaded) is loaded


# -- kinds and tools ---------------------------------------------------------------------------


def test_a_prompt_of_an_unknown_kind_is_refused_naming_the_kinds() -> None:
    from airflow_batch_provider.core.requests import REQUEST_KINDS

    assert set(REQUEST_KINDS) == {"chat", "embedding", "response", "moderation"}
    with pytest.raises(
        ConfigurationError, match=r"kind 'completion' is not a request kind; give one of \['chat'"
    ):
        PromptTemplate(version="v1", model="m", user="x", kind="completion")  # type: ignore[arg-type]


WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}


@pytest.mark.parametrize(
    "form",
    [
        {"name": "get_weather", "description": "Weather", "parameters": WEATHER_PARAMS},
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER_PARAMS},
        },
        {"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER_PARAMS},
        {"name": "get_weather", "description": "Weather", "input_schema": WEATHER_PARAMS},
        {
            "function_declarations": [
                {"name": "get_weather", "description": "Weather", "parameters": WEATHER_PARAMS}
            ]
        },
    ],
    ids=["neutral", "openai_chat", "openai_responses", "anthropic", "gemini"],
)
def test_a_tool_in_any_providers_form_reads_as_one_canonical_tool(form: dict[str, Any]) -> None:
    from airflow_batch_provider.core.requests import ToolSpec, canonical_tools

    assert canonical_tools([form]) == (ToolSpec("get_weather", "Weather", WEATHER_PARAMS),)


def test_a_tool_that_is_not_a_named_function_is_refused() -> None:
    from airflow_batch_provider.core.requests import canonical_tools

    with pytest.raises(ConfigurationError, match="only function tools"):
        canonical_tools([{"type": "web_search"}])
    with pytest.raises(ConfigurationError, match="has no name"):
        canonical_tools([{"parameters": {}}])
    with pytest.raises(ConfigurationError, match="must be a list"):
        canonical_tools({"name": "x"})


@pytest.mark.parametrize(
    ("choice", "canonical"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ("any", "required"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "f"}, "f"),
        ({"type": "function", "function": {"name": "f"}}, "f"),
        ({"type": "function", "name": "f"}, "f"),
        (None, None),
    ],
)
def test_a_tool_choice_in_any_providers_form_reads_as_one_canonical_choice(
    choice: Any, canonical: str | None
) -> None:
    from airflow_batch_provider.core.requests import canonical_tool_choice

    assert canonical_tool_choice(choice) == canonical


def test_a_prompts_fingerprint_changes_with_any_field_and_not_with_a_fresh_load() -> None:
    from dataclasses import replace

    base = PromptTemplate(version="v1", model="m", user="{{ text }}", params={"temperature": 0})
    assert (
        base.fingerprint
        == PromptTemplate(version="v1", model="m", user="{{ text }}", params={"temperature": 0}).fingerprint
    )
    others = [
        replace(base, version="v2"),
        replace(base, output_format="json"),
        replace(base, output_schema={"type": "object"}),
        replace(base, system="Other rubric."),
        replace(base, params={"temperature": 1}),
    ]
    assert len({base.fingerprint, *(p.fingerprint for p in others)}) == 1 + len(others)


def test_a_prompt_names_the_record_fields_its_template_reads_and_not_the_ones_it_sets() -> None:
    prompt = PromptTemplate(
        version="v1", model="m", user="{% set who = name %}{{ who }} on {{ channel }}: {{ text | upper }}"
    )
    assert prompt.fields == ("channel", "name", "text")
