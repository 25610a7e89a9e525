"""Adapter registry: connection type -> adapter class, imported lazily.

Third-party adapters register through the ``airflow_batch_provider.adapters`` entry-point group
(name = connection type, value = ``module:Class``).
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import entry_points
from typing import Final

from airflow_batch_provider.adapters.base import BatchAdapter
from airflow_batch_provider.exceptions import ConfigurationError

ENTRY_POINT_GROUP: Final = "airflow_batch_provider.adapters"

#: Built-in adapters by connection type: (module, class). Nothing is imported until asked for.
BUILTIN: Final[dict[str, tuple[str, str]]] = {
    "openai_batch": ("airflow_batch_provider.adapters.openai", "OpenAIBatchAdapter"),
    # The OpenAI provider's own connection type works too, so existing connections can be reused.
    "openai": ("airflow_batch_provider.adapters.openai", "OpenAIBatchAdapter"),
    "anthropic_batch": ("airflow_batch_provider.adapters.anthropic", "AnthropicBatchAdapter"),
    "bedrock_batch": ("airflow_batch_provider.adapters.bedrock", "BedrockBatchAdapter"),
    "gemini_batch": ("airflow_batch_provider.adapters.gemini", "GeminiBatchAdapter"),
    "vllm_kubernetes": ("airflow_batch_provider.adapters.vllm", "VllmKubernetesAdapter"),
}


@cache
def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_conn_types() -> list[str]:
    """Return every connection type an adapter is registered for."""
    return sorted(set(BUILTIN) | set(_entry_points()))


def adapter_class(conn_type: str) -> type[BatchAdapter]:
    """Return the adapter class for a connection type, importing its module now.

    :param conn_type: the Airflow connection type
    :raises ConfigurationError: no adapter is registered for it
    """
    if conn_type in BUILTIN:
        module_name, class_name = BUILTIN[conn_type]
    elif conn_type in _entry_points():
        module_name, _, class_name = _entry_points()[conn_type].partition(":")
    else:
        raise ConfigurationError(
            f"no batch adapter for connection type {conn_type!r}; known: {', '.join(known_conn_types())}. "
            f"Set the connection's type to one of them, or register an adapter under the "
            f"{ENTRY_POINT_GROUP!r} entry-point group."
        )
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, BatchAdapter)):
        raise ConfigurationError(f"{module_name}:{class_name} is not a BatchAdapter subclass.")
    return cls


def providers_accepting(kind: str) -> list[str]:
    """Return the names of the built-in (and registered) adapters that accept a request kind.

    :param kind: the request kind (``chat``, ``embedding``, ``response``, ``moderation``)
    """
    names: set[str] = set()
    for conn_type in known_conn_types():
        try:
            cls = adapter_class(conn_type)
        except (ConfigurationError, ImportError, AttributeError):
            continue
        if kind in cls.kinds:
            names.add(cls.name)
    return sorted(names)
