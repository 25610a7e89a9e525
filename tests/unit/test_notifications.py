"""Alerts: every kind of event reaches Airflow notifiers and callables, rendered per event, and a
broken notifier never fails the task nor silences the others."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from airflow.sdk.bases.notifier import BaseNotifier

from airflow_batch_provider.notifications import (
    EVENT_KINDS,
    BatchAlerts,
    BatchEvent,
    batch_failed,
    batch_in_doubt,
    budget_refused,
    deadline_missed,
    review_growth,
    run_summary,
)

RUN = "scheduled__2026-11-29T02:00:00+00:00"


class TemplatedNotifier(BaseNotifier):
    """Shaped like the Slack and SMTP notifiers: templated fields rendered against the context."""

    template_fields = ("text",)

    def __init__(self, text: str, sent: list[str]) -> None:
        super().__init__()
        self.text = text
        self.sent = sent

    def notify(self, context: Any) -> None:
        self.sent.append(self.text)


class BrokenNotifier(BaseNotifier):
    def notify(self, context: Any) -> None:
        raise ConnectionError("the chat server is down")


@pytest.fixture
def context() -> dict[str, Any]:
    from airflow.sdk import DAG

    return {"dag": DAG("nightly_reviews", schedule=None), "run_id": RUN}


def every_event() -> Iterator[BatchEvent]:
    yield deadline_missed("wl", RUN, deadline="2026-11-29T06:00:00+00:00", open_items=12)
    yield budget_refused(
        "wl", RUN, budget=Decimal("5"), spent=Decimal("4.90"), needed=Decimal("0.40"), items=300
    )
    yield batch_failed(
        "wl",
        RUN,
        job_id="wl:r:r1:c00000",
        batch_id="batch_9",
        provider="openai",
        lines=500,
        error_code="token_limit_exceeded",
    )
    yield batch_in_doubt("wl", RUN, job_id="wl:r:r1:c00001", provider="openai", lines=500, reason="timeout")
    yield review_growth("wl", RUN, added=80, queue=130)
    yield run_summary(
        "wl",
        RUN,
        {
            "items_by_state": {"succeeded": 90, "review": 10},
            "paid": "1.20",
            "cost_per_usable_result": "0.0133",
            "savings": "1.20",
            "usable_results": 90,
        },
    )


def test_there_is_an_event_for_every_kind_and_each_says_what_and_how_much() -> None:
    events = list(every_event())

    assert [e.kind for e in events] == list(EVENT_KINDS)
    assert "12 items still open" in events[0].message
    assert "$4.90 of the $5 budget" in events[1].message
    assert "token_limit_exceeded" in events[2].message and "batch_9" in events[2].message
    assert "not created again" in events[3].message
    assert "80 items went to review" in events[4].message
    assert "succeeded 90, review 10" in events[5].message and "$0.0133 per usable result" in events[5].message
    for event in events:
        json.dumps(event.as_dict())


def test_an_airflow_notifier_is_rendered_afresh_for_each_event(context: dict[str, Any]) -> None:
    sent: list[str] = []
    notifier = TemplatedNotifier(
        "{{ batch_event.kind }} in {{ batch_event.workload }} ({{ dag.dag_id }})", sent
    )
    alerts = BatchAlerts(notifiers=(notifier,))

    for event in every_event():
        assert alerts.emit(context, event) == 1

    assert sent == [f"{kind} in wl (nightly_reviews)" for kind in EVENT_KINDS]
    # the configured notifier keeps its template for the next run
    assert notifier.text.startswith("{{ batch_event.kind }}")


def test_a_callable_gets_the_context_and_the_event(context: dict[str, Any]) -> None:
    got: list[tuple[str, str]] = []
    alerts = BatchAlerts(notifiers=(lambda ctx, event: got.append((ctx["run_id"], event.kind)),))

    alerts.emit(context, review_growth("wl", RUN, added=5, queue=5))

    assert got == [(RUN, "review_growth")]


def test_a_broken_notifier_neither_fails_the_task_nor_silences_the_others(context: dict[str, Any]) -> None:
    sent: list[str] = []
    alerts = BatchAlerts(notifiers=(BrokenNotifier(), TemplatedNotifier("{{ batch_event.kind }}", sent)))

    assert (
        alerts.emit(context, batch_in_doubt("wl", RUN, job_id="j", provider="openai", lines=1, reason="x"))
        == 1
    )
    assert sent == ["batch_in_doubt"]


def test_only_the_chosen_kinds_are_sent(context: dict[str, Any]) -> None:
    sent: list[str] = []
    alerts = BatchAlerts(notifiers=(TemplatedNotifier("{{ batch_event.kind }}", sent),), on={"batch_failed"})

    for event in every_event():
        alerts.emit(context, event)

    assert sent == ["batch_failed"]


def test_review_growth_is_an_event_from_the_threshold_on(context: dict[str, Any]) -> None:
    sent: list[str] = []
    alerts = BatchAlerts(
        notifiers=(TemplatedNotifier("{{ batch_event.message }}", sent),), review_growth_threshold=10
    )

    assert alerts.review_growth(context, "wl", RUN, added=9, queue=9) is None
    event = alerts.review_growth(context, "wl", RUN, added=10, queue=19)

    assert event is not None and event.dag_id == "nightly_reviews"
    assert len(sent) == 1 and "10 items went to review" in sent[0]


def test_a_misconfigured_alerts_object_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="unknown kinds"):
        BatchAlerts(on={"deadline_mised"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="review_growth_threshold"):
        BatchAlerts(review_growth_threshold=0)
    with pytest.raises(TypeError, match="BaseNotifier or a callable"):
        BatchAlerts(notifiers=("slack",))


class SmtpCatcher:
    """A real SMTP server on loopback (the standard library's, in a thread) that keeps what it gets."""

    def __init__(self) -> None:
        import smtpd

        catcher = self
        self.messages: list[bytes] = []

        class Server(smtpd.SMTPServer):
            def process_message(
                self, peer: Any, mailfrom: str, rcpttos: list[str], data: bytes | str, **kw: Any
            ) -> None:
                catcher.messages.append(data if isinstance(data, bytes) else data.encode())

        self.server = Server(("127.0.0.1", 0), None)  # type: ignore[arg-type]
        assert self.server.socket is not None
        self.port = self.server.socket.getsockname()[1]

    def __enter__(self) -> SmtpCatcher:
        import asyncore
        import threading

        self.thread = threading.Thread(target=asyncore.loop, kwargs={"timeout": 0.1}, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.close()
        self.thread.join(timeout=30)


def test_airflows_smtp_notifier_sends_the_event_as_a_mail(
    context: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from email import message_from_bytes

    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    with SmtpCatcher() as smtp:
        monkeypatch.setenv(
            "AIRFLOW_CONN_SMTP_ALERTS",
            json.dumps(
                {
                    "conn_type": "smtp",
                    "host": "127.0.0.1",
                    "port": smtp.port,
                    "extra": {"disable_ssl": True, "disable_tls": True},
                }
            ),
        )
        notifier = SmtpNotifier(
            to="oncall@example.com",
            from_email="airflow@example.com",
            subject="[LLM batch] {{ batch_event.kind }}: {{ batch_event.workload }}",
            html_content="<p>{{ batch_event.message }}</p>",
            smtp_conn_id="smtp_alerts",
        )
        event = deadline_missed("wl", RUN, deadline="2026-11-29T06:00:00+00:00", open_items=3)

        assert BatchAlerts(notifiers=(notifier,)).emit(context, event) == 1

    assert len(smtp.messages) == 1
    mail = message_from_bytes(smtp.messages[0])
    assert mail["Subject"] == "[LLM batch] deadline_missed: wl"
    body = "".join(
        bytes(part.get_payload(decode=True)).decode() for part in mail.walk() if not part.is_multipart()
    )
    assert "3 items still open" in body


def test_the_run_summary_names_each_route_with_items_exhausted_sync_apart_from_fallback() -> None:
    report = {
        "items_by_state": {"succeeded": 100},
        "items_by_route": {"batch": 90, "resubmitted": 0, "fallback": 4, "exhausted_sync": 6, "unchanged": 0},
        "paid": "1.20",
    }
    event = run_summary("wl", RUN, report)
    assert "routes: batch 90, fallback 4, exhausted_sync 6" in event.message
    assert event.details["items_by_route"] == report["items_by_route"]
    assert "routes" not in run_summary("wl", RUN, {"items_by_state": {"succeeded": 1}}).message
