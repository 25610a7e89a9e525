from __future__ import annotations

import pytest

from batch_emulator.config import EmulatorConfig, Timings, is_loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_hosts_are_accepted(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.4", "example.com", ""])
def test_other_hosts_are_refused(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(ValueError, match="loopback"):
        EmulatorConfig(host=host)


def test_partial_updates_merge_faults_and_timings_key_by_key() -> None:
    config = EmulatorConfig().updated({"faults": {"rate_500": 0.1}, "timings": {"in_progress_s": 4}})
    config = config.updated({"faults": {"rate_429": 0.2}, "time_scale": 0.1})
    assert (config.faults.rate_500, config.faults.rate_429) == (0.1, 0.2)
    assert config.timings == Timings(in_progress_s=4.0)
    assert config.time_scale == 0.1
    view = config.runtime_view()
    assert view["faults"]["rate_429"] == 0.2 and view["timings"]["in_progress_s"] == 4.0


@pytest.mark.parametrize(
    "patch",
    [
        {"port": 1},
        {"timings": {"nope": 1}},
        {"faults": []},
        {"time_scale": -1},
        {"timings": {"validating_s": -1}},
    ],
)
def test_bad_updates_are_refused(patch: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        EmulatorConfig().updated(patch)
