"""Provider metadata read by Airflow's providers manager (``airflow providers list``)."""

from __future__ import annotations

from typing import Any

from airflow_batch_provider import __version__


def _option(
    description: str,
    default: str | None,
    example: str | None = None,
    type_: str = "string",
    *,
    sensitive: bool = False,
) -> dict[str, Any]:
    option: dict[str, Any] = {
        "description": description,
        "version_added": "0.1.0",
        "type": type_,
        "example": example,
        "default": default,
    }
    if sensitive:
        # masked in the UI, in `airflow config list` and in logs
        option["sensitive"] = True
    return option


def get_provider_info() -> dict[str, Any]:
    """Return the provider's metadata."""
    return {
        "package-name": "airflow-batch-provider",
        "name": "LLM Batch",
        "description": "Asynchronous LLM batch inference (OpenAI, Anthropic, Gemini, Bedrock, vLLM) with a per-item "
        "ledger, idempotent submit, deferrable polling and cost per usable result.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "LLM Batch",
                "external-doc-url": "https://platform.openai.com/docs/guides/batch",
                "tags": ["ai"],
            }
        ],
        "operators": [
            {
                "integration-name": "LLM Batch",
                "python-modules": [
                    "airflow_batch_provider.operators.batch",
                    "airflow_batch_provider.operators.deadline",
                    "airflow_batch_provider.operators.fallback",
                ],
            }
        ],
        "sensors": [
            {"integration-name": "LLM Batch", "python-modules": ["airflow_batch_provider.sensors.batch"]}
        ],
        "triggers": [
            {"integration-name": "LLM Batch", "python-modules": ["airflow_batch_provider.triggers.batch"]}
        ],
        "hooks": [
            {
                "integration-name": "LLM Batch",
                "python-modules": [
                    "airflow_batch_provider.hooks.batch",
                    "airflow_batch_provider.hooks.ledger",
                    "airflow_batch_provider.hooks.anthropic",
                    "airflow_batch_provider.hooks.gemini",
                    "airflow_batch_provider.hooks.bedrock",
                    "airflow_batch_provider.hooks.vllm_kubernetes",
                ],
            }
        ],
        "connection-types": [
            {
                "hook-class-name": "airflow_batch_provider.hooks.batch.OpenAIBatchHook",
                "connection-type": "openai_batch",
            },
            {
                "hook-class-name": "airflow_batch_provider.hooks.anthropic.AnthropicBatchHook",
                "connection-type": "anthropic_batch",
            },
            {
                "hook-class-name": "airflow_batch_provider.hooks.bedrock.BedrockBatchHook",
                "connection-type": "bedrock_batch",
            },
            {
                "hook-class-name": "airflow_batch_provider.hooks.gemini.GeminiBatchHook",
                "connection-type": "gemini_batch",
            },
            {
                "hook-class-name": "airflow_batch_provider.hooks.vllm_kubernetes.VllmKubernetesHook",
                "connection-type": "vllm_kubernetes",
            },
        ],
        "plugins": [
            {
                "name": "llm_batch",
                "plugin-class": "airflow_batch_provider.plugins.batch_progress.BatchProgressPlugin",
            }
        ],
        "config": {
            "batch_provider": {
                "description": "Settings of the LLM batch provider.",
                "options": {
                    "ledger_conn_id": _option(
                        "Connection (postgres or sqlite) of the ledger, used when a task names none; "
                        "wins over ledger_url. Keeps the ledger's password in Airflow's connections.",
                        "",
                        "batch_ledger",
                    ),
                    "ledger_url": _option(
                        "SQLAlchemy URL of the embedded ledger, used when neither the task nor "
                        "ledger_conn_id names a connection. Default: SQLite in $AIRFLOW_HOME. It may hold "
                        "a password: prefer ledger_conn_id.",
                        "",
                        "postgresql+psycopg2://airflow@db/ledger",
                        sensitive=True,
                    ),
                    "staging_root": _option(
                        "Where chunks, downloads and reports are staged (ObjectStoragePath URL). "
                        "Default: $AIRFLOW_HOME/batch_staging.",
                        "",
                        "s3://my-bucket/llm-batch",
                    ),
                    "staging_conn_id": _option(
                        "Connection of the object store behind staging_root (e.g. aws_default).",
                        "",
                        "aws_default",
                    ),
                    "console_urls": _option(
                        "JSON object of provider name to a console page template ({batch_id}, {region}) "
                        "for the batch links on submit and wait tasks; adds to or replaces the shipped "
                        "OpenAI one.",
                        "",
                        '{"anthropic": "https://console.anthropic.com/workspaces/default/batches/{batch_id}"}',
                    ),
                    "pricing_override": _option(
                        "A JSON file (or JSON text) merged over the shipped price table.",
                        "",
                        "/opt/airflow/prices.json",
                    ),
                    "fallback_rpm": _option(
                        "Requests per minute of the synchronous fallback (real-time API, full price).",
                        "500",
                        type_="integer",
                    ),
                    "fallback_tpm": _option(
                        "Tokens per minute of the synchronous fallback.", "200000", type_="integer"
                    ),
                    "fallback_concurrency": _option(
                        "Requests in flight in the synchronous fallback.", "16", type_="integer"
                    ),
                    "poll_initial_interval": _option(
                        "Seconds before the second status poll.", "30", type_="float"
                    ),
                    "poll_factor": _option(
                        "Growth of the poll interval after each poll.", "1.5", type_="float"
                    ),
                    "poll_max_interval": _option("Cap on the poll interval, seconds.", "600", type_="float"),
                    "poll_max_consecutive_errors": _option(
                        "Transient status errors tolerated in a row before the sensor fails.",
                        "5",
                        type_="integer",
                    ),
                    "poll_timeout": _option(
                        "Seconds after submission after which waiting gives up.", "93600", type_="float"
                    ),
                },
            }
        },
    }
