"""The registry's entries: connection type -> adapter, hook and aliases, imported lazily.

A leaf module: it imports no adapter, no hook and not :mod:`~airflow_batch_provider.adapters.base`
(modules are named as strings and imported when asked for), so the contract module can ask it
which providers accept a request kind without an import circle, and ``get_provider_info`` can
list the connection types without importing an adapter.

Third-party adapters register through the ``airflow_batch_provider.adapters`` entry-point group
(name = connection type, value = ``module:Class``); they get the generic hook.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import Any, Final

from airflow_batch_provider.exceptions import ConfigurationError

ENTRY_POINT_GROUP: Final = "airflow_batch_provider.adapters"
#: The hook of a connection type whose entry names none: it builds settings from the connection.
GENERIC_HOOK: Final = "airflow_batch_provider.hooks.batch.BatchHook"


@dataclass(frozen=True)
class Registration:
    """One registry entry: how a connection type is served.

    :param adapter: the adapter class, ``module:Class`` (imported when first asked for)
    :param hook: the hook class, ``module.Class`` (what Airflow's connection form names)
    :param hook_name: the connection type's name in Airflow's connection form
    :param aliases: other connection types served the same way (their connections are reused)
    """

    adapter: str
    hook: str = GENERIC_HOOK
    hook_name: str = "LLM Batch"
    aliases: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        """The adapter's module."""
        return self.adapter.partition(":")[0]

    @property
    def class_name(self) -> str:
        """The adapter's class name."""
        return self.adapter.partition(":")[2]


#: Built-in providers by connection type. One entry per provider; nothing is imported until asked for.
BUILTIN: Final[dict[str, Registration]] = {
    "openai_batch": Registration(
        "airflow_batch_provider.adapters.openai:OpenAIBatchAdapter",
        "airflow_batch_provider.hooks.batch.OpenAIBatchHook",
        "OpenAI Batch",
        # The OpenAI provider's own connection type works too, so existing connections can be reused.
        aliases=("openai",),
    ),
    "anthropic_batch": Registration(
        "airflow_batch_provider.adapters.anthropic:AnthropicBatchAdapter",
        "airflow_batch_provider.hooks.anthropic.AnthropicBatchHook",
        "Anthropic Batch",
    ),
    "gemini_batch": Registration(
        "airflow_batch_provider.adapters.gemini:GeminiBatchAdapter",
        "airflow_batch_provider.hooks.gemini.GeminiBatchHook",
        "Gemini Batch",
    ),
    "bedrock_batch": Registration(
        "airflow_batch_provider.adapters.bedrock:BedrockBatchAdapter",
        "airflow_batch_provider.hooks.bedrock.BedrockBatchHook",
        "Amazon Bedrock Batch",
    ),
    "vllm_kubernetes": Registration(
        "airflow_batch_provider.adapters.vllm:VllmKubernetesAdapter",
        "airflow_batch_provider.hooks.vllm_kubernetes.VllmKubernetesHook",
        "vLLM on Kubernetes",
    ),
}


@cache
def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _aliases() -> dict[str, str]:
    return {alias: conn_type for conn_type, entry in BUILTIN.items() for alias in entry.aliases}


def registrations() -> dict[str, Registration]:
    """Every registered connection type (aliases not repeated): the built-in ones, then the entry points."""
    found = {name: Registration(value) for name, value in _entry_points().items()}
    return {**found, **BUILTIN}


def known_conn_types() -> list[str]:
    """Return every connection type an adapter is registered for (aliases included)."""
    return sorted(set(registrations()) | set(_aliases()))


def primary_conn_type(conn_type: str) -> str:
    """The registered connection type an alias stands for (itself when it is no alias).

    :param conn_type: the Airflow connection type
    """
    return _aliases().get(conn_type, conn_type)


def registration(conn_type: str) -> Registration:
    """Return the registry entry of a connection type (or of the type an alias stands for).

    :param conn_type: the Airflow connection type
    :raises ConfigurationError: no adapter is registered for it
    """
    found = registrations().get(primary_conn_type(conn_type))
    if found is None:
        raise ConfigurationError(
            f"no batch adapter for connection type {conn_type!r}; known: {', '.join(known_conn_types())}. "
            f"Set the connection's type to one of them, or register an adapter under the "
            f"{ENTRY_POINT_GROUP!r} entry-point group."
        )
    return found


def load_adapter(conn_type: str) -> Any:
    """Import and return what the entry of ``conn_type`` names (checked by the registry, not here).

    :param conn_type: the Airflow connection type
    :raises ConfigurationError: no adapter is registered for it
    """
    entry = registration(conn_type)
    return getattr(importlib.import_module(entry.module), entry.class_name)


def providers_accepting(kind: str) -> list[str]:
    """Return the names of the registered adapters that accept a request kind.

    :param kind: the request kind (``chat``, ``embedding``, ``response``, ``moderation``)
    """
    names: set[str] = set()
    for conn_type in registrations():
        try:
            cls = load_adapter(conn_type)
        except (ConfigurationError, ImportError, AttributeError):
            continue
        if kind in getattr(cls, "kinds", ()):
            names.add(str(cls.name))
    return sorted(names)
