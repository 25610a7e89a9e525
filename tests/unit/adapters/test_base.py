"""The adapter contract's shared pieces: the create rule, failure codes, status serialisation."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from airflow_batch_provider.adapters.base import (
    AmbiguousReply,
    BatchStatus,
    CreateFailure,
    create_once,
    failure_code,
    http_failure,
)
from airflow_batch_provider.core.ratelimit import RetryPolicy
from airflow_batch_provider.exceptions import BatchInDoubtError

INTENT = datetime(2026, 1, 1, tzinfo=timezone.utc)
POLICY = RetryPolicy(max_attempts=3, initial_delay=0.5, max_delay=4.0, jitter=0.0)


class Refused(Exception):
    def __init__(self, retry_after: float | None = None) -> None:
        self.retry_after = retry_after


class Lost(Exception):
    """The provider acted and the answer was lost."""


class Invalid(Exception):
    """A 400: nothing was created, and sending again cannot help."""


def classify(exc: Exception) -> CreateFailure | None:
    if isinstance(exc, Refused):
        return CreateFailure("refused", exc.retry_after)
    if isinstance(exc, Lost):
        return CreateFailure("ambiguous")
    return None


class Provider:
    """A provider that fails each create as scripted and remembers what it created."""

    def __init__(self, *script: Exception | None) -> None:
        self.script = list(script)
        self.created: list[str] = []
        self.waits: list[float] = []

    def create(self) -> str:
        fault = self.script.pop(0) if self.script else None
        if isinstance(fault, (Refused, Invalid)):
            raise fault
        self.created.append(f"batch-{len(self.created)}")
        if isinstance(fault, Lost):
            raise fault
        return self.created[-1]

    def lookup(self) -> str | None:
        return self.created[-1] if self.created else None

    def run(self, lookup: bool = True, **kw: object) -> str:
        return create_once(
            key="job-1",
            what="batch create",
            create=self.create,
            lookup=self.lookup if lookup else None,
            classify=classify,
            policy=POLICY,
            created_after=INTENT,
            sleep=self.waits.append,
            **kw,  # type: ignore[arg-type]
        )


def test_a_lost_reply_is_found_by_key_and_never_sent_again() -> None:
    provider = Provider(Lost())
    assert provider.run() == "batch-0"
    assert provider.created == ["batch-0"]


def test_a_refusal_is_sent_again_after_the_providers_retry_after() -> None:
    provider = Provider(Refused(retry_after=7.0), Refused())
    assert provider.run() == "batch-0"
    assert provider.waits == [7.0, 1.0], "Retry-After first, then the policy's backoff for try 2"


def test_a_refusal_on_every_try_is_raised_as_it_came() -> None:
    provider = Provider(Refused(), Refused(), Refused())
    with pytest.raises(Refused):
        provider.run()
    assert provider.created == []


def test_an_error_that_proves_nothing_was_created_is_raised_at_once() -> None:
    provider = Provider(Invalid())
    with pytest.raises(Invalid):
        provider.run()
    assert provider.waits == []


def test_an_ambiguous_failure_with_nothing_found_is_sent_again_and_in_doubt_on_the_last_try() -> None:
    class Vanishing(Provider):
        def lookup(self) -> str | None:
            return None

    provider = Vanishing(Lost(), Lost(), Lost())
    with pytest.raises(BatchInDoubtError, match="job job-1 is in doubt") as caught:
        provider.run()
    assert len(provider.created) == 3, "sent again only after every look found nothing"
    assert caught.value.created_after == INTENT


def test_a_provider_that_cannot_be_asked_puts_the_job_in_doubt_at_once() -> None:
    provider = Provider(Lost())
    with pytest.raises(BatchInDoubtError, match="cannot be asked") as caught:
        provider.run(lookup=False, request_count=12)
    assert (caught.value.key, caught.value.request_count) == ("job-1", 12)
    assert provider.created == ["batch-0"]


def test_a_look_up_that_fails_too_puts_the_job_in_doubt() -> None:
    class Blind(Provider):
        def lookup(self) -> str | None:
            raise Lost()

    provider = Blind(Lost())
    with pytest.raises(BatchInDoubtError, match="look-up by key failed"):
        provider.run()
    assert provider.created == ["batch-0"]


@pytest.mark.parametrize(
    ("status", "kind"),
    [(None, "ambiguous"), (500, "ambiguous"), (503, "ambiguous"), (408, "ambiguous"), (429, "refused")],
)
def test_http_failures_are_read_by_status(status: int | None, kind: str) -> None:
    failure = http_failure(status, {"retry-after": "3"})
    assert failure is not None and failure.kind == kind


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_a_client_error_is_not_retried(status: int) -> None:
    assert http_failure(status) is None


@pytest.mark.parametrize(
    ("words", "code"),
    [
        (("token_limit_exceeded", "Enqueued token limit reached for gpt-4o"), "token_limit_exceeded"),
        (("insufficient_quota", "You exceeded your current quota"), "quota_exceeded"),
        (("RESOURCE_EXHAUSTED",), "quota_exceeded"),
        (("invalid_json_line", "This line is not a JSON object."), "invalid_file"),
        (("ValidationException: the input failed validation",), "invalid_file"),
        (("something else",), "provider_error"),
    ],
)
def test_failure_codes_are_normalised_across_providers(words: tuple[str, ...], code: str) -> None:
    assert failure_code(*words) == code


def test_a_status_keeps_its_error_code_through_a_trigger_event() -> None:
    status = BatchStatus("failed", error_code="token_limit_exceeded", error_message="Enqueued token limit")
    assert BatchStatus.from_dict(status.to_dict()) == status
    assert BatchStatus.from_dict({"state": "completed"}).error_code is None


def test_an_unreadable_answer_is_ambiguous_whatever_the_classifier_says() -> None:
    class Garbled(Provider):
        def create(self) -> str:
            self.created.append("batch-0")
            raise AmbiguousReply("the answer had no id")

    provider = Garbled()
    assert (
        create_once(
            key="job-1",
            what="batch create",
            create=provider.create,
            lookup=provider.lookup,
            classify=lambda exc: None,
            policy=POLICY,
            created_after=INTENT,
            sleep=provider.waits.append,
        )
        == "batch-0"
    )
    assert provider.created == ["batch-0"]


def test_no_adapter_reads_retry_after_or_keeps_a_retryable_table_of_its_own() -> None:
    """One parser (core.ratelimit.parse_retry_after) and one table (core.ratelimit.is_retryable)."""
    import re
    from pathlib import Path

    import airflow_batch_provider.adapters as package

    copies = re.compile(
        r"parsedate_to_datetime|get\(\s*[\"']retry-after|\[[\"']retry-after|RETRYABLE_(?:ERRORS|STATUS|CODES)\s*[:=]"
        r"|_RETRYABLE_\w*\s*[:=]"
    )
    found = {
        path.name: copies.findall(path.read_text(encoding="utf-8"))
        for path in Path(package.__file__).parent.glob("*.py")
    }
    assert {name: hits for name, hits in found.items() if hits} == {}


def test_a_gemini_error_honours_an_http_date_retry_after_and_the_retry_info_detail() -> None:
    from email.utils import format_datetime
    from types import SimpleNamespace

    from airflow_batch_provider.adapters.gemini import _retry_after

    later = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=120), usegmt=True)
    dated = SimpleNamespace(response=SimpleNamespace(headers={"Retry-After": later}), details=None)
    assert 100 < (_retry_after(dated) or 0) <= 120
    millis = SimpleNamespace(response=SimpleNamespace(headers={"retry-after-ms": "1500"}), details=None)
    assert _retry_after(millis) == 1.5
    detail = {
        "error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}]}
    }
    assert _retry_after(SimpleNamespace(response=None, details=detail)) == 1.5
