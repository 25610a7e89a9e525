"""The loopback Kubernetes API, driven by the real ``kubernetes`` client."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube_api import KubeApi, PodFault, run_kube_api

kubernetes = pytest.importorskip("kubernetes")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    with run_kube_api(tmp_path / "kube", dict(os.environ)) as server:
        yield server


@pytest.fixture
def core(api: KubeApi, tmp_path: Path) -> Any:
    from kubernetes import client, config

    path = tmp_path / "kubeconfig.json"
    path.write_text(json.dumps(api.kubeconfig()))
    return client.CoreV1Api(config.new_client_from_config(config_file=str(path)))


def pod(name: str, command: list[str], labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "base", "image": "x", "command": command}],
            **spec,
        },
    }


def wait_phase(core: Any, name: str, phases: set[str]) -> Any:
    for _ in range(400):
        found = core.read_namespaced_pod(name, "ns")
        if found.status.phase in phases:
            return found
        import time

        time.sleep(0.05)
    raise AssertionError(f"{name} never reached {phases}")


def test_label_selectors_and_equal_not_equal_and_absent_terms_are_anded(core: Any) -> None:
    core.create_namespaced_pod("ns", pod("a", ["true"], {"job": "1", "x": "y"}))
    core.create_namespaced_pod("ns", pod("b", ["true"], {"job": "2", "already_checked": "True"}))

    def names(sel: str) -> list[str]:
        return sorted(p.metadata.name for p in core.list_namespaced_pod("ns", label_selector=sel).items)

    assert names("job=1") == ["a"]
    assert names("already_checked!=True") == ["a"]
    assert names("!x") == ["b"]
    assert names("job=1,!x") == []


def test_a_pod_runs_its_command_with_its_env_and_secret_and_mounts_mapped_to_local_folders(
    api: KubeApi, core: Any, tmp_path: Path
) -> None:
    api.add_secret("s", {"token": "t0k"})
    host = tmp_path / "host"
    host.mkdir()
    spec = {
        "volumes": [
            {"name": "d", "hostPath": {"path": str(host)}},
            {"name": "s", "secret": {"secretName": "s"}},
        ],
    }
    # Arguments that start with a mount path are mapped (as a container sees them, a local process
    # could not): the script gets its paths as arguments.
    command = ["sh", "-c", 'echo "$A $TOKEN" > "$0"; cat "$1" >> "$0"', "/data/out.txt", "/secret/token"]
    body = pod("p", command, {}, **spec)
    body["spec"]["containers"][0]["env"] = [
        {"name": "A", "value": "1"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
    ]
    body["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "d", "mountPath": "/data"},
        {"name": "s", "mountPath": "/secret"},
    ]
    core.create_namespaced_pod("ns", body)
    done = wait_phase(core, "p", {"Succeeded", "Failed"})
    assert done.status.phase == "Succeeded"
    assert (host / "out.txt").read_text() == "1 t0k\nt0k"
    assert done.status.container_statuses[0].state.terminated.exit_code == 0


def test_logs_follow_until_exit_with_timestamps_and_a_missing_pod_is_a_404_status(core: Any) -> None:
    core.create_namespaced_pod("ns", pod("l", [sys.executable, "-c", "print('one'); print('two')"], {}))
    # streamed, as KPO reads it (with preloading, this client returns str(bytes) for any server)
    stream = core.read_namespaced_pod_log("l", "ns", container="base", follow=True, timestamps=True,
                                          _preload_content=False)  # fmt: skip
    lines = stream.data.decode().splitlines()
    assert [ln.split(" ", 1)[1] for ln in lines] == ["one", "two"]
    assert lines[0].split(" ", 1)[0].endswith("Z")
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("nope", "ns")
    assert err.value.status == 404 and json.loads(err.value.body)["reason"] == "NotFound"


def test_delete_kills_the_process_and_faults_apply_once_to_matching_pods(api: KubeApi, core: Any) -> None:
    api.add_fault(PodFault("pending", match={"job": "p"}))
    core.create_namespaced_pod("ns", pod("slow", ["sleep", "30"], {"job": "s"}))
    core.create_namespaced_pod("ns", pod("pend", ["true"], {"job": "p"}))
    pending = core.read_namespaced_pod("pend", "ns")
    assert pending.status.phase == "Pending" and pending.status.conditions[0].status == "False"
    core.create_namespaced_pod("ns", pod("pend2", ["true"], {"job": "p"}))
    assert wait_phase(core, "pend2", {"Succeeded"})
    core.delete_namespaced_pod("slow", "ns")
    assert "slow" in api.deleted and "slow" not in api.live_pods()
