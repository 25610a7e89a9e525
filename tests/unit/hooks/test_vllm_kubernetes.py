"""The ``vllm_kubernetes`` connection type (``hooks.vllm_kubernetes``): its pod settings and its test button.

The button checks what a worker can check without a cluster: the pod settings parse, and the
exchange folder the pods share is writable from here. The pods themselves run in
``tests/unit/operators/test_vllm_pod.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.hooks.vllm_kubernetes import VllmKubernetesHook


def connection(monkeypatch: pytest.MonkeyPatch, **extra: Any) -> VllmKubernetesHook:
    monkeypatch.setenv("AIRFLOW_CONN_VLLM_HOOK", json.dumps({"conn_type": "vllm_kubernetes", "extra": extra}))
    return VllmKubernetesHook("vllm_hook")


def test_the_pod_settings_are_the_connections_extras(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hook = connection(
        monkeypatch, namespace="llm", gpu_count=2, gpu_type="L4", exchange_path=str(tmp_path), image="vllm:1"
    )
    settings = hook.pod_settings()
    assert (settings.namespace, settings.gpu_count, settings.gpu_type, settings.image) == (
        "llm",
        2,
        "L4",
        "vllm:1",
    )


def test_the_test_button_says_which_pods_run_and_that_the_exchange_folder_is_writable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hook = connection(monkeypatch, namespace="llm", gpu_type="L4", exchange_path=f"file://{tmp_path}")
    ok, message = hook.test_connection()
    assert ok, message
    assert "namespace llm" in message and "1 L4 GPU(s)" in message
    assert f"exchange folder {tmp_path} is writable" in message
    assert list(tmp_path.iterdir()) == []  # the probe's file is gone


def test_the_test_button_says_no_when_the_workers_cannot_write_the_exchange_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    unmounted = tmp_path / "not-mounted-here"
    ok, message = connection(monkeypatch, exchange_path=str(unmounted)).test_connection()
    assert not ok and "FileNotFoundError" in message and str(unmounted) in message, message
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    ok, message = connection(monkeypatch, exchange_path=str(a_file)).test_connection()
    assert not ok and "NotADirectoryError" in message, message


def test_the_test_button_says_no_to_a_typo_and_to_a_missing_exchange_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ok, message = connection(monkeypatch, namespce="llm", exchange_path=str(tmp_path)).test_connection()
    assert not ok and "namespce" in message, message
    ok, message = connection(monkeypatch).test_connection()
    assert not ok and "exchange_path" in message, message
