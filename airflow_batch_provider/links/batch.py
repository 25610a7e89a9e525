"""Extra links on the batch tasks: the provider's console page of a batch, the run's LLM batch page.

Airflow 3 shows an operator's extra link from an XCom stored under the link's ``xcom_key``; it
pushes one at the end of every try, but a deferred task has not ended. So the submit and wait
tasks call :meth:`BatchConsoleLink.persist` and :meth:`LedgerRunLink.persist` themselves as soon
as they know the batch, *before* they defer; the UI then shows the links while the batch runs.

Console pages, by provider: each adapter declares its own (``console_url``, with ``{batch_id}``
and ``{region}`` filled in, and the ``console_hosts`` it belongs to; see
:class:`~airflow_batch_provider.adapters.declaration.ProviderDeclaration`); ``[batch_provider]
console_urls`` — a JSON object of provider name to such a template — adds or replaces them, e.g.
to point at a gateway or the emulator. Shipped today::

    openai   https://platform.openai.com/batches/{batch_id}   (only for api.openai.com)

A shipped template belongs to the provider's own API host: a batch created through another
OpenAI-compatible host (Azure, a LiteLLM proxy, the emulator) gets the run's LLM batch page, never
platform.openai.com, unless ``console_urls`` names a template for it.
The other providers have no default here: their console addresses depend on the workspace,
project or account, so a deployment sets them in ``console_urls``. A provider without a template
gets the run's LLM batch page instead, which lists every batch of the run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final
from urllib.parse import quote, urlencode, urlsplit

from airflow.sdk import BaseOperatorLink

from airflow_batch_provider.adapters.registry import console_hosts, console_urls

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

#: Where the plugin mounts the LLM batch page (see ``plugins.batch_progress.URL_PREFIX``).
PAGE_PREFIX: Final = "/llm-batch"
_REGION_IN_ARN = re.compile(r"^arn:[^:]+:[^:]+:([a-z0-9-]+):")


def console_templates() -> dict[str, str]:
    """The console templates the adapters declare, with ``[batch_provider] console_urls`` over them."""
    from airflow_batch_provider.settings import get_setting

    raw = get_setting("console_urls", "")
    extra: dict[str, str] = {}
    if raw:
        loaded = json.loads(raw)
        if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
            raise ValueError(
                "[batch_provider] console_urls must be a JSON object of provider name to URL template "
                f"with {{batch_id}} (and optionally {{region}}); got {raw[:120]!r}"
            )
        extra = {str(k): v for k, v in loaded.items()}
    return {**console_urls(), **extra}


def _shipped_host(provider: str, base_url: str | None) -> bool:
    """Say whether ``base_url`` (``None``: the SDK's default) is the provider's own API host."""
    if not base_url:
        return True
    host = urlsplit(base_url if "://" in base_url else f"https://{base_url}").hostname or ""
    return host in console_hosts().get(provider, frozenset())


def console_url(
    provider: str,
    batch_id: str,
    *,
    region: str | None = None,
    templates: Mapping[str, str] | None = None,
    base_url: str | None = None,
) -> str | None:
    """The provider's console page of one batch, or ``None`` when no template is known.

    :param provider: provider (adapter) name, e.g. ``openai``
    :param batch_id: the provider's batch id (a Bedrock job ARN carries its region)
    :param region: the region, where the provider has regions (else taken from an ARN)
    :param templates: templates by provider (default: :func:`console_templates`)
    :param base_url: the connection's API host (``None``: the SDK's default); a shipped template is
        used only for its own host
    """
    known = templates if templates is not None else console_templates()
    template = known.get(provider)
    if not template or not batch_id:
        return None
    if template == console_urls().get(provider) and not _shipped_host(provider, base_url):
        return None  # another host's batch: the shipped console would show someone else's account
    found = _REGION_IN_ARN.match(batch_id)
    region = region or (found.group(1) if found else "")
    return template.format(batch_id=quote(batch_id, safe=""), region=quote(region, safe=""))


def run_page_url(dag_id: str, run_id: str, base_url: str | None = None) -> str:
    """The LLM batch page of one DAG run (the same page as the DAG run's "LLM batch" tab).

    :param dag_id: the DAG
    :param run_id: the run
    :param base_url: the Airflow UI's base URL (default: ``[api] base_url``; a path is kept)
    """
    if base_url is None:
        from airflow.providers.common.compat.sdk import conf

        base_url = conf.get("api", "base_url", fallback="") or ""
    return f"{base_url.rstrip('/')}{PAGE_PREFIX}/dag-run?{urlencode({'dag_id': dag_id, 'run_id': run_id})}"


class _StoredLink(BaseOperatorLink):
    """A link whose URL the task stores in XCom under :attr:`xcom_key` (read back as it is)."""

    name: ClassVar[str] = ""  # type: ignore[misc]

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        """The stored URL, or ``""`` while the task has not stored one.

        :param operator: the task
        :param ti_key: the task instance
        """
        from airflow.sdk.execution_time.xcom import XCom

        value = XCom.get_value(key=self.xcom_key, ti_key=ti_key)
        return value if isinstance(value, str) else ""

    @classmethod
    def _push(cls, context: Mapping[str, Any], url: str) -> str:
        context["ti"].xcom_push(key=cls().xcom_key, value=url)
        return url


class BatchConsoleLink(_StoredLink):
    """The "Provider batch" link: the provider's console page of the task's batch.

    A task that submitted or watches several batches links to the run's LLM batch page, which
    lists each with its own console link.
    """

    name: ClassVar[str] = "Provider batch"  # type: ignore[misc]

    @classmethod
    def persist(
        cls,
        context: Mapping[str, Any],
        *,
        provider: str,
        batch_ids: Sequence[str],
        region: str | None = None,
        base_url: str | None = None,
    ) -> str:
        """Store the link now (call it before deferring); returns the URL stored.

        :param context: the task's context
        :param provider: provider (adapter) name
        :param batch_ids: the task's provider batch ids
        :param region: the region, for providers with regions
        :param base_url: the connection's API host (``None``: the SDK's default)
        """
        one = len(batch_ids) == 1
        url = console_url(provider, batch_ids[0], region=region, base_url=base_url) if one else None
        if url is None:
            url = run_page_url(context["dag"].dag_id, context["run_id"])
        return cls._push(context, url)


class LedgerRunLink(_StoredLink):
    """The "LLM batch run" link: the run's page in the LLM batch UI (progress, cost, review queue)."""

    name: ClassVar[str] = "LLM batch run"  # type: ignore[misc]

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        """The run's page (needs nothing stored: the task instance names the DAG and the run).

        :param operator: the task
        :param ti_key: the task instance
        """
        return run_page_url(ti_key.dag_id, ti_key.run_id)

    @classmethod
    def persist(cls, context: Mapping[str, Any]) -> str:
        """Store the link now; returns the URL stored.

        :param context: the task's context
        """
        return cls._push(context, run_page_url(context["dag"].dag_id, context["run_id"]))
