"""Provider metadata read by Airflow's providers manager (``airflow providers list``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from airflow_batch_provider import __version__
from airflow_batch_provider.adapters.entries import BUILTIN


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


def _field(
    label: str,
    description: str,
    type_: str = "string",
    *,
    default: Any = None,
    enum: list[str] | None = None,
    secret: bool = False,
) -> dict[str, Any]:
    """A ``conn-fields`` entry: a named form field stored under its name in the connection's extra."""
    schema: dict[str, Any] = {"type": [type_, "null"]}
    if default is not None:
        schema["default"] = default
    if enum is not None:
        schema["enum"] = [*enum, None]
    if secret:
        schema["format"] = "password"  # masked in the UI and in logs
    return {"label": label, "schema": schema, "description": description}


_TIMEOUT = _field("Timeout (seconds)", "Read timeout of each API call.", "number")
_MAX_RETRIES = _field(
    "Retries of reads",
    "SDK retries of status, list and download calls (creates are never retried blindly).",
    "integer",
)
_API_HOST = {"host": "API base URL (optional)", "password": "API key"}


def _connection(conn_type: str, hook: str, hook_name: str, form: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "hook-class-name": hook,
        "hook-name": hook_name,
        "connection-type": conn_type,
        "conn-fields": form["fields"],
        "ui-field-behaviour": {
            "hidden-fields": form["hidden"],
            "relabeling": form["relabeling"],
            "placeholders": form["placeholders"],
        },
    }


def _form(
    *,
    hidden: list[str],
    relabeling: dict[str, str],
    placeholders: dict[str, str],
    fields: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    return {"hidden": hidden, "relabeling": relabeling, "placeholders": placeholders, "fields": fields}


#: The form of a registered connection type that declares none here: API base URL and key.
_DEFAULT_FORM: Final = _form(
    hidden=["schema", "login", "port"], relabeling=_API_HOST, placeholders={}, fields={"timeout": _TIMEOUT}
)


def _forms() -> dict[str, dict[str, Any]]:
    """The connection forms by connection type: named fields instead of free JSON (the extra stays for the rest)."""
    return {
        "openai_batch": _form(
            hidden=["schema", "login", "port"],
            relabeling=_API_HOST,
            placeholders={"host": "https://api.openai.com/v1", "password": "sk-..."},
            fields={
                "api_type": _field(
                    "API type",
                    "openai (also any OpenAI-compatible server) or azure.",
                    default="openai",
                    enum=["openai", "azure"],
                ),
                "organization": _field("Organization", "OpenAI organization id (org-...), optional."),
                "project": _field("Project", "OpenAI project id (proj_...), optional."),
                "api_version": _field("Azure API version", "Azure OpenAI only, e.g. 2024-10-21."),
                "timeout": _TIMEOUT,
                "max_retries": _MAX_RETRIES,
            },
        ),
        "anthropic_batch": _form(
            hidden=["schema", "login", "port"],
            relabeling=_API_HOST,
            placeholders={"host": "https://api.anthropic.com", "password": "sk-ant-..."},
            fields={
                "default_max_tokens": _field(
                    "Default max tokens", "max_tokens of a request that sets none.", "integer", default=1024
                ),
                "prompt_caching": _field(
                    "Prompt caching", "Mark the system prompt as cacheable.", "boolean", default=True
                ),
                "json_output": _field(
                    "JSON output mode",
                    "instruct (schema in the system prompt) or output_config (native structured output).",
                    default="instruct",
                    enum=["instruct", "output_config"],
                ),
                "timeout": _TIMEOUT,
                "max_retries": _MAX_RETRIES,
            },
        ),
        "gemini_batch": _form(
            hidden=["schema", "login", "port"],
            relabeling={"host": "API base URL (optional)", "password": "API key (Developer API)"},
            placeholders={"host": "https://generativelanguage.googleapis.com", "password": "AIza..."},
            fields={
                "vertexai": _field(
                    "Vertex AI",
                    "Use Vertex AI batch prediction instead of the Gemini Developer API.",
                    "boolean",
                    default=False,
                ),
                "project": _field("Vertex project", "Google Cloud project id (Vertex AI)."),
                "location": _field("Vertex location", "Vertex AI region, e.g. us-central1."),
                "gcs_prefix": _field(
                    "GCS prefix", "gs://bucket/folder for Vertex batch input and output (Vertex AI)."
                ),
                "gcp_conn_id": _field(
                    "Google Cloud connection",
                    "A google_cloud_platform connection whose credentials reach Vertex AI and GCS "
                    "(key file, key JSON or Application Default Credentials, optionally an impersonation chain); "
                    "empty: ADC.",
                ),
                "api_version": _field("API version", "Developer API version (default v1beta)."),
                "inline_max_bytes": _field(
                    "Inline up to (bytes)",
                    "Chat chunks up to this size are sent inline (Developer API).",
                    "integer",
                    default=0,
                ),
                "timeout": _TIMEOUT,
                "max_retries": _MAX_RETRIES,
            },
        ),
        "bedrock_batch": _form(
            hidden=["schema", "login", "password", "port"],
            relabeling={"host": "Bedrock endpoint URL (optional)"},
            placeholders={"host": "https://bedrock.us-east-1.amazonaws.com"},
            fields={
                "aws_conn_id": _field(
                    "AWS connection",
                    "The aws connection whose credentials are used (keys, profile, assume-role, web "
                    "identity: everything the Amazon provider supports).",
                    default="aws_default",
                ),
                "region_name": _field("Region", "AWS region of Bedrock, e.g. us-east-1."),
                "role_arn": _field(
                    "Batch job role ARN",
                    "The service role Bedrock assumes to read the input and write the output "
                    "(arn:aws:iam::<account>:role/<name>).",
                ),
                "s3_uri": _field("S3 input prefix", "s3://bucket/prefix where chunks are staged."),
                "output_s3_uri": _field(
                    "S3 output prefix",
                    "s3://bucket/prefix where Bedrock writes results (default <input>/output).",
                ),
                "model_id": _field("Model id", "Default model id when the job does not name one."),
                "timeout_hours": _field(
                    "Job timeout (hours)", "Bedrock job timeout, 24 to 168.", "integer", default=24
                ),
                "min_records": _field(
                    "Minimum records per job",
                    "Your account's quota (AWS default 100).",
                    "integer",
                    default=100,
                ),
                "s3_endpoint_url": _field(
                    "S3 endpoint URL", "S3 endpoint override (tests, S3-compatible stores)."
                ),
                "bedrock_runtime_endpoint_url": _field(
                    "Bedrock runtime endpoint URL", "InvokeModel endpoint override (real-time fallback)."
                ),
            },
        ),
        "vllm_kubernetes": _form(
            hidden=["host", "schema", "login", "password", "port"],
            relabeling={},
            placeholders={},
            fields={
                "namespace": _field("Namespace", "Kubernetes namespace of the vLLM pods.", default="default"),
                "image": _field("vLLM image", "The vLLM image (the command is vllm run-batch)."),
                "gpu_count": _field(
                    "GPUs per pod",
                    "nvidia.com/gpu limit; also the tensor-parallel default.",
                    "integer",
                    default=1,
                ),
                "gpu_type": _field(
                    "GPU type",
                    "GPU model name for the planner and the report (H100, L4 ...).",
                    default="H100",
                ),
                "usd_per_gpu_hour": _field(
                    "USD per GPU-hour",
                    "What one GPU-hour costs you, for the cost report.",
                    "number",
                    default=0.0,
                ),
                "exchange_path": _field(
                    "Exchange folder", "The folder workers and pods share, as the workers see it (required)."
                ),
                "exchange_pvc": _field("Exchange PVC", "The ReadWriteMany PVC behind it (else a hostPath)."),
                "model_cache_pvc": _field(
                    "Model cache PVC", "Mounted at the model hub cache so weights download once."
                ),
                "hub_token_secret": _field(
                    "Hub token Secret", "Kubernetes Secret holding the model hub token (HF_TOKEN)."
                ),
                "service_account": _field("Service account", "The pods' service account."),
                "kubernetes_conn_id": _field(
                    "Kubernetes connection", "A kubernetes connection for the API (else in-cluster)."
                ),
                "kube_config_path": _field(
                    "Kubeconfig path", "A kubeconfig file for the API (instead of a connection)."
                ),
            },
        ),
    }


def _connection_types() -> list[dict[str, Any]]:
    """The registry's built-in connection types (hook and name from its one entry each), with their forms.

    Adapters registered through the entry-point group belong to their own distribution's metadata.
    """
    forms = _forms()
    return [
        _connection(conn_type, entry.hook, entry.hook_name, forms.get(conn_type, _DEFAULT_FORM))
        for conn_type, entry in BUILTIN.items()
    ]


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
                    "airflow_batch_provider.operators.prepare",
                    "airflow_batch_provider.operators.batch",
                    "airflow_batch_provider.operators.deadline",
                    "airflow_batch_provider.operators.fallback",
                    "airflow_batch_provider.operators.deliver",
                    "airflow_batch_provider.operators.consume",
                    "airflow_batch_provider.operators.vllm_pod",
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
        "connection-types": _connection_types(),
        # `airflow batch ...`: the airflow-batch command line inside Airflow's
        "cli": ["airflow_batch_provider.cli_commands.get_batch_cli_commands"],
        # `airflow providers links` lists them; the submit and wait tasks show them
        "extra-links": [
            "airflow_batch_provider.links.batch.BatchConsoleLink",
            "airflow_batch_provider.links.batch.LedgerRunLink",
        ],
        # gs:// for ObjectStoragePath through gcsfs when the Google provider (which serves it
        # itself) is not installed; the module's ``schemes`` is empty otherwise
        "filesystems": ["airflow_batch_provider.hooks.google"],
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
                    "fallback_headroom": _option(
                        "Share of the key's RPM/TPM the synchronous fallback may use, all tasks of a connection "
                        "together; the rest is left to the real-time application (a connection's rate_headroom "
                        "extra wins).",
                        "1.0",
                        type_="float",
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
