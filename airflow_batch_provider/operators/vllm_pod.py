"""The pod task of the self-hosted lane: one ``vllm run-batch`` pod per job, exactly once.

:class:`VllmBatchPodOperator` is the cncf-kubernetes provider's ``KubernetesPodOperator`` with the
job's ledger row around it. It takes the place of submit and wait for a ``vllm_kubernetes``
connection; download, reconcile, resubmit and publish stay as they are.

- **Stage**: with ``file://`` staging the job's chunk is copied into the exchange volume the pod
  mounts (:meth:`VllmKubernetesAdapter.stage`); with ``s3://`` or ``gs://`` staging nothing is
  copied: the pod gets a presigned GET URL of the staged chunk and a presigned PUT URL of the
  job's output file (``round-<k>/output-<i>.jsonl``, where download would put it), signed here
  with the staging connection and valid ``presign_expiry_s`` (default one day), and runs
  ``vllm run-batch -i <url> -o <url>``: no object-store credential enters the pod, and the URLs
  are masked in the task log. The job is marked submitted with ``batch_id = pod:<key>`` before
  any pod exists.
- **One pod per job**: the pod carries the label ``batch-job=<idempotency key>``. A retried or
  cleared task re-attaches to the running pod of its job (KPO's label search, which includes
  that label); a pod that finished while no worker watched is read and deleted, not run again;
  a job whose pod outcome the ledger already holds does not start a pod at all.
- **Deadline**: with a run deadline the pod carries ``activeDeadlineSeconds`` up to it (minus the
  margin), so Kubernetes itself stops it there even if no worker watches, and the scheduling and
  startup timeouts are cut to it; a pod stopped by it, or not started before it, ends its job
  ``failed`` with reason ``deadline``: the lines it wrote stay, the rest go to the deadline policy.
- **Failure is an outcome**: a pod Pending past its scheduling or startup timeout, evicted,
  OOM-killed, stuck in ``ImagePullBackOff`` or exiting non-zero ends its job ``failed`` with a
  reason; the task succeeds, download takes whatever lines the pod wrote (vLLM flushes each line
  in input order), and reconcile marks the rest ``missing``, so only they go to the next round.
  (vLLM uploads an output URL only once the whole file is done: with ``s3://``/``gs://`` staging a
  pod that dies mid-file leaves no lines, and all its items go to the next round.)
- **GPU cost**: GPU-seconds from the container's start and finish times x GPUs x the connection's
  $/GPU-hour, recorded per job in the ledger (``abp_infra_costs``).
- **Killed or lost**: a killed task deletes its pod and ends its job ``killed``; a job whose pod
  vanished without a recorded outcome but left output ends ``pod_lost``. No second pod is started
  for either (it would truncate the output the first one left).
- **Hygiene**: logs stream into the task log; the pod is deleted on success, failure and kill
  (KPO's ``on_finish_action``/``on_kill_action``); the hub token comes from a Kubernetes Secret.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk.exceptions import AirflowException

from airflow_batch_provider.adapters.vllm import VllmKubernetesAdapter, input_name, output_name
from airflow_batch_provider.adapters.vllm_engine import logged_version, version_problem
from airflow_batch_provider.core.clock import utcnow
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.hooks.lane import check_conn_lane
from airflow_batch_provider.hooks.ledger import LedgerHook
from airflow_batch_provider.hooks.vllm_kubernetes import VllmKubernetesHook
from airflow_batch_provider.hooks.vllm_pod_settings import OUTPUT_TMP_DIR, VllmPodSettings, job_label
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import JobRow
from airflow_batch_provider.services.runs import check_run_connection
from airflow_batch_provider.services.vllm_pod_outcome import (
    exception_messages,
    failure_reason,
    infra_cost_row,
)
from airflow_batch_provider.services.vllm_refused_line import named_line, settle_named_line
from airflow_batch_provider.staging import PRESIGNABLE_PROTOCOLS, Staging, presign

if TYPE_CHECKING:
    from airflow.sdk import Context
    from kubernetes.client import models as k8s

    from airflow_batch_provider.core.policy import PollPolicy

JOB_LABEL = "batch-job"
XCOM_RETURN_KEY = "return_value"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
#: Lines of a failed pod's log read for the engine's last words (a refused line's number).
LOG_TAIL_LINES = 200
#: Bytes of a pod's log read from its start for the engine's version line.
LOG_HEAD_BYTES = 256 * 1024


class VllmBatchPodOperator(KubernetesPodOperator):
    """Run one job's chunk through ``vllm run-batch`` in a pod; see the module docstring.

    :param job: the job manifest from prepare or resubmit (``job_id``)
    :param workload: the workload's name
    :param batch_conn_id: the ``vllm_kubernetes`` connection (templated: read when the task runs, and
        refused before any pod starts if it is of another type)
    :param ledger_conn_id: the ledger connection (``None``: embedded SQLite)
    :param staging_root: staging URL of the workload (where prepare wrote the chunk)
    :param staging_conn_id: object store connection of ``staging_root``
    :param deadline: the run's deadline (aware datetime or ISO string, templated; ``None``: none)
    :param deadline_margin: seconds before ``deadline`` at which the pod is stopped
    :param kwargs: passed to ``KubernetesPodOperator`` (``deferrable``, ``poll_interval`` ...)
    """

    template_fields: Sequence[str] = (
        *KubernetesPodOperator.template_fields,
        "job",
        "workload",
        "batch_conn_id",
        "staging_root",
        "deadline",
    )
    ui_color = "#d6f5e3"

    def __init__(
        self,
        *,
        job: Mapping[str, Any],
        workload: str,
        batch_conn_id: str,
        ledger_conn_id: str | None = None,
        staging_root: str | None = None,
        staging_conn_id: str | None = None,
        deadline: datetime | str | None = None,
        deadline_margin: float = 0.0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("image", "vllm")  # the connection's image is set at run time
        kwargs.setdefault("name", "vllm-batch")
        kwargs.setdefault("kubernetes_conn_id", None)
        kwargs.setdefault("on_finish_action", "delete_pod")
        kwargs.setdefault("on_kill_action", "delete_pod")
        kwargs.setdefault("log_events_on_failure", True)
        super().__init__(**kwargs)
        self.job = job
        self.workload = workload
        self.batch_conn_id = batch_conn_id
        self.ledger_conn_id = ledger_conn_id
        self.staging_root = staging_root
        self.staging_conn_id = staging_conn_id
        self.deadline = deadline
        self.deadline_margin = deadline_margin
        self._final_pod: k8s.V1Pod | None = None
        self._final_log = ""
        self._engine_version: tuple[int, int, int] | None = None

    @cached_property
    def ledger(self) -> Ledger:
        """The ledger."""
        return LedgerHook(self.ledger_conn_id).get_conn()

    @cached_property
    def vllm_hook(self) -> VllmKubernetesHook:
        """The ``vllm_kubernetes`` connection."""
        return VllmKubernetesHook(self.batch_conn_id)

    @cached_property
    def pod_settings(self) -> VllmPodSettings:
        """The pod settings from the connection."""
        return self.vllm_hook.pod_settings()

    @cached_property
    def vllm_adapter(self) -> VllmKubernetesAdapter:
        """The lane's adapter (staging, output file names)."""
        adapter = self.vllm_hook.get_adapter()
        if not isinstance(adapter, VllmKubernetesAdapter):
            raise ConfigurationError(
                f"connection {self.batch_conn_id!r} is not of type vllm_kubernetes; the pod task needs one."
            )
        return adapter

    @cached_property
    def staging(self) -> Staging:
        """The workload's staging area (where prepare wrote the chunk)."""
        return Staging(self.staging_root, self.staging_conn_id)

    @property
    def url_staging(self) -> bool:
        """Whether the pod reads and writes through presigned URLs (``s3://``/``gs://`` staging)."""
        return str(self.staging.root.protocol or "") in PRESIGNABLE_PROTOCOLS

    def pod_output(self, job: JobRow) -> Any:
        """Where the pod's output goes with URL staging: the file download would write.

        :param job: the ledger job row
        """
        return self.staging.job_file(job.workload, job.run_id, job.round, job.chunk_index, "output")

    def seconds_left(self) -> float | None:
        """Seconds until the run's deadline (minus the margin); ``None`` without a deadline."""
        if self.deadline is None or self.deadline == "":
            return None
        deadline = self.deadline
        if isinstance(deadline, str):
            deadline = datetime.fromisoformat(deadline)
        if deadline.tzinfo is None:
            deadline = deadline.replace(tzinfo=UTC)
        return (deadline - datetime.now(UTC)).total_seconds() - self.deadline_margin

    def deadline_reached(self) -> bool:
        """Whether the run's deadline (minus the margin) has passed."""
        left = self.seconds_left()
        return left is not None and left <= 0

    def pod_urls(self, job: JobRow) -> tuple[str, str]:
        """Presigned GET URL of the job's chunk and PUT URL of its output, masked in the task log.

        :param job: the ledger job row
        """
        from airflow.sdk.log import mask_secret

        expiry = self.pod_settings.presign_expiry_s
        conn_id = self.staging.conn_id
        urls = (
            presign(self.staging.at(job.staged_path), "GET", expiry, conn_id),
            presign(self.pod_output(job), "PUT", expiry, conn_id),
        )
        for url in urls:
            mask_secret(url)
        self.log.info(
            "job %s: the pod reads %s and writes %s through presigned URLs valid %ds (no credentials in the pod)",
            job.job_id,
            job.staged_path,
            self.pod_output(job),
            expiry,
        )
        return urls

    # -- configuration from the connection ------------------------------------------------------

    def configure(self, job: JobRow) -> None:
        """Set the pod's fields from the connection and the job (before KPO builds the pod).

        :param job: the ledger job row
        """
        from kubernetes.client import models as k8s

        s = self.pod_settings
        label = job_label(job.idempotency_key)
        mount = s.exchange_mount_path.rstrip("/")
        self.namespace = s.namespace
        self.image = s.image
        source, target = (
            self.pod_urls(job)
            if self.url_staging
            else (f"{mount}/{input_name(label)}", f"{mount}/{output_name(label)}")
        )
        self.cmds = s.run_batch_args(job.model, source, target)
        self.arguments = []
        self.labels = {**self.labels, JOB_LABEL: label}
        if s.kube_config_path:
            self.config_file = s.kube_config_path
        if s.kubernetes_conn_id:
            self.kubernetes_conn_id = s.kubernetes_conn_id
        self.startup_timeout_seconds = s.startup_timeout_s
        self.schedule_timeout_seconds = s.schedule_timeout_s
        left = self.seconds_left()
        if left is not None:  # Kubernetes stops the pod at the deadline, even with no worker watching
            bound = max(1, math.ceil(left))
            self.active_deadline_seconds = bound
            self.startup_timeout_seconds = min(s.startup_timeout_s, bound)
            self.schedule_timeout_seconds = min(s.schedule_timeout_s, bound)
        self.node_selector = dict(s.node_selector)
        self.tolerations = [k8s.V1Toleration(**_snake(t)) for t in s.tolerations]
        self.service_account_name = s.service_account or ""
        limits = {"cpu": s.cpu, "memory": s.memory}
        if s.gpu_count:
            limits[s.gpu_resource] = str(s.gpu_count)
        self.container_resources = k8s.V1ResourceRequirements(
            limits=limits, requests={"cpu": s.cpu, "memory": s.memory}
        )
        volumes = [
            k8s.V1Volume(
                name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit=s.shm_size)
            ),
        ]
        mounts = [k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm")]
        if not self.url_staging:
            volumes.append(self.exchange_volume())
            mounts.append(k8s.V1VolumeMount(name="exchange", mount_path=mount))
        else:  # the engine stages the output here (--output-tmp-dir) before its one PUT
            volumes.append(k8s.V1Volume(name="output-staging", empty_dir=k8s.V1EmptyDirVolumeSource()))
            mounts.append(k8s.V1VolumeMount(name="output-staging", mount_path=OUTPUT_TMP_DIR))
        if s.model_cache_pvc:
            volumes.append(
                k8s.V1Volume(
                    name="model-cache",
                    persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(s.model_cache_pvc),
                )
            )
            mounts.append(k8s.V1VolumeMount(name="model-cache", mount_path="/root/.cache/huggingface"))
        self.volumes = volumes
        self.volume_mounts = mounts
        env = [k8s.V1EnvVar(name="VLLM_NO_USAGE_STATS", value="1")]
        if s.hub_token_secret:
            env.append(
                k8s.V1EnvVar(
                    name="HF_TOKEN",
                    value_from=k8s.V1EnvVarSource(
                        secret_key_ref=k8s.V1SecretKeySelector(name=s.hub_token_secret, key=s.hub_token_key)
                    ),
                )
            )
        self.env_vars = env
        self.pod_request_obj = None

    def exchange_volume(self) -> k8s.V1Volume:
        """The volume workers and pods share with ``file://`` staging (a PVC, else a ``hostPath``)."""
        from kubernetes.client import models as k8s

        s = self.pod_settings
        if s.exchange_pvc:
            return k8s.V1Volume(
                name="exchange",
                persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(s.exchange_pvc),
            )
        return k8s.V1Volume(
            name="exchange",
            host_path=k8s.V1HostPathVolumeSource(path=str(self.vllm_adapter_folder()), type="Directory"),
        )

    def vllm_adapter_folder(self) -> Any:
        """The exchange folder as workers see it."""
        from airflow_batch_provider.adapters.vllm import exchange_folder

        return exchange_folder(self.vllm_adapter.settings.extra)

    # -- execution ------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        return self.push(context, self.run_job(context))

    def trigger_reentry(self, context: Context, event: dict[str, Any]) -> Any:
        return self.push(context, self.reenter(context, event))

    def push(self, context: Context, result: dict[str, Any]) -> dict[str, Any]:
        """Push the result as the task's XCom return value, which download expands over.

        KPO's own ``do_xcom_push`` means a sidecar reading a file from the pod; it stays off, so the
        task runner would not push what this operator returns. KPO pushes its own failure-path
        results the same way (``_push_xcom_with_fan_out``).

        :param context: the task context
        :param result: the task's result
        """
        context["ti"].xcom_push(XCOM_RETURN_KEY, result)
        return result

    def run_job(self, context: Context) -> dict[str, Any]:
        """Stage the job and run its pod once (or read the outcome it already had).

        :param context: the task context
        """
        check_conn_lane(self.batch_conn_id, "pod")
        job = self.ledger.get_job(self.job["job_id"])
        check_run_connection(self.ledger, job.workload, job.run_id, self.batch_conn_id, self.task_id)
        done = self.recorded_outcome(job)
        if done is not None:
            self.log.info("job %s: its pod already ran (%s); not starting another", job.job_id, done["state"])
            return done
        self.configure(job)
        pods = self.job_pods(job)
        if not pods and job.batch_id and self.wrote_output(job):
            if self.url_staging:  # vLLM uploads only a whole file: that pod finished its job
                return self.settle(job, None, None)
            # Its pod ran and is gone (deleted while the task was deferred or dead): a new pod would
            # truncate the lines it wrote; keep them, and let the next round take the rest.
            return self.settle(job, None, "pod_lost: the job's pod is gone and left its output")
        finished = self.finished_pod(pods)
        if finished is not None:
            self.log.info(
                "job %s: pod %s finished while no task watched it", job.job_id, finished.metadata.name
            )
            phase = finished.status.phase if finished.status else None
            error = None if phase == "Succeeded" else f"pod {finished.metadata.name} ended {phase}"
            self.read_pod_log(finished)
            self.process_pod_deletion(finished, reraise=False)
            return self.settle(job, finished, error)
        if not job.batch_id:
            self.stage(job)
        if not pods and self.deadline_reached():
            return self.settle(
                self.ledger.get_job(job.job_id),
                None,
                f"deadline: the run's deadline ({self.deadline}, margin {self.deadline_margin:g}s) passed "
                "before the job's pod started; its items go to the deadline policy",
            )
        try:
            super().execute(context)
        except AirflowException as exc:
            return self.settle(job, self._final_pod, exception_messages(exc))
        return self.settle(job, self._final_pod, None)

    def reenter(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Finish after the trigger fired: logs, cleanup, outcome.

        :param context: the task context
        :param event: the trigger's event
        """
        job = self.ledger.get_job(self.job["job_id"])
        self.configure(job)  # a fresh operator instance: the Kubernetes client settings again
        try:
            super().trigger_reentry(context, event)
        except AirflowException as exc:
            return self.settle(job, self._final_pod, exception_messages(exc))
        return self.settle(job, self._final_pod, None)

    def on_kill(self) -> None:
        """Delete the pod (KPO), then end the job ``killed`` with the GPU time it used.

        A cleared task then downloads the lines the pod wrote and sends only the rest to the
        next round, instead of starting a second pod for the job.
        """
        from kubernetes.client.exceptions import ApiException

        last: k8s.V1Pod | None = None
        if self.pod is not None:
            try:
                last = self.pod_manager.read_pod(self.pod)
            except ApiException:
                last = None
        super().on_kill()
        job = self.ledger.get_job(self.job["job_id"])
        if job.batch_id and job.batch_state is None:
            self.settle(job, last, "killed: the task was killed and its pod deleted")

    def cleanup(
        self,
        pod: k8s.V1Pod,
        remote_pod: k8s.V1Pod,
        xcom_result: dict[Any, Any] | None = None,
        context: Context | None = None,
    ) -> None:
        """Keep the pod's last state (start/finish times, reason) before KPO deletes it."""
        self._final_pod = remote_pod
        if remote_pod is not None:
            self.read_pod_log(remote_pod)
        super().cleanup(pod, remote_pod, xcom_result, context)

    def read_pod_log(self, pod: k8s.V1Pod) -> None:
        """Before the pod is deleted: the engine version its log names; a failed pod's last lines.

        :param pod: the pod as last seen
        """
        self._engine_version = logged_version(self.pod_log(pod, limit_bytes=LOG_HEAD_BYTES))
        if pod.status is None or pod.status.phase != "Succeeded":
            self._final_log = self.pod_log(pod, tail_lines=LOG_TAIL_LINES)

    def pod_log(self, pod: k8s.V1Pod, **part: int) -> str:
        """A part of the pod's engine log (empty if it cannot be read).

        :param pod: the pod, before it is deleted
        :param part: ``tail_lines`` or ``limit_bytes``
        """
        from kubernetes.client.exceptions import ApiException

        try:
            text = self.client.read_namespaced_pod_log(
                pod.metadata.name, pod.metadata.namespace, container="base", **part
            )
        except (ApiException, OSError) as exc:
            self.log.warning("pod %s: its log could not be read (%s)", pod.metadata.name, exc)
            return ""
        return str(text or "")

    def refused_line(self, job: JobRow, error: str) -> str | None:
        """If the engine refused one named line of the job's file: settle it and say so (else ``None``).

        The named item goes to review with the engine's words; the others go to the next round
        without an attempt charged (:mod:`~airflow_batch_provider.services.vllm_refused_line`).

        :param job: the ledger job row
        :param error: the pod's failure
        """
        named = named_line(self._final_log)
        if named is None or self.wrote_output(job):
            return None
        number, message = named
        custom_id = settle_named_line(self.ledger, job, self.staging.at(job.staged_path), number, message)
        if custom_id is None:
            self.log.warning(
                "job %s: the engine named line %d, which its chunk does not have", job.job_id, number
            )
            return None
        self.log.warning(
            "job %s: the engine refused line %d (%s): %s; that item goes to review, the job's other "
            "items to the next round without an attempt charged",
            job.job_id,
            number,
            custom_id,
            message,
        )
        return f"invalid_line: the engine refused line {number} ({custom_id}): {message} <- {error}"

    def stage(self, job: JobRow) -> None:
        """Copy the job's chunk into the exchange volume and mark the job submitted.

        :param job: the ledger job row
        """
        path = self.staging.at(job.staged_path)
        self.staging.verify(path, job.input_sha256)
        key = job.idempotency_key
        if self.url_staging:  # the pod reads the staged chunk itself, through a presigned URL
            value = str(job.staged_path)
        else:
            with path.open("rb") as fh:
                value = self.vllm_adapter.stage(fh, input_name(key), int(job.size_bytes)).value
        self.ledger.mark_submitted(job.job_id, f"pod:{key}", value)
        self.log.info("job %s: %d lines staged at %s", job.job_id, job.lines, value)

    def job_pods(self, job: JobRow) -> list[k8s.V1Pod]:
        """Every pod that exists for this job (by its label).

        :param job: the ledger job row
        """
        selector = f"{JOB_LABEL}={job_label(job.idempotency_key)}"
        return list(self.client.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def wrote_output(self, job: JobRow) -> bool:
        """Whether a pod of this job already wrote output lines (exchange volume or object store).

        :param job: the ledger job row
        """
        if self.url_staging:
            return bool(self.pod_output(job).exists())
        path = self.vllm_adapter_folder() / output_name(job.idempotency_key)
        return bool(path.exists() and path.stat().st_size > 0)

    @staticmethod
    def finished_pod(pods: list[k8s.V1Pod]) -> k8s.V1Pod | None:
        """The terminal pod of a job, if all its pods are terminal (it finished while no worker watched).

        :param pods: the job's pods
        """
        terminal = [
            p
            for p in pods
            if (p.status and p.status.phase in TERMINAL_PHASES)
            or (p.status and (p.status.reason or "").lower() == "evicted")
        ]
        return terminal[0] if terminal and len(terminal) == len(pods) else None

    def recorded_outcome(self, job: JobRow) -> dict[str, Any] | None:
        """The task's result if the ledger already holds the outcome of this job's pod.

        :param job: the ledger job row
        """
        if job.batch_state not in ("completed", "failed"):
            return None
        self.collect(job)
        costs = {r["job_id"]: r for r in self.ledger.infra_costs(job.workload, job.run_id)}
        row = costs.get(job.job_id, {})
        return self.result(job, job.batch_state, job.error, row.get("pod_name"), row)

    def settle(self, job: JobRow, pod: k8s.V1Pod | None, error: str | None) -> dict[str, Any]:
        """Record the pod's outcome and GPU cost; return the task's result (download reads it).

        :param job: the ledger job row
        :param pod: the pod as last seen
        :param error: why it failed (``None``: it succeeded)
        """
        s = self.pod_settings
        if error is not None and job.batch_state is None:
            error = self.refused_line(job, error) or error
        too_old = version_problem(self._engine_version, s.image)
        if too_old is not None:
            self.log.warning("job %s: %s", job.job_id, too_old)
            error = None if error is None else f"{error} ({too_old})"
        state = "completed" if error is None else "failed"
        reason = None if error is None else failure_reason(pod, error)
        if reason in ("unschedulable_timeout", "startup_timeout") and self.deadline_reached():
            reason = "deadline"  # its timeouts were cut to the run's deadline
        row = infra_cost_row(job, pod, s.gpu_type, s.gpu_count, s.usd_per_gpu_hour, state, reason)
        seconds = int(row["gpu_seconds"])
        self.ledger.record_infra_cost(row)
        message = None if error is None else f"{reason}: {error[:2000]}"
        self.ledger.update_job(job.job_id, batch_state=state, error=message, finished_at=utcnow())
        self.collect(job)
        if error is None:
            self.log.info("job %s: pod succeeded; %d GPU-seconds", job.job_id, seconds * s.gpu_count)
        else:
            self.log.warning(
                "job %s: pod failed (%s); the lines it wrote are kept and the rest go to the next round: %s",
                job.job_id,
                reason,
                error[:500],
            )
        return self.result(job, state, message, row["pod_name"], row)

    def collect(self, job: JobRow) -> None:
        """With URL staging, record the pod's output file as the job's download (once it has ended).

        The pod PUT its output where download would write it; vLLM uploads nothing unless the whole
        file succeeded, so a pod that did not leaves an empty file (every item then goes to the
        next round or the deadline policy). Download then finds the job's files complete in
        staging and keeps them. With ``file://`` staging download reads the exchange volume.

        :param job: the ledger job row
        """
        if not self.url_staging:
            return
        current = self.ledger.get_job(job.job_id)
        if current.state in ("downloaded", "reconciled"):
            return
        target = self.pod_output(job)
        if not target.exists():
            with self.staging.writer(target):
                pass
        self.ledger.update_job(job.job_id, state="downloaded", output_path=str(target), error_path=None)

    @staticmethod
    def result(
        job: JobRow, state: str, reason: str | None, pod_name: str | None, cost: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The XCom result, shaped like the sensor's (download and reconcile read ``job_id``).

        :param job: the ledger job row
        :param state: ``completed`` or ``failed``
        :param reason: why it failed
        :param pod_name: the pod that ran it
        :param cost: the infra cost row
        """
        return {
            "job_id": job.job_id,
            "provider": VllmKubernetesAdapter.name,
            "batch_id": f"pod:{job.idempotency_key}",
            "idempotency_key": job.idempotency_key,
            "state": state,
            "reason": reason,
            "pod": pod_name,
            "gpu_seconds": int(cost.get("gpu_seconds") or 0) * int(cost.get("gpu_count") or 0),
            "infra_cost_usd": float(Decimal(int(cost.get("cost_nusd") or 0)) / Decimal(10**9)),
        }


def _snake(toleration: Mapping[str, Any]) -> dict[str, Any]:
    names = {"tolerationSeconds": "toleration_seconds"}
    return {names.get(k, k): v for k, v in toleration.items()}


def pod_tasks(
    *,
    task_id: str,
    manifests: Any,
    common: Mapping[str, Any],
    policy: PollPolicy,
    deferrable: bool,
    deadline: Any = None,
    deadline_margin: float = 0.0,
) -> Any:
    """The mapped pod task of one round (one pod per job); returns its output for download.

    :param task_id: the task id (``run``, ``run_2`` ...)
    :param manifests: the round's job manifests (prepare's or resubmit's output)
    :param common: workload, connections and staging, as every batch operator takes them
    :param policy: the poll policy (its initial interval paces the pod polls)
    :param deferrable: wait in the triggerer
    :param deadline: the run's resolved deadline (aware datetime, ISO string or a template of
        one; ``None``: none): each pod is stopped there and its job ends with reason ``deadline``
    :param deadline_margin: seconds before the deadline at which the pods stop
    """
    interval = max(1.0, min(policy.initial_interval, 30.0))
    run = VllmBatchPodOperator.partial(
        task_id=task_id,
        deferrable=deferrable,
        poll_interval=interval,
        startup_check_interval_seconds=max(1, int(interval)),
        deadline=deadline,
        deadline_margin=deadline_margin,
        **common,
    ).expand(job=manifests)
    return run.output
