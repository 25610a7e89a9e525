"""What the stateful workload's steps are made of: a kill at a fail point, the prompt's versions, one DAG run's record.

:class:`~tests.support.stateful.StatefulWorkload` drives the runs with these; the property test
and :mod:`tests.support.stateful_invariants` read them.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Final

from airflow_batch_provider.core import failpoints
from airflow_batch_provider.core.requests import PromptTemplate

#: the run's deadline before and after :meth:`StatefulWorkload.pass_deadline`
FAR: Final = "2099-01-01T00:00:00+00:00"
PAST: Final = "2001-01-01T00:00:00+00:00"
#: the system prompt of every version (the wording an edit in place appends to)
SYSTEM = "Label the sentiment of the comment: positive, negative or neutral."

TaskKey = tuple[str, int, int]


class Killed(BaseException):
    """A fail point fired: the task's process is gone (no ``except Exception`` may catch this)."""


class NotYet(Exception):
    """The wait task's poke said the batch is not done yet (the task stays where it is)."""


class SleptInSlot(Exception):
    """A task called ``time.sleep`` where it should have deferred (the task is left failed)."""


@contextmanager
def killing_at(name: str) -> Iterator[None]:
    """Arm the fail point ``name`` (``name=N``: its N-th hit) so that it raises :class:`Killed`.

    :param name: a name of :data:`~airflow_batch_provider.core.failpoints.FAILPOINTS`
    """

    def kill(pid: int, sig: int) -> None:
        raise Killed(name)

    shim = SimpleNamespace(environ=os.environ, getpid=os.getpid, kill=kill)
    saved_os, saved_env = failpoints.os, os.environ.get(failpoints.ENV_VAR)
    failpoints._hits.clear()
    os.environ[failpoints.ENV_VAR] = name
    failpoints.os = shim  # type: ignore[assignment]
    try:
        yield
    finally:
        failpoints.os = saved_os
        failpoints._hits.clear()
        if saved_env is None:
            os.environ.pop(failpoints.ENV_VAR, None)
        else:
            os.environ[failpoints.ENV_VAR] = saved_env


@contextmanager
def shared_ssl_contexts() -> Iterator[None]:
    """Build each kind of default SSL context once (every SDK client builds one: 0.15 s of CA loading).

    The emulator speaks plain HTTP, so no context is ever used; without this, loading the CA
    bundle for each operator's client is most of a step's time.
    """
    made: dict[tuple[Any, ...], ssl.SSLContext] = {}
    original = ssl.create_default_context

    def cached(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        key = (args, tuple(sorted(kwargs.items())))
        if key not in made:
            made[key] = original(*args, **kwargs)
        return made[key]

    ssl.create_default_context = cached  # type: ignore[assignment]
    try:
        yield
    finally:
        ssl.create_default_context = original


def prompt_variant(model: str, version: str, wording: str = "") -> PromptTemplate:
    """The workload's prompt at a version, with an optional change of wording (an edit in place).

    ``v1`` asks for text; any other version asks for JSON with a ``label`` key, which the
    emulator's answers never have (each of its answers is ``invalid_output``): an answer judged
    by a version other than its own shows.

    :param model: the model
    :param version: the prompt version
    :param wording: appended to the system prompt (``""``: the original wording)
    """
    if version == "v1":
        return PromptTemplate(
            version=version,
            model=model,
            system=SYSTEM + wording,
            user="Comment {{ id }}: {{ text }}",
            params={"max_tokens": 16},
            name="stateful",
        )
    return PromptTemplate(
        version=version,
        model=model,
        system=SYSTEM + " Answer in JSON with the key label." + wording,
        user="Comment {{ id }}: {{ text }}",
        params={"max_tokens": 64},
        output_format="json",
        output_schema={"type": "object", "required": ["label"]},
        name="stateful",
    )


@dataclass
class Run:
    """One DAG run of the workload: the results (XComs) of the tasks it has run.

    :param run_id: the run id
    :param done: task key -> its result
    :param tries: task key -> how often it was started (the try number of the next start)
    :param deadline: the run's deadline (ISO moment)
    :param finished: its publish task ran
    :param abandoned: marked failed by the user (Airflow says it is no longer running)
    :param killed: its process was killed where no scheduler marks it failed: Airflow still says
        ``running``, its task instances have no sign of life, and none of its tasks runs again
        until the run is cleared
    :param report: the report its last publish wrote (the comparable part)
    :param published_after_change: an input or prompt change happened since that publish
    :param publish_followed_change: its last publish came after an input or prompt change (the
        flag above as that publish found it; the invariants read it after the publish ran)
    :param prompt_version: the prompt version its prepare rendered
    :param records: the input its prepare read
    :param prompt: the prompt its prepare rendered
    :param in_flight_at_prepare: the items (key, prompt version) a batch held when its prepare read
        the input (a job with a batch, or whose create may have reached the provider): the send
        guard keeps them with that batch, so they are answered for the input it was sent with
    :param published_while_finished: its last publish ran while the ledger held the run finished
        (its report recorded and the run not reopened by a cleared prepare): that publish must
        leave the recorded report as it was
    """

    run_id: str
    done: dict[TaskKey, Any] = field(default_factory=dict)
    tries: dict[TaskKey, int] = field(default_factory=dict)
    deadline: str = FAR
    finished: bool = False
    abandoned: bool = False
    killed: bool = False
    report: dict[str, Any] | None = None
    published_after_change: bool = False
    publish_followed_change: bool = False
    prompt_version: str = "v1"
    records: list[dict[str, str]] = field(default_factory=list)
    prompt: PromptTemplate | None = None
    published_while_finished: bool = False
    in_flight_at_prepare: frozenset[tuple[str, str]] = frozenset()


#: report fields that name when, not what
REPORT_VOLATILE: Final = frozenset(
    {"generated_at", "finished_at", "started_at", "table", "report", "duration_s"}
)


def comparable_report(report: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a published report that must not change once the run is finished.

    :param report: the report (``runs.report_json``)
    """
    return {k: v for k, v in report.items() if k not in REPORT_VOLATILE and not k.endswith("_at")}
