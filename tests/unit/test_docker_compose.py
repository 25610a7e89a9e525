"""The local Docker stack, checked without a Docker engine.

No engine runs here, so the stack itself is not started: these tests check what can be checked
from the files. The YAML parses; every service has an image or a build; the promised services,
settings and healthchecks are there; every ``AIRFLOW_CONN_*`` parses as an Airflow connection and
points where the stack can reach it; the emulator's own argument parser accepts its command
(loopback only); the ledger connection and ``ledger_url`` name the same database; the init script
really creates the ledger's role and database on a real PostgreSQL; only local-only defaults
appear as secrets; the Dockerfile installs the package with the constraints file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yaml"
DOCKERFILE = REPO / "docker" / "Dockerfile"
INIT_SCRIPT = REPO / "docker" / "postgres" / "init-ledger.sh"

AIRFLOW_SERVICES = {
    "airflow-init",
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
}
SERVICES = {"postgres", "emulator", *AIRFLOW_SERVICES}
# services that call the emulator (tasks run in the scheduler under LocalExecutor; the triggerer polls)
EMULATOR_CLIENTS = {"airflow-scheduler", "airflow-triggerer"}
# secrets the stack may carry: obvious local-only defaults, each overridable from the environment
LOCAL_ONLY_DEFAULTS = {
    "airflow",
    "ledger",
    "admin",
    "local-only-jwt-secret-change-me",
    "local-only-api-secret-change-me",
}
# the emulator accepts any key; these placeholders are no one's credential
EMULATOR_KEYS = {"sk-emulator", "sk-ant-emulator", "gemini-emulator"}
_VAR = re.compile(r"\$\{(?P<name>[A-Z0-9_]+)(?::-(?P<default>[^}]*))?\}")


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Resolve ``${VAR:-default}`` and ``$$`` the way Docker Compose does, in an empty environment."""
    env = env or {}
    resolved = _VAR.sub(lambda m: env.get(m["name"]) or (m["default"] or ""), value)
    return resolved.replace("$$", "$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(compose["services"])


def env_of(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {str(k): interpolate(str(v)) for k, v in raw.items()}


def raw_env_of(service: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (service.get("environment") or {}).items()}


def mounts_of(service: dict[str, Any]) -> dict[str, str]:
    """container path -> source (a named volume or a host path)."""
    out = {}
    for spec in service.get("volumes") or []:
        source, target, *_ = str(spec).split(":")
        out[target] = source
    return out


# ------------------------------------------------------------------------------------------ shape


def test_the_stack_has_every_promised_service(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == SERVICES


def test_every_service_has_an_image_or_a_build(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        assert service.get("image") or service.get("build"), name
        build = service.get("build")
        if build:
            assert (REPO / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE, name


def test_every_long_running_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if name == "airflow-init":
            assert service.get("restart") == "no"
            continue
        check = service.get("healthcheck")
        assert check and check.get("test"), f"{name} has no healthcheck"
        assert service.get("restart") == "unless-stopped", name


def test_airflow_services_wait_for_the_database_and_the_migration(
    services: dict[str, dict[str, Any]],
) -> None:
    assert services["airflow-init"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    command = "\n".join(services["airflow-init"]["command"])
    assert "airflow db migrate" in command
    for name in AIRFLOW_SERVICES - {"airflow-init"}:
        deps = services[name]["depends_on"]
        assert deps["postgres"] == {"condition": "service_healthy"}, name
        assert deps["airflow-init"] == {"condition": "service_completed_successfully"}, name
    assert services["airflow-api-server"]["command"] == "api-server"
    assert services["airflow-scheduler"]["command"] == "scheduler"
    assert services["airflow-dag-processor"]["command"] == "dag-processor"
    assert services["airflow-triggerer"]["command"] == "triggerer"


def test_airflow_runs_local_executor_on_postgres_with_the_simple_auth_manager(
    services: dict[str, dict[str, Any]],
) -> None:
    from sqlalchemy.engine import make_url

    for name in AIRFLOW_SERVICES:
        env = env_of(services[name])
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor", name
        meta = make_url(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        assert (meta.get_backend_name(), meta.host, meta.database) == ("postgresql", "postgres", "airflow")
        assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith("SimpleAuthManager"), name
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-api-server:8080/execution/"
    # the admin user exists: a user with the admin role, and its password written by airflow-init
    env = env_of(services["airflow-api-server"])
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    passwords = env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
    assert mounts_of(services["airflow-api-server"])[str(Path(passwords).parent)] == "airflow-auth"
    assert mounts_of(services["airflow-init"])[str(Path(passwords).parent)] == "airflow-auth"
    assert passwords in "\n".join(services["airflow-init"]["command"])


def test_the_api_server_is_published_on_loopback_only(services: dict[str, dict[str, Any]]) -> None:
    assert services["airflow-api-server"]["ports"] == ["127.0.0.1:8080:8080"]
    for name, service in services.items():
        for port in service.get("ports") or []:
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_dags_include_plugins_staging_and_logs_are_mounted(
    services: dict[str, dict[str, Any]], compose: dict[str, Any]
) -> None:
    for name in AIRFLOW_SERVICES - {"airflow-init"}:
        mounts = mounts_of(services[name])
        assert mounts["/opt/airflow/dags"] == "./dags", name
        assert mounts["/opt/airflow/include"] == "./include", name
        assert mounts["/opt/airflow/plugins"] == "./plugins", name
        assert mounts["/opt/airflow/logs"] == "airflow-logs", name
        assert mounts["/opt/airflow/staging"] == "batch-staging", name
        env = env_of(services[name])
        assert env["AIRFLOW__BATCH_PROVIDER__STAGING_ROOT"] == "file:///opt/airflow/staging"
    assert {"postgres-db", "airflow-logs", "airflow-auth", "batch-staging"} <= set(compose["volumes"])
    assert (REPO / "dags").is_dir() and (REPO / "include").is_dir() and (REPO / "plugins").is_dir()


# ------------------------------------------------------------------------------------------ connections


def test_every_airflow_conn_parses_as_an_airflow_connection(services: dict[str, dict[str, Any]]) -> None:
    from airflow.sdk import Connection

    seen = set()
    for name in AIRFLOW_SERVICES:
        for key, value in env_of(services[name]).items():
            if not key.startswith("AIRFLOW_CONN_"):
                continue
            conn_id = key.removeprefix("AIRFLOW_CONN_").lower()
            if value.lstrip().startswith("{"):
                conn = Connection.from_json(value, conn_id=conn_id)
            else:
                conn = Connection.from_uri(value, conn_id=conn_id)
            assert conn.conn_type and conn.host, (name, key)
            seen.add(conn_id)
    assert {"openai_batch_default", "anthropic_batch_default", "gemini_batch_default", "batch_ledger"} <= seen


def test_the_batch_connections_point_at_the_emulator_on_the_shared_loopback(
    services: dict[str, dict[str, Any]],
) -> None:
    from urllib.parse import urlsplit

    from airflow.sdk import Connection

    from batch_emulator.__main__ import _parse_args, build_config

    emulator = services["emulator"]
    assert emulator["entrypoint"] == ["python", "-m", "batch_emulator"]
    config = build_config(_parse_args([interpolate(arg) for arg in emulator["command"]]))
    assert config.host == "127.0.0.1"
    health = " ".join(emulator["healthcheck"]["test"])
    assert f"http://127.0.0.1:{config.port}/_emulator/health" in health

    for name in EMULATOR_CLIENTS:
        assert services[name]["network_mode"] == "service:emulator", name
        assert services[name]["depends_on"]["emulator"] == {"condition": "service_healthy"}
        env = env_of(services[name])
        for key in ("OPENAI", "ANTHROPIC", "GEMINI"):
            conn = Connection.from_json(env[f"AIRFLOW_CONN_{key}_BATCH_DEFAULT"])
            url = urlsplit(conn.host)
            assert (url.hostname, url.port) == ("127.0.0.1", config.port), key
    assert str(Connection.from_json(env["AIRFLOW_CONN_OPENAI_BATCH_DEFAULT"]).host).endswith("/v1")
    # the DAGs name these connections
    dags = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "dags").glob("*.py"))
    for conn_id in ("openai_batch_default", "anthropic_batch_default", "gemini_batch_default"):
        assert conn_id in dags, conn_id


def test_the_ledger_setting_and_the_ledger_connection_name_the_same_separate_database(
    services: dict[str, dict[str, Any]],
) -> None:
    from airflow.sdk import Connection
    from sqlalchemy.engine import make_url

    from airflow_batch_provider.hooks.ledger import url_from_connection

    for name in AIRFLOW_SERVICES:
        env = env_of(services[name])
        ledger_url = make_url(env["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"])
        conn = Connection.from_json(env["AIRFLOW_CONN_BATCH_LEDGER"], conn_id="batch_ledger")
        from_conn = make_url(url_from_connection(conn))
        assert from_conn == ledger_url, name
        assert (ledger_url.host, ledger_url.database, ledger_url.username) == ("postgres", "ledger", "ledger")
        assert ledger_url.database != make_url(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).database
    postgres = services["postgres"]
    assert (
        mounts_of(postgres)["/docker-entrypoint-initdb.d/10-init-ledger.sh"]
        == "./docker/postgres/init-ledger.sh"
    )
    assert (
        env_of(postgres)["LEDGER_DB_PASSWORD"]
        == make_url(env_of(services["airflow-scheduler"])["AIRFLOW__BATCH_PROVIDER__LEDGER_URL"]).password
    )
    assert "ledger" in " ".join(postgres["healthcheck"]["test"])


def test_the_init_script_creates_the_ledger_role_and_database(postgres_server: Any) -> None:
    """Run docker/postgres/init-ledger.sh as the postgres image would, against a real server."""
    from airflow_batch_provider.ledger import Ledger

    psql = postgres_server.bin_dir / "psql"
    if not psql.exists():
        pytest.skip(f"no psql next to the server binaries in {postgres_server.bin_dir}")
    # the script names the role and database `ledger`: take them on this session server, then drop them
    suffix = uuid.uuid4().hex[:8]
    script = INIT_SCRIPT.read_text(encoding="utf-8").replace(
        "ledger OWNER ledger", f"ledger_{suffix} OWNER ledger_{suffix}"
    )
    script = script.replace("CREATE ROLE ledger ", f"CREATE ROLE ledger_{suffix} ")
    assert f"ledger_{suffix} OWNER" in script and f"ROLE ledger_{suffix} " in script
    env = {
        **os.environ,
        "PATH": f"{postgres_server.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PGHOST": postgres_server.host,
        "PGPORT": str(postgres_server.port),
        "POSTGRES_USER": postgres_server.user,
        "POSTGRES_DB": postgres_server.dbname,
        "LEDGER_DB_PASSWORD": "ledger",
    }
    bash = shutil.which("bash") or "/bin/bash"
    try:
        result = subprocess.run(
            [bash, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, result.stderr
        url = f"postgresql+psycopg2://ledger_{suffix}:ledger@{postgres_server.host}:{postgres_server.port}/ledger_{suffix}"
        ledger = Ledger.from_url(url)  # the ledger role owns its database: it can create the tables
        assert ledger.schema_version >= 1
        assert ledger.runs() == []
        ledger.engine.dispose()
    finally:
        postgres_server.execute(f"DROP DATABASE IF EXISTS ledger_{suffix}")
        postgres_server.execute(f"DROP ROLE IF EXISTS ledger_{suffix}")


# ------------------------------------------------------------------------------------------ secrets


def test_only_local_only_defaults_appear_as_secrets(services: dict[str, dict[str, Any]]) -> None:
    secret_key = re.compile(r"PASSWORD|SECRET|_KEY$")
    checked = 0
    for name, service in services.items():
        for key, raw in raw_env_of(service).items():
            if secret_key.search(key) and not key.endswith("_FILE"):
                # overridable from the environment, with a local-only default
                match = _VAR.fullmatch(raw)
                assert match and match["default"] in LOCAL_ONLY_DEFAULTS, (name, key, raw)
                checked += 1
            if key.startswith("AIRFLOW_CONN_"):
                password = json.loads(interpolate(raw)).get("password")
                assert password in LOCAL_ONLY_DEFAULTS | EMULATOR_KEYS, (name, key)
            for url_key in ("SQL_ALCHEMY_CONN", "LEDGER_URL"):
                if key.endswith(url_key):
                    assert re.search(r":\$\{[A-Z_]+:-[a-z]+\}@", raw), (name, key, raw)
    assert checked >= 5
    text = COMPOSE.read_text(encoding="utf-8")
    assert not re.search(r"sk-[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{30,}", text)


# ------------------------------------------------------------------------------------------ Dockerfile


def test_the_dockerfile_installs_the_package_with_the_constraints_file() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(r"^ARG AIRFLOW_IMAGE=apache/airflow:3\.3\.2-python3\.11$", text, re.M)
    assert re.search(r"^FROM \$\{AIRFLOW_IMAGE\}$", text, re.M)
    extras = re.search(r"^ARG PROVIDER_EXTRAS=(\S+)$", text, re.M)
    assert extras and set(extras[1].split(",")) == {
        "openai",
        "anthropic",
        "gemini",
        "bedrock",
        "s3",
        "postgres",
        "emulator",
    }
    install = re.search(r"RUN pip install (.+?)(?:&&|$)", text.replace("\\\n", " "), re.S)
    assert install
    assert "-c /opt/airflow-batch-provider/constraints.txt" in install[1]
    assert '"/opt/airflow-batch-provider[${PROVIDER_EXTRAS}]"' in install[1]
    # Airflow is held at the image's version, which is the one constraints.txt pins
    version = re.search(r"^ARG AIRFLOW_VERSION=(\S+)$", text, re.M)
    assert version and f"apache-airflow=={version[1]}" in (REPO / "constraints.txt").read_text(
        encoding="utf-8"
    )
    assert '"apache-airflow==${AIRFLOW_VERSION}"' in install[1]
    # what it copies exists, and the build context's ignore file lets it through
    copied = [src for line in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.M) for src in line.split()]
    assert set(copied) == {
        "pyproject.toml",
        "README.md",
        "constraints.txt",
        "airflow_batch_provider",
        "batch_emulator",
    }
    ignore = (REPO / "docker" / "Dockerfile.dockerignore").read_text(encoding="utf-8").split()
    for src in copied:
        assert (REPO / src).exists(), src
        assert f"!{src}" in ignore, src
    # the install check imports the page and the emulator
    assert "airflow_batch_provider.plugins.batch_progress" in text
    assert "batch_emulator.app" in text
    assert text.rstrip().splitlines()[-1].strip().startswith("&& python -c")


# ------------------------------------------------------------------------------------------ fresh clone

WRITTEN_PATHS = {
    # what the running stack writes, by the variable that says where
    "ABP_SAMPLE_DATA_DIR": lambda v: v,
    "AIRFLOW__BATCH_PROVIDER__STAGING_ROOT": lambda v: v.removeprefix("file://"),
}


def test_every_folder_the_stack_writes_is_on_a_writable_mount(services: dict[str, dict[str, Any]]) -> None:
    for name in AIRFLOW_SERVICES - {"airflow-init"}:
        env = env_of(services[name])
        raw = [str(v) for v in services[name].get("volumes") or []]
        read_only = [v.split(":")[1] for v in raw if v.endswith(":ro")]
        writable = {v.split(":")[1] for v in raw if not v.endswith(":ro")}
        for var, path_of in WRITTEN_PATHS.items():
            path = path_of(env[var])
            assert path in writable, (name, var, path)
            # and no read-only mount lies over it or under it
            assert not [ro for ro in read_only if path.startswith(ro + "/") or ro.startswith(path + "/")]
    assert "sample-data" in set(yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["volumes"])


FRESH_CLONE_CHECK = """
import json, re, sys
from pathlib import Path
dags = Path(sys.argv[1])
sys.path.insert(0, str(dags))
import sample_data
calls = set()
for dag_file in sorted(dags.glob("*.py")):
    for m in re.finditer(r'generated_records\\(\\s*"([^"]+)",\\s*"([^"]+)",\\s*n=(\\d+),\\s*seed=(\\d+)', dag_file.read_text()):
        calls.add((m[1], m[2], int(m[3]), int(m[4])))
counts = {dataset: sum(1 for _ in sample_data.generated_records(gen, dataset, n=n, seed=seed)) for gen, dataset, n, seed in sorted(calls)}
print(json.dumps(counts))
"""


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_on_a_fresh_clone_every_example_dag_writes_its_sample_data_outside_include(tmp_path: Path) -> None:
    import sys

    # the container's layout: dags/ and include/ as a fresh clone has them (no include/data)
    opt = tmp_path / "opt-airflow"
    shutil.copytree(REPO / "dags", opt / "dags", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "include", opt / "include", ignore=shutil.ignore_patterns("__pycache__", "data"))
    before = snapshot(opt / "include")
    sample_dir = opt / "sample-data"
    env = {**os.environ, "ABP_SAMPLE_DATA_DIR": str(sample_dir), "PYTHONDONTWRITEBYTECODE": "1"}

    result = subprocess.run(
        [sys.executable, "-c", FRESH_CLONE_CHECK, str(opt / "dags")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        stdin=subprocess.DEVNULL,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert counts and all(n > 0 for n in counts.values()), counts
    assert sorted(p.name for p in sample_dir.iterdir()) == sorted(counts)
    assert snapshot(opt / "include") == before
