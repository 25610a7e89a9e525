"""The chaos suite's session counts: printed at the end, and written as JSON with ``ABP_CHAOS_SUMMARY``."""

from __future__ import annotations

import json

import pytest

from tests.support.chaos import TALLY, summary_path


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TALLY.cases and not TALLY.kills:
        return
    data = TALLY.to_dict()
    terminalreporter.section("chaos suite")
    terminalreporter.write_line(
        f"cases {data['cases']}, kill points {data['kill_points']} ({data['kills']} kills), "
        f"faults {data['faults']}, items {data['items']}, lost {data['lost']}, "
        f"paid twice {data['paid_twice']}, unknown batches {data['unknown_batches']}"
    )
    terminalreporter.write_line(f"kills: {data['kills_by_point']}")
    terminalreporter.write_line(f"faults: {data['faults_by_kind']}")
    path = summary_path()
    if path is not None:
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
