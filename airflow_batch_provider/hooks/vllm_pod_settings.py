"""The ``vllm_kubernetes`` connection's extras, read into a frozen record. No Airflow import here.

:class:`~airflow_batch_provider.hooks.vllm_kubernetes.VllmKubernetesHook` reads them; the pod task
(:class:`~airflow_batch_provider.operators.vllm_pod.VllmBatchPodOperator`) builds its pod from them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from airflow_batch_provider.adapters.vllm_engine import DEFAULT_IMAGE, MIN_ENGINE_VERSION, image_version
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.staging import PRESIGN_MAX_S

#: Where the engine stages a presigned output on disk before its PUT (an ``emptyDir`` in the pod).
OUTPUT_TMP_DIR: Final = "/var/tmp/vllm-output"
#: A label value Kubernetes accepts (KPO does not sanitize user labels).
_LABEL_VALUE: Final = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class VllmPodSettings:
    """Everything the pod task needs from the connection's extras.

    :param namespace: Kubernetes namespace of the pods
    :param image: the vLLM image (its entrypoint is ignored; the command is ``vllm run-batch``)
    :param gpu_count: GPUs per pod (``nvidia.com/gpu`` limit); also the tensor-parallel default
    :param gpu_type: GPU model name, for the planner and the report (``H100``, ``L4`` ...)
    :param gpu_resource: the extended resource name of a GPU
    :param usd_per_gpu_hour: what one GPU-hour costs you (on-demand, reserved or amortised)
    :param node_selector: node labels the pod must match (e.g. the GPU node pool)
    :param tolerations: tolerations (dicts in Kubernetes' shape) for tainted GPU nodes
    :param service_account: the pod's service account
    :param model_cache_pvc: a PVC mounted at ``/root/.cache/huggingface`` so weights download once
    :param hub_token_secret: the Secret holding the model hub token (key ``hub_token_key``),
        exposed to the pod as ``HF_TOKEN``; never in the task's arguments
    :param hub_token_key: the key inside that Secret
    :param tensor_parallel_size: ``--tensor-parallel-size`` (default: ``gpu_count``)
    :param max_model_len: ``--max-model-len`` (default: the model's)
    :param gpu_memory_utilization: ``--gpu-memory-utilization``
    :param shm_size: size of the memory-backed ``/dev/shm`` (NCCL needs it with tensor parallel)
    :param startup_timeout_s: seconds a scheduled pod may take to start (image pull, model load)
    :param schedule_timeout_s: seconds a pod may wait to be scheduled (GPU node autoscaling)
    :param presign_expiry_s: with ``s3://`` or ``gs://`` staging, how long the pod's presigned
        URLs stay valid (default 86400, one day; at most 604800, seven days). vLLM reads its input
        URL when it starts and writes its output URL when the whole file is done, so this must
        cover scheduling, startup and the run: it must exceed ``schedule_timeout_s +
        startup_timeout_s``, and a run longer than the rest of it fails its upload
    :param exchange_path: the folder workers and pods share, as workers see it (``file://`` staging)
    :param exchange_pvc: the PVC behind it (else a ``hostPath`` of ``exchange_path``)
    :param exchange_mount_path: where the pod sees it
    :param kube_config_path: kubeconfig file for the Kubernetes API (else ``kubernetes_conn_id``)
    :param kubernetes_conn_id: a ``kubernetes`` connection to use instead
    :param extra_args: more ``vllm run-batch`` flags
    :param cpu: CPU request, memory: memory request/limit of the pod
    """

    namespace: str = "default"
    image: str = DEFAULT_IMAGE
    gpu_count: int = 1
    gpu_type: str = "H100"
    gpu_resource: str = "nvidia.com/gpu"
    usd_per_gpu_hour: float = 0.0
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    service_account: str | None = None
    model_cache_pvc: str | None = None
    hub_token_secret: str | None = None
    hub_token_key: str = "token"
    tensor_parallel_size: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    shm_size: str = "16Gi"
    startup_timeout_s: int = 1800
    schedule_timeout_s: int = 1800
    presign_expiry_s: int = 86400
    exchange_path: str = ""
    exchange_pvc: str | None = None
    exchange_mount_path: str = "/exchange"
    kube_config_path: str | None = None
    kubernetes_conn_id: str | None = None
    extra_args: tuple[str, ...] = ()
    cpu: str = "4"
    memory: str = "32Gi"

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> VllmPodSettings:
        """Read the connection extras; unknown keys are refused (a typo must not pass silently).

        :param extra: the connection's extras
        :raises ConfigurationError: an unknown key, or a value of the wrong kind
        """
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(extra) - known - {"login"})
        if unknown:
            raise ConfigurationError(
                f"vllm_kubernetes connection: unknown extra(s) {unknown}; known: {sorted(known)}."
            )
        values: dict[str, Any] = {}
        try:
            for key, value in extra.items():
                if key == "login" or value is None:
                    continue
                kind = cls.__dataclass_fields__[key].type
                if kind == "int" or kind == "int | None":
                    values[key] = int(value)
                elif kind == "float":
                    values[key] = float(value)
                elif key in ("tolerations", "extra_args"):
                    values[key] = tuple(value)
                elif key == "node_selector":
                    values[key] = {str(k): str(v) for k, v in dict(value).items()}
                else:
                    values[key] = str(value)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"vllm_kubernetes connection: extra {key!r}={value!r}: {exc}") from exc
        settings = cls(**values)
        found = image_version(settings.image)
        if found is not None and found < MIN_ENGINE_VERSION:
            raise ConfigurationError(
                f"vllm_kubernetes connection: image {settings.image!r} is vLLM "
                f"{'.'.join(map(str, found))}, older than the lane's minimum "
                f"{'.'.join(map(str, MIN_ENGINE_VERSION))} (it needs --output-tmp-dir and the input checks "
                f"of that version); use {DEFAULT_IMAGE!r} or newer."
            )
        if settings.gpu_count < 0 or settings.usd_per_gpu_hour < 0:
            raise ConfigurationError(
                f"vllm_kubernetes connection: gpu_count={settings.gpu_count} and "
                f"usd_per_gpu_hour={settings.usd_per_gpu_hour} must not be negative."
            )
        if (
            not settings.schedule_timeout_s + settings.startup_timeout_s
            < settings.presign_expiry_s
            <= PRESIGN_MAX_S
        ):
            raise ConfigurationError(
                f"vllm_kubernetes connection: presign_expiry_s={settings.presign_expiry_s} must exceed "
                f"schedule_timeout_s + startup_timeout_s ({settings.schedule_timeout_s + settings.startup_timeout_s}: "
                f"the URLs must outlive the pod's wait and start, and its run) and be at most {PRESIGN_MAX_S} "
                "(7 days, the longest S3 and GCS sign for)."
            )
        return settings

    def run_batch_args(self, model: str, input_path: str, output_path: str) -> list[str]:
        """The ``vllm run-batch`` command line for one job.

        :param model: the model (hub id or a path in the model cache)
        :param input_path: the job's input as the pod sees it
        :param output_path: where the pod writes the output
        """
        args = ["vllm", "run-batch", "-i", input_path, "-o", output_path, "--model", model]
        if output_path.startswith(("http://", "https://")):  # staged on disk, not held in memory
            args += ["--output-tmp-dir", OUTPUT_TMP_DIR]
        args += ["--tensor-parallel-size", str(self.tensor_parallel_size or max(1, self.gpu_count))]
        args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.max_model_len:
            args += ["--max-model-len", str(self.max_model_len)]
        return [*args, *self.extra_args]


def job_label(idempotency_key: str) -> str:
    """The pod label value that names a job (a valid Kubernetes label value).

    :param idempotency_key: the job's idempotency key
    :raises ConfigurationError: the key cannot be a label value
    """
    if not _LABEL_VALUE.match(idempotency_key):
        raise ConfigurationError(
            f"idempotency key {idempotency_key!r} is not a valid Kubernetes label value (63 characters "
            "at most, alphanumeric at both ends, '-_.' inside)."
        )
    return idempotency_key
