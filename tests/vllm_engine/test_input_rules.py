"""The lane's input rules (``adapters/vllm_input.py``) agree with the engine's own pydantic models.

vLLM's ``BatchRequestInput`` validates each case in the engine's interpreter (no engine start):
a line the lane lets through the engine accepts, and a line it refuses the engine refuses at the
same field.
"""

from __future__ import annotations

import json

import pytest

from airflow_batch_provider.adapters.vllm_input import engine_refusal
from tests.unit.adapters.test_vllm_input import CASES
from tests.vllm_engine.conftest import Engine

pytestmark = pytest.mark.timeout(1200)  # importing the engine takes minutes on a busy machine

VALIDATE = """
import json, sys
from pydantic import ValidationError
from vllm.entrypoints.launchers.run_batch import BatchRequestInput
out = []
for line in json.loads(sys.argv[1]):
    try:
        BatchRequestInput.model_validate_json(json.dumps(line))
        out.append(None)
    except ValidationError as exc:
        out.append([str(p) for p in exc.errors()[0]["loc"]])
print(json.dumps(out))
"""


def test_the_engine_accepts_what_the_lane_accepts_and_refuses_the_rest_at_the_same_field(
    engine: Engine,
) -> None:
    lines = [line for line, _ in CASES]
    proc = engine.run(VALIDATE, json.dumps(lines))
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdicts = json.loads(proc.stdout.strip().splitlines()[-1])
    for line, verdict in zip(lines, verdicts, strict=True):
        ours = engine_refusal(line)
        assert (ours is None) == (verdict is None), (line, ours, verdict)
        if verdict is not None and ours is not None:
            # the engine's path also names the union members it tried (``messages.0.<member>.role``)
            remaining = iter(verdict)
            path = ours.splitlines()[1].split(".")
            assert all(part in remaining for part in path), (path, verdict)
