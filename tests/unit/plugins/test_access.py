"""Who may see and act on what: the fixed-list access and the all-of rule for workloads."""

from __future__ import annotations

from airflow_batch_provider.plugins.access import StaticAccess, allowed_all, readable


def test_a_user_limited_to_some_dags_never_reaches_a_run_recorded_without_a_dag() -> None:
    scoped = StaticAccess("alice", read=frozenset({"dag_a"}), edit=frozenset({"dag_a"}))
    everything = StaticAccess("admin", read=None, edit=None)

    assert scoped.allowed("GET", "dag_a") and not scoped.allowed("GET", "dag_b")
    assert not scoped.allowed("GET", None)
    assert everything.allowed("GET", None) and everything.allowed("PUT", None)


def test_reading_does_not_grant_acting() -> None:
    viewer = StaticAccess("viv", read=None)

    assert viewer.allowed("GET", "dag_a")
    assert not viewer.allowed("PUT", "dag_a")


def test_a_workload_needs_every_one_of_its_dags_and_at_least_one() -> None:
    scoped = StaticAccess("alice", read=frozenset({"dag_a"}))

    assert allowed_all(scoped, "GET", {"dag_a"})
    assert not allowed_all(scoped, "GET", {"dag_a", "dag_b"})
    assert not allowed_all(scoped, "GET", {"dag_a", None})
    assert not allowed_all(StaticAccess("admin", read=None), "GET", set())


def test_readable_keeps_only_the_dags_the_user_may_read() -> None:
    dags = ["dag_a", "dag_b", None, "dag_b"]

    assert readable(StaticAccess("alice", read=frozenset({"dag_b"})), dags) == {"dag_b"}
    assert readable(StaticAccess("admin", read=None), dags) == {"dag_a", "dag_b", None}
