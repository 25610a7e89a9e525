"""The ``vllm_kubernetes`` connection type: ``vllm run-batch`` in a Kubernetes pod on your GPUs."""

from __future__ import annotations

from typing import Any

from airflow_batch_provider.adapters.base import BatchAdapter
from airflow_batch_provider.hooks.batch import BatchHook
from airflow_batch_provider.hooks.vllm_pod_settings import VllmPodSettings


class VllmKubernetesHook(BatchHook):
    """Self-hosted vLLM batches in Kubernetes pods (``vllm_kubernetes``).

    The adapter is :class:`~airflow_batch_provider.adapters.vllm.VllmKubernetesAdapter`; the pod
    task is :class:`~airflow_batch_provider.operators.vllm_pod.VllmBatchPodOperator`. Every
    setting is an extra (see :class:`~airflow_batch_provider.hooks.vllm_pod_settings.VllmPodSettings`):
    ``namespace``, ``image``, ``gpu_count``, ``gpu_type``, ``usd_per_gpu_hour``, ``node_selector``,
    ``tolerations``, ``service_account``, ``model_cache_pvc``, ``hub_token_secret``,
    ``tensor_parallel_size``, ``max_model_len``, ``gpu_memory_utilization``, ``startup_timeout_s``,
    ``schedule_timeout_s``, ``exchange_path``/``exchange_pvc``, ``kube_config_path`` or
    ``kubernetes_conn_id``. No secret is stored here: the hub token stays in a Kubernetes Secret.

    :param batch_conn_id: the connection id
    """

    default_conn_name = "vllm_kubernetes_default"
    conn_type = "vllm_kubernetes"
    hook_name = "vLLM on Kubernetes"

    def __init__(self, batch_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(batch_conn_id=batch_conn_id, **kwargs)

    def pod_settings(self) -> VllmPodSettings:
        """Read the pod settings from the connection's extras."""
        conn = self.get_connection(self.batch_conn_id)
        return VllmPodSettings.from_extra(dict(conn.extra_dejson or {}))

    def probe(self, adapter: BatchAdapter) -> str:
        """Check the pod settings and that the exchange folder the pods share is writable here.

        :param adapter: a ``VllmKubernetesAdapter``
        """
        import tempfile

        from airflow_batch_provider.adapters.vllm import exchange_folder

        settings = self.pod_settings()
        folder = exchange_folder(adapter.settings.extra)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".abp-probe-"):
            pass  # created and removed: the worker can write where the pods read
        return (
            f"pods of {settings.image} with {settings.gpu_count} {settings.gpu_type} GPU(s) in namespace "
            f"{settings.namespace}; exchange folder {folder} is writable"
        )
