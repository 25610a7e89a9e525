"""What every task of a run must agree on with the run as prepare started it: its connection and prompt."""

from __future__ import annotations

from typing import Any, Protocol

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.prompt_changes import PromptEdit, edited_in_place
from airflow_batch_provider.ledger.runs import RunPrompt, record_run_prompt, run_prompt


class WarningLog(Protocol):
    """What this module warns to: a stdlib logger or an operator's ``self.log``."""

    def warning(self, msg: Any, /, *args: Any) -> Any:
        """Log a warning.

        :param msg: the message (``%`` format)
        :param args: its arguments
        """


def check_run_connection(
    ledger: Ledger, workload: str, run_id: str, batch_conn_id: str, task_id: str
) -> None:
    """Refuse a task whose batch connection is not the one its run started on.

    A templated ``batch_conn_id`` (``{{ var.value.get(...) }}``) is rendered by every task: a
    Variable changed during a run would send the run's later tasks to another account or provider,
    which knows nothing of the batches created before. The run keeps the connection prepare
    recorded; the change takes effect with the next run.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run the task belongs to
    :param batch_conn_id: the task's connection id, rendered
    :param task_id: the task, for the message
    :raises ConfigurationError: the run started on another connection
    """
    started_on = ledger.run_batch_conn_id(workload, run_id)
    if started_on is not None and started_on != batch_conn_id:
        raise ConfigurationError(
            f"{task_id}: batch_conn_id is {batch_conn_id!r} but run {run_id!r} of workload {workload!r} "
            f"started on {started_on!r} (its batches live behind that connection); the Variable or "
            f"template it reads changed during the run. Set it back to {started_on!r} and clear this "
            "task; a new connection takes effect with the next run."
        )


def check_run_prompt(
    ledger: Ledger, workload: str, run_id: str, template: PromptTemplate, task_id: str
) -> None:
    """Refuse a task whose prompt is not the one its run started with (content and version).

    A prompt file edited while the run's batches are out (v1 text to v2 JSON with a schema)
    would judge v1's answers by v2's rules: every answer ``invalid_output``, resent and paid
    again. The run keeps the prompt prepare recorded; the edit takes effect with the next run.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run the task belongs to
    :param template: the prompt the task renders
    :param task_id: the task, for the message
    :raises ConfigurationError: the run started with another prompt
    """
    started = run_prompt(ledger, workload, run_id)
    if started is None or started.sha256 == template.fingerprint:
        return
    same_version = started.version == template.version
    what = (
        f"prompt {template.version!r} with other content (sha256 {template.fingerprint[:12]})"
        if same_version
        else f"prompt {template.version!r} (sha256 {template.fingerprint[:12]})"
    )
    raise ConfigurationError(
        f"{task_id}: this task renders {what} but run {run_id!r} of workload {workload!r} started with "
        f"prompt {started.version!r} (sha256 {started.sha256[:12]}); the prompt (its file, or what the "
        f"callable returns) changed during the run, and the run's answers were asked with "
        f"{started.version!r}. Put prompt {started.version!r} back and clear this task; a new prompt "
        "(with a new version) takes effect with the next run."
    )


def keep_run_prompt(
    ledger: Ledger, workload: str, run_id: str, template: PromptTemplate, task_id: str
) -> None:
    """Record the prompt a run starts with (prepare), or refuse another one than it started with.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run (already started: :meth:`Ledger.start_run`)
    :param template: the prompt prepare renders
    :param task_id: the task, for the message
    :raises ConfigurationError: the run started with another prompt (see :func:`check_run_prompt`)
    """
    recorded = record_run_prompt(ledger, workload, run_id, RunPrompt(template.version, template.fingerprint))
    if recorded is not None and recorded.sha256 != template.fingerprint:
        check_run_prompt(ledger, workload, run_id, template, task_id)


def warn_prompt_edited_in_place(
    ledger: Ledger,
    workload: str,
    run_id: str,
    template: PromptTemplate,
    log: WarningLog,
) -> PromptEdit | None:
    """Warn when the prompt's content changed under the same version since an earlier run.

    Such an edit is allowed (the next run keeps it, as a new version would be), but it is never
    silent: every item whose rendered request changed is sent and paid again, counted apart in
    the report (``prompt_changed``). Return the earlier run's prompt, ``None`` when none differs.

    :param ledger: the ledger
    :param workload: the workload
    :param run_id: the run preparing
    :param template: the prompt prepare renders
    :param log: where to warn
    """
    edit = edited_in_place(ledger, workload, run_id, template.version, template.fingerprint)
    if edit is not None:
        log.warning("%s", edit.warning(workload, run_id, template.name or template.version))
    return edit
