#!/bin/bash
# Runs once, when the PostgreSQL volume is first initialised: the ledger gets its own role and
# database, apart from Airflow's metadata database. The ledger's tables are created by the
# provider on first use (Ledger.ensure_schema).
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v ledger_password="${LEDGER_DB_PASSWORD:?LEDGER_DB_PASSWORD is not set}" <<-'EOSQL'
	CREATE ROLE ledger LOGIN PASSWORD :'ledger_password';
	CREATE DATABASE ledger OWNER ledger;
EOSQL
