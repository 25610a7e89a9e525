"""The ``vllm_kubernetes`` connection type: ``vllm run-batch`` in a Kubernetes pod on your GPUs."""

from __future__ import annotations

from typing import Any, ClassVar

from airflow_batch_provider.hooks.batch import BatchHook
from airflow_batch_provider.kubernetes.settings import VllmPodSettings


class VllmKubernetesHook(BatchHook):
    """Self-hosted vLLM batches in Kubernetes pods (``vllm_kubernetes``).

    The adapter is :class:`~airflow_batch_provider.adapters.vllm.VllmKubernetesAdapter`; the pod
    task is :class:`~airflow_batch_provider.kubernetes.operators.VllmBatchPodOperator`. Every
    setting is an extra (see :class:`~airflow_batch_provider.kubernetes.settings.VllmPodSettings`):
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
    ui_placeholders: ClassVar[dict[str, str]] = {
        "extra": '{"namespace": "llm", "image": "vllm/vllm-openai:v0.33.0", "gpu_count": 1, '
        '"gpu_type": "H100", "usd_per_gpu_hour": 2.5, "exchange_pvc": "batch-exchange", '
        '"exchange_path": "/mnt/batch-exchange", "hub_token_secret": "hf-token"}',
    }

    def __init__(self, batch_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(batch_conn_id=batch_conn_id, **kwargs)

    def pod_settings(self) -> VllmPodSettings:
        """Read the pod settings from the connection's extras."""
        conn = self.get_connection(self.batch_conn_id)
        return VllmPodSettings.from_extra(dict(conn.extra_dejson or {}))
