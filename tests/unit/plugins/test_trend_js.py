"""The trend chart's script (plugins/static/trend.js) in a real browser over a served page and ledger.

Debian's chromium driven by Playwright (no browser download), as the stack's browser test; the
page is served by uvicorn over a SQLite ledger, with the page's own Content Security Policy.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from airflow_batch_provider.ledger import Ledger
from airflow_batch_provider.plugins.api import create_app, open_readonly
from tests.support.ports import LOOPBACK, free_port, is_listening
from tests.unit.plugins.test_api import DAG, MODEL, WL
from tests.unit.plugins.test_trend import dated, night_id, seed_night

CHROMIUM = Path(os.environ.get("ABP_CHROMIUM", "/usr/bin/chromium"))
PANELS = ("states", "cost_per_usable_result", "savings", "review_queue", "realtime_share")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """Four published nights and tonight's run (not published), served on a free loopback port."""
    import uvicorn

    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    writer = Ledger.from_url(url)
    for n, (ok, permanent, realtime) in enumerate([(6, 1, 1), (9, 2, 0), (4, 0, 3), (5, 1, 2)]):
        seed_night(writer, n, ok=ok, permanent=permanent, realtime=realtime)
    writer.start_run(WL, night_id(4), "openai", MODEL, dag_id=DAG)
    dated(writer, night_id(4), 4)
    writer.engine.dispose()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(lambda: url, authenticate=False), host=LOOPBACK, port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                pytest.fail(f"uvicorn did not start on port {port}")
            threading.Event().wait(0.05)
        assert is_listening(port)
        yield f"http://{LOOPBACK}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        open_readonly(url).engine.dispose()
        open_readonly.cache_clear()


def test_the_chart_draws_one_column_per_night_with_the_apis_values(served: str) -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"no chromium at {CHROMIUM}: apt-get install chromium (or set ABP_CHROMIUM)")
    sync_api = pytest.importorskip("playwright.sync_api")
    import httpx

    trend = httpx.get(f"{served}/api/trend", params={"workload": WL}).json()
    assert len(trend["nights"]) == 5
    problems: list[str] = []

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1400})
            page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.set_default_timeout(60_000)
            page.goto(f"{served}/?workload={WL}")
            page.locator('[data-chart="drawn"]').wait_for()

            drawn: dict[str, Any] = page.evaluate(
                """() => {
                  const out = {};
                  for (const svg of document.querySelectorAll('svg.trend-panel')) {
                    out[svg.dataset.metric] = [...svg.querySelectorAll('g.night')].map(g => ({
                      run: g.dataset.runId,
                      value: g.dataset.value,
                      items: g.dataset.items,
                      states: Object.fromEntries([...g.querySelectorAll('rect')].map(
                        r => [r.dataset.state, Number(r.dataset.count)])),
                      heights: [...g.querySelectorAll('rect')].map(r => Number(r.getAttribute('height'))),
                      title: g.querySelector('title').textContent,
                      marks: g.querySelectorAll('circle').length,
                    }));
                  }
                  return out;
                }"""
            )
            # the same nights in every panel, oldest on the left
            assert list(drawn) == list(PANELS)
            runs = [night_id(n) for n in range(5)]
            for metric in PANELS:
                assert [g["run"] for g in drawn[metric]] == runs, metric
            nights = trend["nights"]
            assert [g["states"] for g in drawn["states"]] == [n["states"] for n in nights]
            assert drawn["states"][1]["states"] == {"succeeded": 9, "review": 2}
            assert [g["items"] for g in drawn["states"]] == ["8", "11", "7", "8", ""]
            # bar heights follow the counts: the tallest night is the one with the most items
            totals = [sum(g["heights"]) for g in drawn["states"]]
            assert max(totals) == totals[1] and totals[4] == 0
            assert "succeeded 9, review 2" in drawn["states"][1]["title"]
            assert "not published" in drawn["states"][4]["title"]
            for metric in PANELS[1:]:
                values = [g["value"] for g in drawn[metric]]
                expected = ["" if n[metric] is None else str(n[metric]) for n in nights]
                assert values == expected, metric
                # a mark for each night with a figure; tonight (not published) is a gap
                assert [g["marks"] for g in drawn[metric]] == [1, 1, 1, 1, 0], metric
            assert [g["value"] for g in drawn["review_queue"]][:4] == ["1", "3", "3", "4"]
            share = Decimal(nights[2]["realtime_share"])
            assert f"{(share * 100).quantize(Decimal('0.1'))}%" in drawn["realtime_share"][2]["title"]
            assert "$" in drawn["cost_per_usable_result"][0]["title"]

            shots = os.environ.get("ABP_SCREENSHOTS_DIR")
            if shots:  # docs/ keeps one (docs/ui-trend.png)
                page.locator("section.trend").screenshot(path=str(Path(shots) / "ui-trend.png"))

            # the selector asks for more nights: the page reloads with them
            page.select_option('select[name="nights"]', "90")
            page.wait_for_url("**nights=90**")
            page.locator('[data-chart="drawn"]').wait_for()
            assert page.locator('svg[data-metric="states"] g.night').count() == 5
        finally:
            browser.close()
    # nothing the Content Security Policy refused, no script error
    assert problems == []
