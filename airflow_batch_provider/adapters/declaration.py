"""What one provider declares about itself, once: the frozen dataclass its adapter carries.

Everything the layers below and beside the adapter need to know of a provider is here, so that
``core/`` stays provider-free (the facts are passed in) and a new provider is one adapter module
plus one registry entry (:mod:`airflow_batch_provider.adapters.entries`). This module never
imports a provider SDK nor Airflow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from airflow_batch_provider.core.batch import Limits

#: Where a provider's batches run: a batch API, or pods of the self-hosted lane.
Lane = Literal["provider", "pod"]


@dataclass(frozen=True)
class ProviderDeclaration:
    """One provider's facts, declared on its adapter class (``declaration``).

    :param name: the provider's name (ledger rows, :class:`~airflow_batch_provider.adapters.base.BatchRef`,
        the price table, console templates)
    :param conn_type: the Airflow connection type the adapter serves (the registry's key)
    :param limits: what one job accepts
    :param lane: ``provider`` (a batch API) or ``pod`` (the self-hosted vLLM lane)
    :param retryable_errors: the provider's error types and codes that mean "not processed now,
        send it again later", whatever the HTTP status (the one retry table is their union)
    :param console_url: the provider's console page of one batch (``{batch_id}``, ``{region}``),
        shown as the tasks' "Provider batch" link; ``None``: no shipped page
    :param console_hosts: the API hosts whose batches :attr:`console_url` shows (no host: the
        SDK's default); a batch of another host (a proxy, a compatible server) gets no link
    :param compare_model: the model the GPU planner prices this provider at (its cheap batch
        tier); ``None``: the planner does not compare with it
    """

    name: str
    conn_type: str
    limits: Limits
    lane: Lane = "provider"
    retryable_errors: frozenset[str] = frozenset()
    console_url: str | None = None
    console_hosts: frozenset[str] = field(default_factory=frozenset)
    compare_model: str | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.conn_type:
            raise ValueError(
                f"provider declaration name={self.name!r}, conn_type={self.conn_type!r}: both must be "
                "non-empty (the name keys the price table and the ledger, the type the registry)."
            )
        if self.console_hosts and self.console_url is None:
            raise ValueError(
                f"provider {self.name!r} names console hosts {sorted(self.console_hosts)} but no "
                "console_url; give the page template, or drop the hosts."
            )


def union_of_words(declarations: Mapping[str, ProviderDeclaration]) -> frozenset[str]:
    """Every retryable error word of the declarations, in one set.

    :param declarations: provider name -> declaration
    """
    return frozenset().union(*(d.retryable_errors for d in declarations.values()))
