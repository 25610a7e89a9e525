from __future__ import annotations

import pytest

from airflow_batch_provider.core.names import check_workload, is_templated
from airflow_batch_provider.exceptions import ConfigurationError


@pytest.mark.parametrize("name", ["w", "nightly_feedback", "a.b-c_9", "9lives", "x" * 100])
def test_a_plain_workload_name_is_accepted(name: str) -> None:
    assert check_workload(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "../..",  # hostile input
        "..",
        "a..b",
        "a/b",
        "/abs",
        ".hidden",
        "-dash",
        "_under",
        "a b",
        "x" * 101,
        "é",
        "a\n",
        None,
        3,
    ],
)
def test_a_workload_name_that_could_leave_its_folder_or_break_a_key_is_refused(name: object) -> None:
    with pytest.raises(ConfigurationError, match=r"is not a valid workload name.*Rename it"):
        check_workload(name)


def test_a_template_is_recognised_so_that_it_is_checked_when_rendered() -> None:
    assert is_templated("{{ params.workload }}") and not is_templated("plain")
