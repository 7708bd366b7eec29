"""The job page's collectives and fabric panels in headless Chromium, on the scenario's data."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.analysis.runner import run_analysis
from gpufleet.collector.columns import prepare
from gpufleet.storage.db import make_engine
from gpufleet.storage.writes import write_batches

from .scenario import T0, NodeOutput
from .test_pipeline import JOB, batches, faulty  # noqa: F401 - the module-scoped scenario fixture

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "web"))
from webpage import Page

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium at /usr/bin/chromium (scripts/test.sh installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


def test_job_and_node_pages_show_collectives_heatmap_and_nics(
        chromium: Any, sqlite_url: str, live_server: Callable[..., Any], faulty: list[NodeOutput]) -> None:  # noqa: F811
    e = make_engine(sqlite_url)
    bs = batches(faulty, end=T0 + 25 * 60)
    with e.begin() as conn:
        write_batches(conn, [prepare(b) for b in bs], T0 + 25 * 60)
    run_analysis(e, now=T0 + 25 * 60)
    e.dispose()
    # the scenario is dated 2025: keep its NIC samples past the raw horizon the maintenance loop applies
    srv = live_server(sqlite_url, maintenance__raw_days=3650.0)
    ctx = chromium.new_context(viewport={"width": 1440, "height": 900})
    p = Page(ctx.new_page(), srv.url)
    try:
        pg = p.open(f"/jobs/{JOB}")
        pg.wait_for_selector("#coll-nics")  # the panel loads after the page's own charts
        assert pg.locator("#coll-busbw .uplot").count() == 1, "the busbw chart drew"
        assert pg.locator("#coll-heatmap-canvas").count() == 1
        note = pg.locator("#coll-degraded").inner_text()
        assert "rank 21 on gpu-02" in note and "mlx5_5/1" in note
        assert pg.locator(".heat-ranks .degraded").count() == 1
        row = pg.locator("#coll-nics tr.bad")
        assert row.count() == 1 and "25 GB/s (was 50 GB/s)" in row.inner_text() and "mlx5_5/1" in row.inner_text()
        p.shot("job-collectives")
        pg = p.open("/nodes/gpu-02")
        pg.wait_for_selector("#node-nics-table")
        bad = pg.locator("#node-nics-table tr.bad")
        assert bad.count() == 1 and "mlx5_5/1" in bad.inner_text() and "25 GB/s (was 50 GB/s)" in bad.inner_text()
        assert "GPU 5" in bad.inner_text(), "the rail: GPU 5 uses mlx5_5"
        assert pg.locator("#node-nics-table tbody tr").count() == 8
    finally:
        ctx.close()
    assert p.errors == []
