from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_batch_provider.core.requests import PromptTemplate
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.services.runs import check_run_connection, check_run_prompt, keep_run_prompt


def test_a_task_on_the_connection_its_run_started_on_goes_ahead(ledger: Ledger) -> None:
    ledger.start_run("wl", "r1", "openai", "m", batch_conn_id="openai_a")
    check_run_connection(ledger, "wl", "r1", "openai_a", "wl.submit")
    check_run_connection(ledger, "wl", "r2", "anything", "wl.prepare")  # a run not started yet


def test_a_connection_changed_during_the_run_is_refused_with_both_ids_and_the_fix(ledger: Ledger) -> None:
    ledger.start_run("wl", "r1", "openai", "m", batch_conn_id="openai_a")
    with pytest.raises(ConfigurationError) as caught:
        check_run_connection(ledger, "wl", "r1", "anthropic_b", "wl.wait")
    message = str(caught.value)
    assert "wl.wait" in message and "'anthropic_b'" in message and "started on 'openai_a'" in message
    assert "Set it back to 'openai_a'" in message and "next run" in message


PROMPT = PromptTemplate(version="v1", model="m", user="{{ text }}")


def test_a_task_rendering_the_prompt_its_run_started_with_goes_ahead(ledger: Ledger) -> None:
    ledger.start_run("wl", "r1", "openai", "m")
    keep_run_prompt(ledger, "wl", "r1", PROMPT, "wl.prepare")
    keep_run_prompt(ledger, "wl", "r1", PROMPT, "wl.prepare")  # a cleared prepare, same prompt
    check_run_prompt(
        ledger, "wl", "r1", PromptTemplate(version="v1", model="m", user="{{ text }}"), "wl.submit"
    )
    check_run_prompt(ledger, "wl", "r2", replace(PROMPT, version="v9"), "wl.prepare")  # not started yet


def test_a_prompt_edited_during_the_run_is_refused_naming_both_versions_and_the_fix(ledger: Ledger) -> None:
    ledger.start_run("wl", "r1", "openai", "m")
    keep_run_prompt(ledger, "wl", "r1", PROMPT, "wl.prepare")
    edited = replace(PROMPT, version="v2", output_format="json", output_schema={"type": "object"})
    for task in (check_run_prompt, keep_run_prompt):  # a later task, and a cleared prepare
        with pytest.raises(ConfigurationError) as caught:
            task(ledger, "wl", "r1", edited, "wl.reconcile")
        message = str(caught.value)
        assert "wl.reconcile" in message and "renders prompt 'v2'" in message
        assert "started with prompt 'v1'" in message and "Put prompt 'v1' back" in message
        assert edited.fingerprint[:12] in message and PROMPT.fingerprint[:12] in message


def test_the_same_version_with_another_schema_is_refused_as_other_content(ledger: Ledger) -> None:
    ledger.start_run("wl", "r1", "openai", "m")
    keep_run_prompt(ledger, "wl", "r1", PROMPT, "wl.prepare")
    with pytest.raises(ConfigurationError, match="renders prompt 'v1' with other content"):
        check_run_prompt(ledger, "wl", "r1", replace(PROMPT, output_format="json"), "wl.publish")


def test_a_prompt_edited_in_place_since_an_earlier_run_is_warned_with_both_digests_and_the_remedy(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from airflow_batch_provider.services.runs import warn_prompt_edited_in_place

    log = logging.getLogger("test.prepare")
    edited = replace(PROMPT, system="Answer in one word.", name="labels")
    ledger.start_run("wl", "r1", "openai", "m")
    keep_run_prompt(ledger, "wl", "r1", PROMPT, "wl.prepare")
    ledger.start_run("wl", "r2", "openai", "m")
    keep_run_prompt(ledger, "wl", "r2", PROMPT, "wl.prepare")
    with caplog.at_level(logging.WARNING, logger="test.prepare"):
        assert warn_prompt_edited_in_place(ledger, "wl", "r2", PROMPT, log) is None  # the same content
        assert not caplog.records
        ledger.start_run("wl", "r3", "openai", "m")
        keep_run_prompt(ledger, "wl", "r3", edited, "wl.prepare")
        edit = warn_prompt_edited_in_place(ledger, "wl", "r3", edited, log)
    assert edit is not None and (edit.run_id, edit.previous_sha256) == ("r2", PROMPT.fingerprint)
    [warning] = [r.getMessage() for r in caplog.records]
    assert "'labels'" in warning and "'v1'" in warning and "prompt_changed" in warning
    assert PROMPT.fingerprint[:12] in warning and edited.fingerprint[:12] in warning
    assert "Bump `version` to keep old answers comparable" in warning
