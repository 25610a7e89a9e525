from __future__ import annotations

import gc
import io
import threading
from pathlib import Path

import pytest

from batch_emulator.config import EmulatorConfig
from batch_emulator.lifecycle import JobItem
from batch_emulator.store import (
    Clock,
    EmulatorState,
    FileStore,
    FileTooLargeError,
    StoredFile,
)


def meta(file_id: str) -> StoredFile:
    return StoredFile(id=file_id, filename="f.jsonl", purpose="batch", bytes=0, created_at=1, sha256="")


@pytest.mark.parametrize("on_disk", [False, True], ids=["temporary folder", "data dir"])
def test_files_round_trip_in_chunks_and_lines(tmp_path: Path, on_disk: bool) -> None:
    store = FileStore(tmp_path / "data" if on_disk else None, threading.RLock())
    content = b"".join(b'{"n": %d}\n' % i for i in range(20_000)) + b"tail-without-newline"
    stored = store.put(meta("file-1"), io.BytesIO(content))
    assert stored.bytes == len(content)
    assert b"".join(store.iter_bytes("file-1", chunk_size=1000)) == content
    lines = list(store.iter_lines("file-1"))
    assert len(lines) == 20_001 and lines[-1] == b"tail-without-newline"
    if on_disk:
        assert (tmp_path / "data" / "file-1").stat().st_size == len(content)
    assert store.delete("file-1") and not store.delete("file-1")
    with pytest.raises(KeyError):
        list(store.iter_bytes("file-1"))
    if on_disk:
        assert list((tmp_path / "data").iterdir()) == []


def test_without_a_data_directory_files_still_go_to_disk_in_a_folder_removed_with_the_store() -> None:
    store = FileStore(None, threading.RLock())
    folder = store.directory
    store.put(meta("file-1"), b"x" * 100_000)
    assert (folder / "file-1").stat().st_size == 100_000, "file bytes are never held in memory"
    del store
    gc.collect()
    assert not folder.exists()


def test_a_reset_removes_the_spools_of_the_jobs_it_forgets(tmp_path: Path) -> None:
    state = EmulatorState(EmulatorConfig(data_dir=tmp_path))
    items = state.item_log()
    items.append(JobItem("a", 1, {"model": "m"}))
    job = state.create_job("openai", "batch_1", items, [], state.config, {})
    job.bill("a", input_tokens=1)
    assert job.billed and len(list((tmp_path / "jobs").iterdir())) == 2
    state.reset()
    assert list((tmp_path / "jobs").iterdir()) == []


def test_an_upload_over_the_limit_is_refused_and_leaves_nothing_behind(tmp_path: Path) -> None:
    store = FileStore(tmp_path, threading.RLock())
    with pytest.raises(FileTooLargeError):
        store.put(meta("file-big"), b"x" * 1000, max_bytes=999)
    assert store.get("file-big") is None
    assert list(tmp_path.iterdir()) == []


def test_ids_are_unique_and_repeat_for_the_same_seed() -> None:
    a, b = EmulatorState(EmulatorConfig(seed=1)), EmulatorState(EmulatorConfig(seed=1))
    ids = [a.new_id("file-") for _ in range(100)]
    assert len(set(ids)) == 100
    assert ids == [b.new_id("file-") for _ in range(100)]
    a.reset()
    assert a.new_id("file-") not in ids, "ids after a reset never repeat earlier ones"


def test_the_clock_only_moves_forward() -> None:
    clock = Clock(lambda: 100.0)
    assert clock.advance(5) == 105.0
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_a_validation_failure_budget_counts_down_and_reset_restores_the_start_config() -> None:
    state = EmulatorState(EmulatorConfig())
    state.update_config({"faults": {"fail_validation": 1, "rate_500": 0.5}})
    assert state.consume_validation_failure()
    assert not state.consume_validation_failure()
    assert state.config.faults.rate_500 == 0.5
    state.bump("openai", "batches_created")
    assert state.counters == {"batches_created": 1, "openai.batches_created": 1}
    state.reset()
    assert state.config == EmulatorConfig()
    assert not state.counters
