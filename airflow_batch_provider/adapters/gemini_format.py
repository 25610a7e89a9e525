"""Gemini's request format: canonical requests as REST ``GenerateContentRequest`` pieces (generation config, tools).

Split from :mod:`airflow_batch_provider.adapters.gemini`, which re-exports every public name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from airflow_batch_provider.core.requests import (
    canonical_tool_choice,
    canonical_tools,
)

#: Canonical (OpenAI-style) generation parameters -> Gemini ``generationConfig`` fields.
_GENERATION_PARAMS: Final[dict[str, str]] = {
    "max_tokens": "maxOutputTokens",
    "max_completion_tokens": "maxOutputTokens",
    "max_output_tokens": "maxOutputTokens",
    "temperature": "temperature",
    "top_p": "topP",
    "top_k": "topK",
    "seed": "seed",
    "n": "candidateCount",
    "candidate_count": "candidateCount",
    "presence_penalty": "presencePenalty",
    "frequency_penalty": "frequencyPenalty",
}


_EMBED_PARAMS: Final[dict[str, str]] = {
    "dimensions": "outputDimensionality",
    "output_dimensionality": "outputDimensionality",
    "outputDimensionality": "outputDimensionality",
    "task_type": "taskType",
    "taskType": "taskType",
    "title": "title",
}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _model_path(model: str) -> str:
    return model if model.startswith(("models/", "tunedModels/")) else f"models/{model}"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content if p
        ).strip()
    return "" if content is None else str(content)


def generation_config(params: Mapping[str, Any]) -> dict[str, Any]:
    """Translate canonical generation parameters into a Gemini ``generationConfig``.

    OpenAI-style names (``max_tokens``, ``top_p``, ``stop``, ``response_format``) are mapped;
    other names pass through camel-cased (``response_mime_type`` -> ``responseMimeType``), so
    Gemini-only settings (``thinking_config`` ...) can be given too.

    :param params: the prompt's parameters
    """
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name in _GENERATION_PARAMS:
            out[_GENERATION_PARAMS[name]] = value
        elif name == "stop":
            out["stopSequences"] = [value] if isinstance(value, str) else list(value)
        elif name == "response_format":
            kind = value.get("type") if isinstance(value, Mapping) else None
            if kind in ("json_object", "json_schema"):
                out["responseMimeType"] = "application/json"
            if kind == "json_schema":
                schema = (value.get("json_schema") or {}).get("schema")
                if schema is not None:
                    out["responseJsonSchema"] = schema
        else:
            out[_camel(name)] = value
    return out


def gemini_tools(tools: Any) -> list[dict[str, Any]]:
    """Gemini ``tools``: one tool holding every function declaration.

    :param tools: the prompt's ``tools`` param, in any form the canonical reader accepts
    """
    declarations = []
    for tool in canonical_tools(tools):
        declaration: dict[str, Any] = {"name": tool.name, "parameters": dict(tool.parameters)}
        if tool.description:
            declaration["description"] = tool.description
        declarations.append(declaration)
    return [{"functionDeclarations": declarations}] if declarations else []


def gemini_tool_config(choice: Any) -> dict[str, Any] | None:
    """Gemini ``toolConfig`` for a canonical ``tool_choice``.

    :param choice: the prompt's ``tool_choice`` param
    """
    value = canonical_tool_choice(choice)
    if value is None:
        return None
    modes = {"auto": "AUTO", "none": "NONE", "required": "ANY"}
    if value in modes:
        return {"functionCallingConfig": {"mode": modes[value]}}
    return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [value]}}
