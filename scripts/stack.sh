#!/usr/bin/env bash
# make stack / make stack-down: the provider under a real Airflow (api-server, scheduler,
# dag-processor, triggerer), PostgreSQL and the emulator, without Docker. See scripts/stack.py.
#   scripts/stack.sh up | down | status
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
exec python "$ROOT/scripts/stack.py" "$@"
