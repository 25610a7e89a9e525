"""The self-hosted lane: ``vllm run-batch`` in a ``KubernetesPodOperator`` task per chunk.

``settings`` reads the ``vllm_kubernetes`` connection (no Airflow import); ``operators`` holds the
pod task; ``lane`` is what ``batch_inference_group`` calls to build it.
"""
