"""A pod that exited because its engine refused one line of the file: find it, reject it, spare the rest.

``vllm run-batch`` checks every line before it answers any (0.33 before it loads the model) and,
when one is invalid, exits 1 with no output, naming it: ``Invalid request on line N: <pydantic's
words>``. The lane checks each line as the engine does before the pod starts
(:mod:`~airflow_batch_provider.adapters.vllm_input`); a rule those checks miss (a newer engine's)
still fails the pod. Then the pod's log names the line: it is read from the job's staged chunk,
its item goes to ``review`` with the engine's message, and every other item of the job goes to
the next round with its attempt given back (:mod:`~airflow_batch_provider.ledger.refused_lines`).
A line number the chunk does not have, a pod that wrote output, or a log that names no line
(vLLM 0.32 raises pydantic's ``ValidationError`` without the line's number) changes nothing: the
job fails ``exit_1`` and its items are retried as after any failed pod.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.ledger.records import JobRow
from airflow_batch_provider.ledger.refused_lines import settle_refused_line

#: The engine's words for a refused line (``ValueError: Invalid request on line N: ...``).
INVALID_LINE: Final = re.compile(r"Invalid request on line (\d+)")
#: A line that starts a new log record or traceback: the refusal's message ends before it.
_NEW_RECORD: Final = re.compile(r"^(\(|\[|\d{4}-\d\d-\d\d|INFO|WARNING|ERROR|DEBUG|Traceback)")
#: Lines of pydantic's message kept after the first.
_MESSAGE_LINES: Final = 8


def named_line(log: str) -> tuple[int, str] | None:
    """The line the engine refused and its message, from the pod's log (``None``: no line named).

    :param log: the pod's log (its tail)
    """
    matches = list(INVALID_LINE.finditer(log))
    if not matches:
        return None
    last = matches[-1]
    first, *rest = log[last.start() :].splitlines()
    kept = [first.rstrip()]
    for line in rest[:_MESSAGE_LINES]:
        if not line.strip() or _NEW_RECORD.match(line):
            break
        kept.append(line.rstrip())
    return int(last[1]), "\n".join(kept)


def settle_named_line(ledger: Ledger, job: JobRow, chunk: Any, number: int, message: str) -> str | None:
    """Reject the item on line ``number`` of the job's chunk; give the others their attempt back.

    Returns the refused line's custom id, or ``None`` when the chunk has no such line (nothing is
    changed then).

    :param ledger: the ledger
    :param job: the job whose pod the engine refused
    :param chunk: the job's staged input file (a path or an ``ObjectStoragePath``)
    :param number: the 1-based line number the engine named
    :param message: the engine's words
    """
    custom_id = _custom_id_on_line(chunk, number)
    if custom_id is None:
        return None
    note = (
        f"vllm run-batch refused line {number} of job {job.job_id}'s file ({custom_id}) and with it the "
        f"whole file: {message}. Fix the prompt's params or the record (the lane's own checks did not "
        "catch this rule); the job's other items are sent again without being charged an attempt."
    )
    settle_refused_line(ledger, job.job_id, custom_id, note)
    return custom_id


def _custom_id_on_line(chunk: Any, number: int) -> str | None:
    if number < 1:
        return None
    try:
        with chunk.open("r", encoding="utf-8") as fh:
            for index, raw in enumerate(fh, start=1):
                if index == number:
                    value = json.loads(raw).get("custom_id")
                    return value if isinstance(value, str) and value else None
    except (OSError, ValueError, AttributeError):
        return None
    return None
