"""Which lane a connection runs in: its adapter's ``runs_in_pod`` (read from the connection's type).

The group's ``lane`` says which lane to build: ``pod`` and ``provider`` without reading the
connection (so its id may be a template), ``auto`` by asking :func:`runs_in_pod` once when the
DAG is parsed (the connection's adapter declares ``runs_in_pod``). The pod lane builds
:func:`~airflow_batch_provider.operators.vllm_pod.pod_tasks` in place of upload, submit and
wait. Everything after (download, reconcile, resubmit, publish) is the same for every lane. When
the run starts, prepare (the first task that reads the connection) checks with
:func:`check_conn_lane` that the connection runs in the lane that was built, and the pod task
checks it again for its own connection.
"""

from __future__ import annotations

from airflow_batch_provider.adapters.registry import adapter_class
from airflow_batch_provider.core.names import is_templated
from airflow_batch_provider.core.options import BuiltLane, Lane, check_lane
from airflow_batch_provider.exceptions import ConfigurationError


def runs_in_pod(batch_conn_id: str) -> bool:
    """Whether the connection's adapter runs chunks as pod tasks (read when the DAG is parsed).

    A connection that cannot be read at parse time (not defined yet) means the provider lane,
    as before this lane existed.

    :param batch_conn_id: the batch connection id
    """
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn_type = BaseHook.get_connection(batch_conn_id).conn_type or ""
        return bool(getattr(adapter_class(conn_type), "runs_in_pod", False))
    except (AirflowNotFoundException, ConfigurationError):
        return False


def built_lane(lane: Lane, batch_conn_id: str) -> BuiltLane:
    """The lane to build: ``lane`` itself, or for ``auto`` the connection's (read now, at parse time).

    ``auto`` keeps the behaviour from before ``lane`` existed: a literal connection id is read when
    the DAG is parsed, and a templated one (or one not defined yet) means the provider lane.

    :param lane: ``auto``, ``provider`` or ``pod``
    :param batch_conn_id: the batch connection id (a template is not read)
    :raises ConfigurationError: an unknown lane
    """
    lane = check_lane(lane)
    if lane != "auto":
        return lane
    return "pod" if not is_templated(batch_conn_id) and runs_in_pod(batch_conn_id) else "provider"


def check_conn_lane(batch_conn_id: str, lane: BuiltLane) -> str:
    """Refuse a connection whose type does not run in the lane the group built; return its type.

    Called when the run starts, before anything is recorded, uploaded or paid: a ``pod`` lane
    given a batch API's connection would stage chunks no pod runs, a ``provider`` lane given a
    ``vllm_kubernetes`` one would ask a batch API of a cluster.

    :param batch_conn_id: the batch connection id (rendered)
    :param lane: the lane the group was built with
    :raises ConfigurationError: the connection's adapter runs in the other lane (or is unknown)
    """
    from airflow.sdk import BaseHook

    conn_type = BaseHook.get_connection(batch_conn_id).conn_type or ""
    in_pod = bool(getattr(adapter_class(conn_type), "runs_in_pod", False))
    if in_pod == (lane == "pod"):
        return conn_type
    other = "pod" if in_pod else "provider"
    wanted = "vllm_kubernetes" if lane == "pod" else "batch API (openai_batch, anthropic_batch, ...)"
    raise ConfigurationError(
        f"connection {batch_conn_id!r} is of type {conn_type!r}, which runs in the {other} lane, but "
        f"batch_inference_group built the {lane} lane for this DAG; the task stopped before submitting "
        f"anything. Point batch_conn_id (or the Variable its template reads) at a {wanted} connection, "
        f"or build the group with lane={other!r}."
    )
