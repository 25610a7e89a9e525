#!/usr/bin/env bash
# make demo: the nightly feedback-classification DAG end to end on the embedded defaults:
# the local emulator (OpenAI-compatible, with a few faults injected), the SQLite ledger and local
# staging, run by a real Airflow with `airflow dags test`. Run it twice: the second run skips
# every unchanged comment.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
DEMO="${ABP_DEMO_DIR:-$ROOT/.demo}"  # tests point it at a temporary folder
mkdir -p "$DEMO"

export AIRFLOW_HOME="$DEMO/airflow"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/dags"
export AIRFLOW__CORE__UNIT_TEST_MODE=False
export AIRFLOW__BATCH_PROVIDER__LEDGER_URL="sqlite:///$DEMO/ledger.sqlite"
export AIRFLOW__BATCH_PROVIDER__STAGING_ROOT="file://$DEMO/staging"
export AIRFLOW__BATCH_PROVIDER__POLL_INITIAL_INTERVAL=0.5
export AIRFLOW__BATCH_PROVIDER__POLL_FACTOR=1.3
export AIRFLOW__BATCH_PROVIDER__POLL_MAX_INTERVAL=3
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

echo "==> starting the emulator on 127.0.0.1 (2% server errors, 1% missing lines, batches ~1 s)"
python -m batch_emulator --port 0 --time-scale 0.05 --seed 7 \
  --fault rate_500=0.02 --fault rate_missing=0.01 --fault rate_duplicate=0.01 >"$DEMO/emulator.log" 2>&1 &
EMULATOR_PID=$!
trap 'kill "$EMULATOR_PID" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$DEMO/emulator.log" | head -n 1 || true)
  [ -n "$URL" ] && break
  kill -0 "$EMULATOR_PID" 2>/dev/null || { cat "$DEMO/emulator.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "${URL:-}" ] || { echo "the emulator did not start; see $DEMO/emulator.log" >&2; exit 1; }
echo "    $URL"
export AIRFLOW_CONN_OPENAI_BATCH_DEFAULT="{\"conn_type\": \"openai_batch\", \"host\": \"$URL/v1\", \"password\": \"sk-emulator\"}"

echo "==> airflow db migrate ($AIRFLOW_HOME)"
airflow db migrate >"$DEMO/db-migrate.log" 2>&1 || { tail -n 40 "$DEMO/db-migrate.log" >&2; exit 1; }

echo "==> airflow dags test nightly_feedback_classification (log: $DEMO/last-run.log)"
if ! airflow dags test nightly_feedback_classification >"$DEMO/last-run.log" 2>&1; then
  tail -n 60 "$DEMO/last-run.log" >&2
  echo "the DAG run failed; the whole log is $DEMO/last-run.log" >&2
  exit 1
fi

python - <<'PY'
import json, os
from pathlib import Path
from airflow_batch_provider.ledger import Ledger

ledger = Ledger.from_url(os.environ["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
run = ledger.runs("feedback_classification", limit=1)[0]
report = json.loads(run["report_json"])
staging = Path(os.environ["AIRFLOW__BATCH_PROVIDER__STAGING_ROOT"].removeprefix("file://"))
folders = sorted((staging / "feedback_classification").iterdir(), key=lambda p: p.stat().st_mtime)
folder = folders[-1]
jobs = ledger.get_jobs("feedback_classification", run["run_id"])
print()
print(f"run {run['run_id']}")
print(f"jobs: {len(jobs)} provider batches over {len({j.round for j in jobs})} round(s)")
print("items by state:", ", ".join(f"{k} {v:,}" for k, v in sorted(report["states"].items())))
print()
print(report["table"])
print()
print("first results:")
with open(folder / "results.jsonl", encoding="utf-8") as fh:
    for _, line in zip(range(3), fh):
        row = json.loads(line)
        print(f"  {row['id']}: {row['state']:<10} {json.dumps(row['output'])}")
print()
print(f"results: {folder / 'results.jsonl'}")
print(f"report:  {folder / 'report.json'}")
print(f"ledger:  {os.environ['AIRFLOW__BATCH_PROVIDER__LEDGER_URL']}")
print("run `make demo` again: every unchanged comment is skipped and nothing is paid twice.")
PY
