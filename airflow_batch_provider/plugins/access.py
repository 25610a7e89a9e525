"""Who may see and act on what on the LLM batch page: Airflow's auth manager decides, per DAG.

A ledger run records the DAG that ran it (``abp_runs.dag_id``). The page shows a run, its items,
errors and cost only to a user the auth manager lets read that DAG's runs (``GET`` on the DAG's
``RUN`` entity, as Airflow's own DAG-run routes ask), and lets a user act on a workload's review
queue only with edit permission (``PUT``) on every DAG that ran the workload. A run recorded
without a DAG (a ledger written before the column existed, or a script) is treated as belonging
to no particular DAG: only a user allowed on *all* DAGs sees it, the way the auth managers answer
a question asked with no DAG id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser

#: ``GET``: read the DAG's runs; ``PUT``: edit the DAG (the review actions); ``POST``: trigger a
#: run of the DAG (a re-drive "now").
Method = Literal["GET", "PUT", "POST"]


class Access(Protocol):
    """What one request's user may do."""

    @property
    def actor(self) -> str:
        """The user's name, as the audit table records it."""
        ...

    def allowed(self, method: Method, dag_id: str | None) -> bool:
        """Whether the user may read (``GET``) the runs of, edit (``PUT``), or trigger (``POST``) a DAG.

        :param method: ``GET``, ``PUT`` or ``POST``
        :param dag_id: the DAG; ``None``: no particular DAG (allowed only to a user allowed on all)
        """
        ...


def allowed_all(access: Access, method: Method, dag_ids: Iterable[str | None]) -> bool:
    """Whether the user may ``method`` every one of ``dag_ids`` (and there is at least one).

    :param access: the user's access
    :param method: ``GET``, ``PUT`` or ``POST``
    :param dag_ids: the DAGs
    """
    wanted = set(dag_ids)
    return bool(wanted) and all(access.allowed(method, d) for d in wanted)


@dataclass(frozen=True)
class StaticAccess:
    """Access from fixed lists: for a server without Airflow's login, scripts and tests.

    :param actor: the user's name
    :param read: the DAGs whose runs may be read; ``None``: every DAG (and runs with no DAG)
    :param edit: the DAGs that may be edited and triggered; ``None``: every DAG
    """

    actor: str
    read: frozenset[str] | None = None
    edit: frozenset[str] | None = frozenset()

    def allowed(self, method: Method, dag_id: str | None) -> bool:
        """Whether the lists allow it (see :meth:`Access.allowed`).

        :param method: ``GET``, ``PUT`` or ``POST``
        :param dag_id: the DAG, or ``None``
        """
        granted = self.read if method == "GET" else self.edit
        if granted is None:
            return True
        return dag_id is not None and dag_id in granted


@dataclass
class AirflowAccess:
    """Access as Airflow's configured auth manager answers it, cached for one request.

    :param user: the logged-in user (from Airflow's ``get_user`` dependency)
    """

    user: BaseUser
    _answers: dict[tuple[Method, str | None], bool] = field(default_factory=dict, repr=False)

    @property
    def actor(self) -> str:
        """The user's name."""
        return str(self.user.get_name())

    def allowed(self, method: Method, dag_id: str | None) -> bool:
        """Ask the auth manager (see :meth:`Access.allowed`).

        :param method: ``GET``, ``PUT`` or ``POST``
        :param dag_id: the DAG, or ``None``
        """
        key = (method, dag_id)
        if key not in self._answers:
            self._answers[key] = _ask_auth_manager(self.user, method, dag_id)
        return self._answers[key]


def _ask_auth_manager(user: BaseUser, method: Method, dag_id: str | None) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    details = None if dag_id is None else DagDetails(id=dag_id, team_name=_team_of(dag_id))
    return bool(
        get_auth_manager().is_authorized_dag(
            method=method,
            # reading or triggering: the DAG's runs; the review actions: the DAG itself, as editing it
            access_entity=None if method == "PUT" else DagAccessEntity.RUN,
            details=details,
            user=user,
        )
    )


def _team_of(dag_id: str) -> str | None:
    """The team owning a DAG in a multi-team deployment (``None`` otherwise), as Airflow asks it."""
    from airflow.providers.common.compat.sdk import conf

    if not conf.getboolean("core", "multi_team", fallback=False):
        return None
    from airflow.models.dag import DagModel

    team: str | None = DagModel.get_team_name(dag_id)
    return team


def readable(access: Access, dag_ids: Iterable[str | None]) -> set[str | None]:
    """The subset of ``dag_ids`` whose runs the user may read.

    :param access: the user's access
    :param dag_ids: DAG ids (``None``: runs recorded without one)
    """
    return {d for d in set(dag_ids) if access.allowed("GET", d)}
