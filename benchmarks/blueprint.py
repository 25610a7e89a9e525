"""The seeds' blueprint, the naive floor: the same pipeline written the way a first DAG writes it.

Lists of dicts everywhere: every record loaded into a list, every request built into a list and
written in slices of 50,000 lines, the OpenAI SDK called directly, each result file read whole as
text (``files.content(...).text``) and parsed into a list of dicts, results joined to the records
by a dict of custom ids, ``results.jsonl`` written from a list. No ledger, no idempotence, no
resubmission: a failed line stays failed. Each stage runs in its own process (``e2e.py``), as the
package's tasks do; what a stage returns travels to the next as it would through XCom (paths and
ids only, small).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

PER_FILE = 50_000
MODEL = "gpt-4o-mini"
SYSTEM = "Classify the customer comment as positive, negative or mixed. Answer with one word."


def prepare_imports() -> None:
    """Import Airflow's task SDK and the OpenAI SDK, as its tasks (PythonOperators) would."""
    import airflow.sdk  # noqa: F401
    import openai  # noqa: F401


def client() -> Any:
    """The OpenAI SDK client pointed at the emulator."""
    import openai

    return openai.OpenAI(base_url=os.environ["BENCH_EMULATOR_URL"] + "/v1", api_key="sk-bench", max_retries=5)


def load_records(path: str) -> list[dict[str, Any]]:
    """Every record, in a list."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def stage_prepare(spec: dict[str, Any]) -> dict[str, Any]:
    """Build every request in a list and write them in files of 50,000 lines."""
    records = load_records(spec["records"])
    requests = [
        {
            "custom_id": r["id"],
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["text"]}],
                "max_tokens": 16,
            },
        }
        for r in records
    ]
    paths = []
    for i in range(0, len(requests), PER_FILE):
        path = Path(spec["dir"]) / f"naive-input-{i // PER_FILE:04d}.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in requests[i : i + PER_FILE]) + "\n")
        paths.append(str(path))
    return {"inputs": paths}


def stage_submit(spec: dict[str, Any]) -> dict[str, Any]:
    """Upload each file and create its batch."""
    api = client()
    ids = []
    for path in spec["inputs"]:
        with open(path, "rb") as fh:
            uploaded = api.files.create(file=fh, purpose="batch")
        batch = api.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        ids.append(batch.id)
    return {"batch_ids": ids}


def stage_wait(spec: dict[str, Any]) -> dict[str, Any]:
    """Poll each batch until it ends."""
    api = client()
    done, polls = [], 0
    for batch_id in spec["batch_ids"]:
        while True:
            polls += 1
            batch = api.batches.retrieve(batch_id)
            if batch.status in ("completed", "failed", "expired", "cancelled"):
                done.append({"id": batch.id, "output": batch.output_file_id, "error": batch.error_file_id})
                break
            time.sleep(0.5)
    return {"done": done, "polls": polls}


def stage_download(spec: dict[str, Any]) -> dict[str, Any]:
    """Read each result file whole as text and write it to disk."""
    api = client()
    paths = []
    for i, batch in enumerate(spec["done"]):
        for kind in ("output", "error"):
            if batch[kind]:
                text = api.files.content(batch[kind]).text
                path = Path(spec["dir"]) / f"naive-{kind}-{i:04d}.jsonl"
                path.write_text(text)
                paths.append(str(path))
    return {"results": paths}


def stage_reconcile(spec: dict[str, Any]) -> dict[str, Any]:
    """Parse every result file into a list of dicts, join them to the records, write results.jsonl."""
    records = load_records(spec["records"])
    results: list[dict[str, Any]] = []
    for path in spec["results"]:
        text = Path(path).read_text()
        results += [json.loads(line) for line in text.splitlines() if line.strip()]
    by_id = {r["custom_id"]: r for r in results}
    merged = []
    for rec in records:
        got = by_id.get(rec["id"])
        response = (got or {}).get("response") or {}
        if got is not None and response.get("status_code") == 200:
            answer = response["body"]["choices"][0]["message"]["content"]
            merged.append({**rec, "state": "succeeded", "output": answer})
        else:
            error = (got or {}).get("error") or response.get("body", {}).get("error")
            merged.append({**rec, "state": "failed", "output": None, "error": error})
    out = Path(spec["dir"]) / "naive-results.jsonl"
    out.write_text("".join(json.dumps(m) + "\n" for m in merged))
    return {"merged": str(out)}


def stage_publish(spec: dict[str, Any]) -> dict[str, Any]:
    """Read the merged results whole, count them, write the published file and a report."""
    rows = [json.loads(line) for line in Path(spec["merged"]).read_text().splitlines()]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    published = Path(spec["dir"]) / "naive-published.jsonl"
    published.write_text("".join(json.dumps({"id": r["id"], "output": r["output"]}) + "\n" for r in rows))
    (Path(spec["dir"]) / "naive-report.json").write_text(json.dumps(counts))
    return {"counts": counts}


STAGES = {
    "prepare": stage_prepare,
    "submit": stage_submit,
    "wait": stage_wait,
    "download": stage_download,
    "reconcile": stage_reconcile,
    "publish": stage_publish,
}
