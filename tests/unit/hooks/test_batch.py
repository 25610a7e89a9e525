from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_batch_provider.adapters.openai import OpenAIBatchAdapter
from airflow_batch_provider.exceptions import ConfigurationError
from airflow_batch_provider.hooks.batch import BatchHook, settings_from_connection
from batch_emulator.config import EmulatorConfig
from batch_emulator.testing import run_emulator
from tests.support.ports import free_port


def conn(**kw: object) -> SimpleNamespace:
    base = {
        "conn_type": "openai_batch",
        "host": None,
        "port": None,
        "login": None,
        "password": None,
        "extra_dejson": {},
    }
    return SimpleNamespace(**{**base, **kw})


def test_the_host_is_the_base_url_and_the_password_the_key() -> None:
    settings = settings_from_connection(conn(host="http://127.0.0.1:8089/v1", password="sk-1"))
    assert (settings.base_url, settings.api_key) == ("http://127.0.0.1:8089/v1", "sk-1")


def test_a_port_is_added_to_a_host_without_one() -> None:
    assert (
        settings_from_connection(conn(host="http://127.0.0.1", port=8089)).base_url == "http://127.0.0.1:8089"
    )


def test_extras_pass_through_and_the_login_joins_them() -> None:
    settings = settings_from_connection(conn(login="AKIA", extra_dejson={"region_name": "eu-west-1"}))
    assert settings.extra == {"region_name": "eu-west-1", "login": "AKIA"}


def test_the_key_never_appears_in_the_settings_repr() -> None:
    assert "sk-secret" not in repr(settings_from_connection(conn(password="sk-secret")))


def test_the_hook_builds_the_adapter_its_connection_type_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_HOOK_TEST",
        json.dumps({"conn_type": "openai_batch", "host": "http://h/v1", "password": "k"}),
    )
    adapter = BatchHook("hook_test").get_adapter()
    assert isinstance(adapter, OpenAIBatchAdapter)
    assert adapter.settings.base_url == "http://h/v1"


def test_a_connection_of_an_unknown_type_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_HOOK_BAD", json.dumps({"conn_type": "smtp", "host": "x"}))
    with pytest.raises(ConfigurationError, match="'smtp'"):
        BatchHook("hook_bad").get_adapter()


async def test_the_async_path_reads_the_connection_without_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_HOOK_ASYNC", json.dumps({"conn_type": "openai_batch", "password": "k"}))
    assert isinstance(await BatchHook.aget_adapter("hook_async"), OpenAIBatchAdapter)


def test_form_fields_saved_empty_mean_absent() -> None:
    """The UI saves an untouched named field as null or ""; the adapter must see its default."""
    settings = settings_from_connection(
        conn(extra_dejson={"organization": None, "project": "", "timeout": 30, "api_type": "openai"})
    )
    assert settings.extra == {"timeout": 30, "api_type": "openai"}


# -- test_connection: the UI's "Test" button, through Airflow's own Connection.test_connection ------

KEY = "sk-right"


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    with run_emulator(EmulatorConfig(api_key=KEY)) as base_url:
        yield base_url


def _test(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> tuple[bool, str]:
    from airflow.models.connection import Connection

    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))
    status, message = Connection(conn_id=conn_id, **fields).test_connection()
    assert KEY not in message and "sk-wrong" not in message  # never echo a secret
    return status, message


@pytest.mark.parametrize(
    ("conn_type", "path"), [("openai_batch", "/v1"), ("anthropic_batch", ""), ("gemini_batch", "")]
)
def test_the_test_button_says_yes_to_a_working_connection(
    emulator: str, monkeypatch: pytest.MonkeyPatch, conn_type: str, path: str
) -> None:
    ok, message = _test(monkeypatch, "t_ok", conn_type=conn_type, host=f"{emulator}{path}", password=KEY)
    assert ok, message
    assert "works" in message and "t_ok" in message


@pytest.mark.parametrize(
    ("conn_type", "path"), [("openai_batch", "/v1"), ("anthropic_batch", ""), ("gemini_batch", "")]
)
def test_the_test_button_says_no_to_a_wrong_key_and_names_the_refusal(
    emulator: str, monkeypatch: pytest.MonkeyPatch, conn_type: str, path: str
) -> None:
    ok, message = _test(
        monkeypatch, "t_key", conn_type=conn_type, host=f"{emulator}{path}", password="sk-wrong"
    )
    assert not ok
    assert "t_key" in message and "failed" in message
    assert any(word in message for word in ("401", "400", "Authentication", "API key", "invalid")), message


@pytest.mark.parametrize(
    ("conn_type", "path"), [("openai_batch", "/v1"), ("anthropic_batch", ""), ("gemini_batch", "")]
)
def test_the_test_button_says_no_to_a_closed_port(
    monkeypatch: pytest.MonkeyPatch, conn_type: str, path: str
) -> None:
    port = free_port()
    ok, message = _test(
        monkeypatch, "t_closed", conn_type=conn_type, host=f"http://127.0.0.1:{port}{path}", password=KEY
    )
    assert not ok
    assert "Connect" in message and "failed" in message, message  # the transport error, by name


def test_the_vllm_test_button_checks_the_exchange_folder_the_pods_share(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ok, message = _test(
        monkeypatch,
        "t_vllm",
        conn_type="vllm_kubernetes",
        extra={"exchange_path": str(tmp_path), "gpu_count": 2},
    )
    assert ok and f"exchange folder {tmp_path} is writable" in message, message
    assert list(tmp_path.iterdir()) == []  # the probe file is gone
    ok, message = _test(
        monkeypatch, "t_vllm", conn_type="vllm_kubernetes", extra={"exchange_path": str(tmp_path / "missing")}
    )
    assert not ok and "FileNotFoundError" in message, message


# -- the status client the triggers share -------------------------------------------------------------


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the thread of every status-client build (the real build still runs)."""
    import threading

    from airflow_batch_provider.hooks import batch as hook_module

    threads: list[int] = []
    real = hook_module._new_status_client

    def build(conn_type: str, settings: Any) -> Any:
        threads.append(threading.get_ident())
        return real(conn_type, settings)

    monkeypatch.setattr(hook_module, "_new_status_client", build)
    return threads


async def test_triggers_of_one_connection_share_one_read_and_one_client_built_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch, emulator: str
) -> None:
    import asyncio
    import threading

    from airflow_batch_provider.adapters.base import BatchRef
    from airflow_batch_provider.hooks import batch as hook_module

    monkeypatch.setenv(
        "AIRFLOW_CONN_HOOK_SHARED",
        json.dumps({"conn_type": "openai_batch", "host": f"{emulator}/v1", "password": KEY}),
    )
    threads = _count_builds(monkeypatch)
    reads: list[str] = []
    real_read = BatchHook._aread_settings.__func__  # type: ignore[attr-defined]

    async def read(cls: type[BatchHook], batch_conn_id: str) -> Any:
        reads.append(batch_conn_id)
        return await real_read(cls, batch_conn_id)

    monkeypatch.setattr(BatchHook, "_aread_settings", classmethod(read))
    leases = await asyncio.gather(*(BatchHook.aget_status_client("hook_shared") for _ in range(50)))
    assert len(threads) == 1
    assert reads == ["hook_shared"]  # triggers starting together read the connection once
    assert threads[0] != threading.get_ident()  # the SDK client was built in a worker thread
    with pytest.raises(Exception, match=r"not found|404"):  # a real call through the shared client
        await leases[0].status(BatchRef("openai", "batch_unknown", "k"))
    for lease in leases[:-1]:
        await lease.close()
    clients = hook_module._SHARED[asyncio.get_running_loop()]
    assert len(clients) == 1  # one trigger still holds it
    await leases[-1].close()
    await leases[-1].close()  # closing twice gives back once
    assert clients == {}
    with pytest.raises(RuntimeError, match="closed"):
        await leases[0].status(BatchRef("openai", "batch_unknown", "k"))


async def test_a_changed_connection_gets_its_own_client_and_the_old_one_stays_with_its_triggers(
    monkeypatch: pytest.MonkeyPatch, emulator: str
) -> None:
    fields = {"conn_type": "openai_batch", "host": f"{emulator}/v1", "password": KEY}
    monkeypatch.setenv("AIRFLOW_CONN_HOOK_ROTATED", json.dumps(fields))
    threads = _count_builds(monkeypatch)
    old = await BatchHook.aget_status_client("hook_rotated")
    monkeypatch.setenv("AIRFLOW_CONN_HOOK_ROTATED", json.dumps({**fields, "password": "sk-rotated"}))
    new = await BatchHook.aget_status_client("hook_rotated")
    assert len(threads) == 2
    assert old._client is not new._client  # type: ignore[attr-defined]
    await old.close()
    await new.close()


async def test_a_failed_client_build_is_not_kept_and_the_next_trigger_builds_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_HOOK_SMTP", json.dumps({"conn_type": "smtp", "host": "x"}))
    threads = _count_builds(monkeypatch)
    for _ in range(2):
        with pytest.raises(ConfigurationError, match="'smtp'"):
            await BatchHook.aget_status_client("hook_smtp")
    assert len(threads) == 2


@pytest.mark.parametrize("path", ["", "/", "/v1", "/v1/"])
def test_an_openai_host_works_with_or_without_its_v1_path(
    emulator: str, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    ok, message = _test(monkeypatch, "t_v1", conn_type="openai_batch", host=f"{emulator}{path}", password=KEY)
    assert ok, message
    assert f"{emulator}/v1/" in message


def test_a_connection_of_the_openai_provider_s_type_passes_the_batch_test(
    emulator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_T_OPENAI", json.dumps({"conn_type": "openai", "host": emulator, "password": KEY})
    )
    ok, message = BatchHook("t_openai").test_connection()
    assert ok, message
    assert "openai connection 't_openai' works" in message
