"""A loopback Kubernetes API server for tests: the pod subset that ``KubernetesPodOperator`` uses.

It is a stand-in, not a cluster. It answers the calls the cncf-kubernetes provider's operator
(sync and deferrable) and its trigger make, through the real ``kubernetes`` and
``kubernetes_asyncio`` clients:

- ``POST /api/v1/namespaces/{ns}/pods``: the pod is stored and its first container's
  ``command + args`` starts at once as a local process, in a temporary folder, with the pod's
  ``env`` (``valueFrom.secretKeyRef`` read from :meth:`KubeApi.add_secret`). Volume mount paths
  are mapped to local folders: a ``hostPath`` volume to its path, anything else (``emptyDir``,
  ``secret``) to a fresh folder (a secret's keys become files). Every argument and env value that
  starts with a mount path is rewritten to the local folder.
- ``GET`` one pod, ``GET`` the list with a ``labelSelector`` (``k=v``, ``k!=v``, ``!k``, ANDed),
  strategic-merge ``PATCH`` of labels, ``DELETE`` (kills the process group).
- ``GET .../log`` with ``follow``, ``timestamps``, ``sinceSeconds``, ``tailLines`` and ``limitBytes``.
- ``GET .../events`` as an empty list; with ``watch`` it stays open for ``timeoutSeconds``.

Phases: ``Running`` while the process runs (with ``PodScheduled=True``), then ``Succeeded`` (exit 0)
or ``Failed``. A pod's ``activeDeadlineSeconds`` is enforced as the kubelet does: once its process
has run that long it is killed (exit 137) and the pod ends ``Failed`` with reason ``DeadlineExceeded``. :meth:`KubeApi.add_fault` makes the next pod whose labels match misbehave the way real
pods do: stay ``Pending`` unscheduled, sit in ``ImagePullBackOff``, be ``OOMKilled`` (exit 137)
or ``Evicted`` once its process has written something, or run with extra env (the stand-in
``vllm`` reads its own knobs from env). Everything the server saw is kept in :attr:`KubeApi.calls`
and :attr:`KubeApi.created` so tests can count pods per job.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

FaultKind = Literal[
    "pending",
    "image_pull_backoff",
    "image_pull_throttled",
    "oom_killed",
    "evicted",
    "deadline_exceeded",
    "env",
]


@dataclass(frozen=True)
class PodFault:
    """How one pod should misbehave.

    :param kind: ``pending`` (never scheduled), ``image_pull_backoff`` (the image does not exist),
        ``image_pull_throttled`` (``ErrImagePull`` for ``pull_retry_s`` seconds because the registry
        throttles pulls, as Docker Hub's rate limit does, then the pull succeeds), ``oom_killed`` or
        ``evicted`` (the process is killed once it has written ``after_lines`` output lines),
        ``deadline_exceeded`` (the kubelet's clock, scripted: once the process has written
        ``after_lines`` lines and been active ``after_s`` seconds, the pod is stopped as its
        ``activeDeadlineSeconds`` would stop it, reason ``DeadlineExceeded``, however slowly the
        machine got there), ``env`` (only ``env`` is added)
    :param match: labels the pod must carry for the fault to apply
    :param env: extra environment for the pod's process
    :param after_lines: for oom_killed/evicted: kill once this many lines are in ``watch_file``
    :param watch_file: an argument following this flag names the file to count lines in (``-o``)
    :param after_s: for deadline_exceeded: the least time the pod is active before it is stopped
    """

    kind: FaultKind
    match: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    after_lines: int = 0
    watch_file: str = "-o"
    pull_retry_s: float = 3.0
    after_s: float = 0.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _Pod:
    """One pod: its manifest, its local process and its log lines."""

    def __init__(self, api: KubeApi, manifest: dict[str, Any], fault: PodFault | None) -> None:
        self.api = api
        self.manifest = manifest
        self.fault = fault
        self.lock = threading.Condition()
        self.log: list[tuple[float, str]] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.folder = Path(tempfile.mkdtemp(prefix="kube-pod-", dir=api.root))
        self.exit_code: int | None = None
        self.reason: str | None = None
        self.started_at: str | None = None
        self.finished_at: str | None = None
        self.phase = "Pending"
        self.pod_reason: str | None = None
        self.pod_message: str | None = None
        self.waiting: dict[str, str] | None = {"reason": "ContainerCreating"}
        self.scheduled = True
        self.deleted = False

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    def container(self) -> dict[str, Any]:
        return dict(self.manifest["spec"]["containers"][0])

    def start(self) -> None:
        fault = self.fault
        if fault is not None and fault.kind == "pending":
            self.scheduled, self.waiting = False, None
            return
        if fault is not None and fault.kind == "image_pull_backoff":
            image = self.container().get("image", "")
            self.waiting = {
                "reason": "ImagePullBackOff",
                "message": f'Back-off pulling image "{image}": not found: manifest unknown',
            }
            return
        if fault is not None and fault.kind == "image_pull_throttled":
            image = self.container().get("image", "")
            self.waiting = {
                "reason": "ErrImagePull",
                "message": f'failed to pull image "{image}": 429 Too Many Requests: toomanyrequests: '
                "You have reached your pull rate limit",
            }
            timer = threading.Timer(fault.pull_retry_s, self._run)
            timer.daemon = True
            timer.start()
            return
        self._run()

    def _run(self) -> None:
        """Start the container's process (the image is there)."""
        with self.lock:  # a pod deleted while its image was being pulled never starts
            if self.deleted:
                return
            fault = self.fault
            mounts = self._mounts()
            c = self.container()
            argv = [self._map(str(a), mounts) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
            env = dict(self.api.base_env)
            for item in c.get("env") or []:
                if "value" in item:
                    env[item["name"]] = self._map(str(item.get("value") or ""), mounts)
                elif (ref := (item.get("valueFrom") or {}).get("secretKeyRef")) is not None:
                    env[item["name"]] = self.api.secrets[ref["name"]][ref["key"]]
            if fault is not None:
                env.update(fault.env)
            self.started_at = _now()
            self.proc = subprocess.Popen(
                argv,
                cwd=self.folder,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.phase, self.waiting = "Running", None
            threading.Thread(target=self._pump, daemon=True).start()
            active = self.manifest["spec"].get("activeDeadlineSeconds")
            if active:
                threading.Thread(target=self._expire, args=(float(active),), daemon=True).start()
            if fault is not None and fault.kind in ("oom_killed", "evicted", "deadline_exceeded"):
                target = argv[argv.index(fault.watch_file) + 1] if fault.watch_file in argv else None
                threading.Thread(target=self._kill_later, args=(fault, target), daemon=True).start()

    def _mounts(self) -> list[tuple[str, str]]:
        volumes = {v["name"]: v for v in self.manifest["spec"].get("volumes") or []}
        out: list[tuple[str, str]] = []
        for mount in self.container().get("volumeMounts") or []:
            volume = volumes.get(mount["name"], {})
            if "hostPath" in volume:
                local = Path(volume["hostPath"]["path"])
            else:
                local = self.folder / "volumes" / mount["name"]
                local.mkdir(parents=True, exist_ok=True)
                if "secret" in volume:
                    for key, value in self.api.secrets.get(volume["secret"]["secretName"], {}).items():
                        (local / key).write_text(value)
            out.append((mount["mountPath"].rstrip("/"), str(local)))
        out.sort(key=lambda pair: -len(pair[0]))
        return out

    @staticmethod
    def _map(value: str, mounts: list[tuple[str, str]]) -> str:
        for mount_path, local in mounts:
            if value == mount_path or value.startswith(mount_path + "/"):
                return local + value[len(mount_path) :]
        return value

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self.lock:
                self.log.append((time.time(), raw.decode("utf-8", "replace").rstrip("\n")))
                self.lock.notify_all()
        code = self.proc.wait()
        with self.lock:
            if self.exit_code is None:
                self.exit_code = code
                self.reason = "Completed" if code == 0 else "Error"
                self.finished_at = _now()
                self.phase = "Succeeded" if code == 0 else "Failed"
            self.lock.notify_all()

    def _kill_later(self, fault: PodFault, target: str | None) -> None:
        began = time.monotonic()
        while self.proc is not None and self.proc.poll() is None:
            lines = 0
            if target is not None and os.path.exists(target):
                with open(target, "rb") as fh:
                    lines = sum(1 for _ in fh)
            if lines >= fault.after_lines:
                break
            time.sleep(0.05)
        if fault.kind == "deadline_exceeded":
            time.sleep(max(0.0, fault.after_s - (time.monotonic() - began)))
            self._stop(
                "Error", "DeadlineExceeded", "Pod was active on the node longer than the specified deadline"
            )
        elif fault.kind == "oom_killed":
            self._stop("OOMKilled")
        else:
            self._stop("Error", "Evicted", "The node was low on resource: memory.")

    def _expire(self, seconds: float) -> None:
        """The kubelet's ``activeDeadlineSeconds``: stop the pod once it has been active that long."""
        with self.lock:
            self.lock.wait_for(lambda: self.exit_code is not None, timeout=seconds)
        self._stop(
            "Error", "DeadlineExceeded", "Pod was active on the node longer than the specified deadline"
        )

    def _stop(self, reason: str, pod_reason: str | None = None, message: str | None = None) -> None:
        """Kill the running process as Kubernetes would (exit 137), with the container's and pod's reason."""
        with self.lock:
            if self.exit_code is not None:
                return
            self.exit_code, self.finished_at = 137, _now()
            self.reason, self.phase = reason, "Failed"
            self.pod_reason, self.pod_message = pod_reason, message
            self.lock.notify_all()
        self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def running(self) -> bool:
        return self.phase in ("Pending", "Running") and not self.deleted

    def body(self) -> dict[str, Any]:
        with self.lock:
            c = self.container()
            state: dict[str, Any]
            if self.exit_code is not None:
                state = {
                    "terminated": {
                        "exitCode": self.exit_code,
                        "reason": self.reason,
                        "startedAt": self.started_at,
                        "finishedAt": self.finished_at,
                        "containerID": f"local://{self.name}",
                    }
                }
            elif self.waiting is not None:
                state = {"waiting": dict(self.waiting)}
            else:
                state = {"running": {"startedAt": self.started_at}}
            status: dict[str, Any] = {
                "phase": self.phase,
                "conditions": [
                    {"type": "PodScheduled", "status": "True" if self.scheduled else "False", "reason": None}
                ],
                "startTime": self.manifest["metadata"]["creationTimestamp"] if self.scheduled else None,
            }
            if self.pod_reason:
                status["reason"] = self.pod_reason
                status["message"] = self.pod_message
            if self.scheduled:
                status["containerStatuses"] = [
                    {
                        "name": c["name"],
                        "image": c.get("image") or "",
                        "imageID": "",
                        "ready": self.phase == "Running",
                        "restartCount": 0,
                        "started": self.phase == "Running",
                        "state": state,
                    }
                ]
            else:
                status["conditions"][0]["reason"] = "Unschedulable"
            return {**self.manifest, "status": status}


class KubeApi:
    """The server's state. Use :func:`run_kube_api` to start one.

    :param root: folder for the pods' working folders
    :param base_env: environment every pod process starts with (before the pod's own env)
    """

    def __init__(self, root: Path, base_env: Mapping[str, str]) -> None:
        self.root = root
        self.base_env = dict(base_env)
        self.pods: dict[tuple[str, str], _Pod] = {}
        self.secrets: dict[str, dict[str, str]] = {}
        self.faults: list[PodFault] = []
        self.calls: list[tuple[str, str]] = []
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.lock = threading.Lock()
        self.url = ""

    def add_secret(self, name: str, data: Mapping[str, str]) -> None:
        """Register a Secret's data for ``secretKeyRef`` env and secret volumes.

        :param name: the secret's name
        :param data: its keys and (plain) values
        """
        self.secrets[name] = dict(data)

    def add_fault(self, fault: PodFault) -> None:
        """Make the next created pod whose labels match misbehave (used once).

        :param fault: what it does
        """
        with self.lock:
            self.faults.append(fault)

    def kubeconfig(self) -> dict[str, Any]:
        """The smallest kubeconfig that points the clients at this server."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "loopback",
            "clusters": [{"name": "loopback", "cluster": {"server": self.url}}],
            "users": [{"name": "loopback", "user": {"token": "loopback-token"}}],
            "contexts": [{"name": "loopback", "context": {"cluster": "loopback", "user": "loopback"}}],
        }

    def created_for(self, label: str, value: str) -> list[dict[str, Any]]:
        """Manifests of every pod ever created with ``label=value``.

        :param label: the label key
        :param value: its value
        """
        return [m for m in self.created if (m["metadata"].get("labels") or {}).get(label) == value]

    def live_pods(self) -> list[str]:
        """Names of pods that exist now (not deleted)."""
        with self.lock:
            return [p.name for p in self.pods.values() if not p.deleted]

    def close(self) -> None:
        """Kill every pod process."""
        for pod in list(self.pods.values()):
            pod.kill()

    # -- request handling ----------------------------------------------------------------------

    def create(self, ns: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        meta = body.setdefault("metadata", {})
        name = meta.get("name") or f"{meta.get('generateName', 'pod-')}{uuid.uuid4().hex[:5]}"
        with self.lock:
            if (ns, name) in self.pods and not self.pods[(ns, name)].deleted:
                return 409, _status(409, "AlreadyExists", f'pods "{name}" already exists')
            meta.update(
                name=name,
                namespace=ns,
                uid=str(uuid.uuid4()),
                creationTimestamp=_now(),
                resourceVersion=str(len(self.created) + 1),
            )
            labels = meta.get("labels") or {}
            fault = next(
                (f for f in self.faults if all(labels.get(k) == v for k, v in f.match.items())), None
            )
            if fault is not None:
                self.faults.remove(fault)
            pod = _Pod(self, body, fault)
            self.pods[(ns, name)] = pod
            self.created.append(json.loads(json.dumps(body)))
        pod.start()
        return 201, pod.body()

    def find(self, ns: str, name: str) -> _Pod | None:
        pod = self.pods.get((ns, name))
        return None if pod is None or pod.deleted else pod

    def list(self, ns: str, selector: str) -> dict[str, Any]:
        with self.lock:
            pods = [p for (n, _), p in self.pods.items() if n == ns and not p.deleted]
        items = [p.body() for p in pods if _selects(selector, p.manifest["metadata"].get("labels") or {})]
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}

    def delete(self, pod: _Pod) -> dict[str, Any]:
        with pod.lock:
            pod.deleted = True
            if pod.exit_code is None and pod.proc is not None:
                pod.exit_code, pod.reason, pod.finished_at, pod.phase = 137, "Error", _now(), "Failed"
            pod.lock.notify_all()
        pod.kill()
        self.deleted.append(pod.name)
        return pod.body()


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}  # fmt: skip


def _selects(selector: str, labels: Mapping[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if term.startswith("!"):
            if term[1:] in labels:
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        else:
            key, _, value = term.replace("==", "=").partition("=")
            if labels.get(key) != value:
                return False
    return True


def _true(query: Mapping[str, list[str]], name: str) -> bool:
    return (query.get(name) or ["false"])[0].lower() == "true"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Keep quiet."""

    def _send(self, code: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        size = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(size) if size else b""
        return json.loads(raw) if raw.strip() else {}

    def _route(self, method: str) -> None:
        api = self.server.api
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        api.calls.append((method, self.path))
        body = self._body() if method in ("POST", "PATCH", "DELETE") else {}
        if parts[:3] != ["api", "v1", "namespaces"] or len(parts) < 5:
            self._send(404, _status(404, "NotFound", f"no route {url.path}"))
            return
        ns, kind, rest = parts[3], parts[4], parts[5:]
        if kind == "events":
            if _true(query, "watch"):
                self._hold_watch(float((query.get("timeoutSeconds") or ["1"])[0]))
                return
            self._send(200, {"kind": "EventList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                             "items": []})  # fmt: skip
            return
        if kind != "pods":
            self._send(404, _status(404, "NotFound", f"no {kind} here"))
            return
        if not rest:
            if method == "POST":
                code, out = api.create(ns, body)
                self._send(code, out)
            else:
                self._send(200, api.list(ns, (query.get("labelSelector") or [""])[0]))
            return
        pod = api.find(ns, rest[0])
        if pod is None:
            self._send(404, _status(404, "NotFound", f'pods "{rest[0]}" not found'))
            return
        if len(rest) > 1 and rest[1] == "log":
            self._stream_log(pod, query)
        elif method == "GET":
            self._send(200, pod.body())
        elif method == "PATCH":
            labels = (body.get("metadata") or {}).get("labels") or {}
            pod.manifest["metadata"].setdefault("labels", {}).update(labels)
            self._send(200, pod.body())
        elif method == "DELETE":
            self._send(200, api.delete(pod))
        else:
            self._send(405, _status(405, "MethodNotAllowed", method))

    def _hold_watch(self, seconds: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        time.sleep(min(seconds, 5.0))
        self.wfile.write(b"0\r\n\r\n")

    def _stream_log(self, pod: _Pod, query: Mapping[str, list[str]]) -> None:
        follow, stamps = _true(query, "follow"), _true(query, "timestamps")
        since = float((query.get("sinceSeconds") or ["0"])[0]) or None
        cutoff = time.time() - since if since else 0.0
        tail = int((query.get("tailLines") or ["0"])[0]) or None
        budget = int((query.get("limitBytes") or ["0"])[0]) or None
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        while True:
            with pod.lock:
                lines = pod.log[sent:]
                sent = len(pod.log)
                done = pod.exit_code is not None or pod.deleted or not follow
                if not lines and not done:
                    pod.lock.wait(0.5)
                    continue
            if tail is not None:  # the last lines of what is there now (first read only)
                lines, tail = lines[-tail:], None
            for ts, text in lines:
                if ts < cutoff:
                    continue
                line = f"{_stamp(ts)} {text}\n" if stamps else f"{text}\n"
                data = line.encode()
                if budget is not None:  # limitBytes: stop once that much was sent
                    data, budget = data[:budget], budget - len(data)
                if not data:
                    break
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
            if budget is not None and budget <= 0:
                break
            if done:
                with pod.lock:
                    if len(pod.log) == sent:
                        break
        self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:
        """Route a GET."""
        self._route("GET")

    def do_POST(self) -> None:
        """Route a POST."""
        self._route("POST")

    def do_PATCH(self) -> None:
        """Route a PATCH."""
        self._route("PATCH")

    def do_DELETE(self) -> None:
        """Route a DELETE."""
        self._route("DELETE")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: KubeApi


@contextmanager
def run_kube_api(root: Path, base_env: Mapping[str, str] | None = None) -> Iterator[KubeApi]:
    """Serve a :class:`KubeApi` on 127.0.0.1 (a free port) for the ``with`` block.

    :param root: folder for the pods' working folders (created)
    :param base_env: environment every pod process starts with (default: a copy of ours)
    """
    root.mkdir(parents=True, exist_ok=True)
    api = KubeApi(root, base_env if base_env is not None else os.environ)
    server = _Server(("127.0.0.1", 0), _Handler)
    server.api = api
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        api.close()
        server.shutdown()
        server.server_close()
        shutil.rmtree(root, ignore_errors=True)
