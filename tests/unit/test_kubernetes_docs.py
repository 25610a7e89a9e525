"""docs/kubernetes.md (the official Helm chart page) configures what the code accepts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_batch_provider.get_provider_info import get_provider_info

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md").read_text(encoding="utf-8")


def _values() -> dict[str, Any]:
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", PAGE, re.S) if "executor:" in b]
    assert len(blocks) == 1, "the page has one values block that sets the executor"
    return dict(blocks[0])


def test_the_values_run_a_triggerer_and_set_only_declared_options_without_a_password() -> None:
    values = _values()
    assert values["triggerer"]["enabled"] is True  # the wait tasks defer
    declared = get_provider_info()["config"]["batch_provider"]["options"]
    ours = values["config"]["batch_provider"]
    assert set(ours) <= set(declared), set(ours) - set(declared)
    assert not [name for name in ours if declared[name].get("sensitive")]  # a password goes in a Secret
    assert values["config"]["operators"]["default_deferrable"] == "True"


def test_the_page_passes_the_check_that_prepare_makes_under_its_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_batch_provider.operators.batch import check_distributed

    values = _values()
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", values["executor"])
    (ledger_conn_id,) = re.findall(r'ledger_conn_id="([^"]+)"', PAGE)
    env_names = {s["envName"] for s in values["secret"]}
    assert f"AIRFLOW_CONN_{ledger_conn_id.upper()}" in env_names  # the group names a connection the pods get
    (url,) = re.findall(r"secretKey: ledger\s+# (\S+)", PAGE)
    monkeypatch.setenv(f"AIRFLOW_CONN_{ledger_conn_id.upper()}", url.replace("<password>", "pw"))
    check_distributed(ledger_conn_id, values["config"]["batch_provider"]["staging_root"])
    from airflow_batch_provider.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError):  # and the check is live: the embedded ledger is refused
        check_distributed(None, values["config"]["batch_provider"]["staging_root"])
