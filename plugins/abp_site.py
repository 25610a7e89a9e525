"""A site plugin: what a team adds beside the provider, in Airflow's plugins folder.

Airflow imports every module of its plugins folder (``[core] plugins_folder``; ``make stack`` and
``docker-compose.yaml`` point it at this folder) and registers the ``AirflowPlugin`` subclasses it
finds. The provider's own plugin (the batch progress UI) ships inside the package and needs
nothing here; this file shows the two things a workload most often adds of its own:

- a **macro**, available in every template as ``macros.abp_site.run_cost(...)``: one line on a
  run's cost from what the publish task returned, e.g. in an e-mail or a Slack text::

      "{{ macros.abp_site.run_cost(ti.xcom_pull(task_ids='reviews.publish')) }}"

- a **notifier**, for :class:`~airflow_batch_provider.notifications.BatchAlerts`: Airflow puts
  the plugins folder on ``sys.path``, so a DAG imports it by its module name::

      from abp_site import JsonLinesNotifier

      alerts = BatchAlerts(notifiers=[JsonLinesNotifier(path="/opt/airflow/logs/batch-events.jsonl")])

Copy this file, rename the plugin and its module, and keep each piece small: the logic that is
the same for every site belongs in the provider.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk.bases.notifier import BaseNotifier


def _money(value: Any, places: int) -> str:
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return "n/a"
    return f"${amount:,.{places}f}"


def run_cost(published: Mapping[str, Any] | None) -> str:
    """Say in one line what a run cost, from the publish task's return value.

    :param published: what ``BatchPublishOperator`` returned (``paid_usd``,
        ``cost_per_usable_result_usd``, ``items_by_state``), or ``None`` before it ran
    """
    if not published:
        return "cost not known yet (the run has not published)"
    states = {k: int(v) for k, v in (published.get("items_by_state") or {}).items() if v}
    items = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    per = published.get("cost_per_usable_result_usd")
    line = f"{_money(published.get('paid_usd'), 2)} paid for {sum(states.values())} items"
    line += f" ({items})" if items else ""
    return line + (f", {_money(per, 4)} per usable result" if per is not None else "")


class JsonLinesNotifier(BaseNotifier):
    """Append each batch event to a JSON Lines file (a stand-in for a site's own channel).

    :param path: the file to append to (its folder must exist)
    """

    template_fields = ("path",)

    def __init__(self, *, path: str) -> None:
        super().__init__()
        self.path = path

    def notify(self, context: Any) -> None:
        """Write the event the alerts hand over (``batch_event``) as one line.

        :param context: the task's context plus ``batch_event``
        """
        event = context["batch_event"]
        line = json.dumps(event.as_dict(), sort_keys=True, default=str)
        with Path(self.path).open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")


class SitePlugin(AirflowPlugin):
    """The site's additions: the ``run_cost`` macro (notifiers need no registering)."""

    name = "abp_site"
    macros = [run_cost]
