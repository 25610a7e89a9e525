from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batch_provider.exceptions import ConfigurationError, StagingError
from airflow_batch_provider.staging import Staging, run_key


def test_a_run_key_is_path_safe_readable_and_distinct_per_run() -> None:
    a, b = run_key("manual__2026-11-29T14:44:44+00:00"), run_key("manual__2026-11-29T14:44:45+00:00")
    assert a != b
    assert a.startswith("manual__2026-11-29T14-44-44-00-00-")
    assert all(c.isalnum() or c in "-_." for c in a)


def test_a_written_file_verifies_and_a_changed_one_is_refused(tmp_path: Path) -> None:
    staging = Staging(f"file://{tmp_path}")
    path = staging.run_dir("w", "run-1") / "round-1" / "chunk-00000.jsonl"
    with staging.writer(path) as fh:
        fh.write(b'{"a": 1}\n')
    digest = Staging.sha256(path)
    staging.verify(staging.at(str(path)), digest)
    Path(str(path).removeprefix("file://")).write_bytes(b'{"a": 2}\n')
    with pytest.raises(StagingError, match="changed since it was staged"):
        staging.verify(path, digest)


def test_a_missing_chunk_is_refused_with_the_remedy(tmp_path: Path) -> None:
    staging = Staging(f"file://{tmp_path}")
    with pytest.raises(StagingError, match="clear the prepare task"):
        staging.verify(staging.path("nope.jsonl"), "0" * 64)


def test_the_default_root_comes_from_the_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AIRFLOW__BATCH_PROVIDER__STAGING_ROOT", f"file://{tmp_path}/staged")
    assert str(Staging().root).endswith("/staged")


@pytest.mark.parametrize("workload", ["../..", "..", "a/../../b", "/etc", "a/b"])  # hostile input
def test_a_workload_that_would_leave_the_staging_root_is_refused(tmp_path: Path, workload: str) -> None:
    staging = Staging(f"file://{tmp_path / 'root'}")
    with pytest.raises(ConfigurationError, match="is not a valid workload name"):
        staging.run_dir(workload, "run-1")
    assert list(tmp_path.rglob("*")) == []


@pytest.mark.parametrize(
    "run_id",
    [
        "manual__2026-11-29T14:44:44+00:00",
        "../../../escape",  # hostile input
        "..",
        "/abs/path",
        "a/b\\c",
        "scheduled__" + "x" * 300,
        "",
    ],
)
def test_any_run_id_maps_to_one_folder_inside_the_staging_root(tmp_path: Path, run_id: str) -> None:
    root = tmp_path / "root"
    staging = Staging(f"file://{root}")
    folder = staging.run_dir("w", run_id)
    assert folder == staging.run_dir("w", run_id)  # deterministic
    with staging.writer(folder / "round-1" / "chunk-00000.jsonl") as fh:
        fh.write(b"{}\n")
    (written,) = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written.resolve().is_relative_to((root / "w").resolve())
    assert len(written.relative_to(root / "w").parts) == 3  # <run key>/round-1/chunk
