"""Adapter registry: connection type -> adapter class, hook and lane, and the providers' facts.

The entries live in :mod:`airflow_batch_provider.adapters.entries` (one per provider, imported
lazily); each adapter class carries its :class:`~airflow_batch_provider.adapters.declaration.ProviderDeclaration`.
What the provider-free layers need of every provider (the retryable error words, the console
pages, the GPU planner's comparison models) is read here from those declarations and passed in.

Third-party adapters register through the ``airflow_batch_provider.adapters`` entry-point group
(name = connection type, value = ``module:Class``).
"""

from __future__ import annotations

from functools import cache

from airflow_batch_provider.adapters.base import BatchAdapter
from airflow_batch_provider.adapters.declaration import Lane, ProviderDeclaration, union_of_words
from airflow_batch_provider.adapters.entries import BUILTIN as BUILTIN
from airflow_batch_provider.adapters.entries import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from airflow_batch_provider.adapters.entries import known_conn_types as known_conn_types
from airflow_batch_provider.adapters.entries import load_adapter, registration, registrations
from airflow_batch_provider.adapters.entries import providers_accepting as providers_accepting
from airflow_batch_provider.core.ratelimit import TRANSPORT_ERRORS
from airflow_batch_provider.core.results import Outcome, classify_http_error
from airflow_batch_provider.exceptions import ConfigurationError


def adapter_class(conn_type: str) -> type[BatchAdapter]:
    """Return the adapter class for a connection type, importing its module now.

    :param conn_type: the Airflow connection type
    :raises ConfigurationError: no adapter is registered for it
    """
    cls = load_adapter(conn_type)
    if not (isinstance(cls, type) and issubclass(cls, BatchAdapter)):
        raise ConfigurationError(f"{registration(conn_type).adapter} is not a BatchAdapter subclass.")
    return cls


def declaration(conn_type: str) -> ProviderDeclaration:
    """Return the declaration of the provider that serves a connection type.

    :param conn_type: the Airflow connection type
    :raises ConfigurationError: no adapter is registered for it
    """
    return adapter_class(conn_type).declaration


def hook_path(conn_type: str) -> str:
    """Return the hook class (``module.Class``) that turns a connection of this type into settings.

    :param conn_type: the Airflow connection type
    :raises ConfigurationError: no adapter is registered for it
    """
    return registration(conn_type).hook


def lane(conn_type: str) -> Lane:
    """Return where batches of this connection type run (``provider`` or ``pod``).

    :param conn_type: the Airflow connection type
    :raises ConfigurationError: no adapter is registered for it
    """
    return declaration(conn_type).lane


def declarations() -> dict[str, ProviderDeclaration]:
    """Every importable registered provider's declaration, by provider name (built-in ones win)."""
    found: dict[str, ProviderDeclaration] = {}
    for conn_type in registrations():
        try:
            declared = declaration(conn_type)
        except (ConfigurationError, ImportError, AttributeError):
            continue
        found.setdefault(declared.name, declared)
    return found


@cache
def retryable_errors() -> frozenset[str]:
    """The one retry table's words: every provider's retryable error types, and the transport's."""
    return union_of_words(declarations()) | TRANSPORT_ERRORS


def retryable_errors_by_provider() -> dict[str, frozenset[str]]:
    """Each provider's retryable error words, and ``transport`` (what this package's clients report)."""
    return {
        **{name: d.retryable_errors for name, d in declarations().items() if d.retryable_errors},
        "transport": TRANSPORT_ERRORS,
    }


def console_urls() -> dict[str, str]:
    """The shipped console page templates, by provider name."""
    return {name: d.console_url for name, d in declarations().items() if d.console_url}


def console_hosts() -> dict[str, frozenset[str]]:
    """The API hosts whose batches each shipped console template shows, by provider name."""
    return {name: d.console_hosts for name, d in declarations().items() if d.console_hosts}


def compare_models() -> dict[str, str]:
    """The model the GPU planner compares each provider at, by provider name."""
    return {name: d.compare_model for name, d in declarations().items() if d.compare_model}


def classify_outcome(status: int | None, code: str | None = None) -> Outcome:
    """Map an item's HTTP status and error code to its outcome with the one retry table.

    :param status: HTTP status code of the item's response, if any
    :param code: provider error code or type, if any
    """
    return classify_http_error(status, code, retryable_errors())
