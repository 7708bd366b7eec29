"""The fleet page as a performance engineer reads it, in a real Chromium against the real app:
waste with its denominator and cost, no zero rows in the top lists, unallocated GPUs drawn
apart from idle allocated ones, a time range, and a search box that goes straight to the page.
Values are checked as rendered text against the API's own numbers."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from apiseed import Seeded, seed
from webpage import Page, fleet_waste, pct

pytestmark = pytest.mark.browser


def _gh(v: float) -> str:  # the page's GPU-hour format
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


@pytest.fixture
def priced(browser: Any, sqlite_url: str, live_server: Callable[..., Any]) -> Iterator[tuple[Page, Seeded]]:
    from gpufleet.storage.db import make_engine

    e = make_engine(sqlite_url)
    s = seed(e)
    e.dispose()
    srv = live_server(sqlite_url, cost__gpu_hour_price=2.5, cost__gpu_hour_price_by_cluster={"other": 9.0})
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    page = Page(ctx.new_page(), srv.url)
    page.requests = []
    page.page.on("request", lambda r: page.requests.append(r.url))
    yield page, s
    ctx.close()


def test_waste_reads_with_denominator_and_cost(priced: tuple[Page, Seeded]) -> None:
    p, _ = priced
    pg = p.open("/")
    wasted, alloc, _ = fleet_waste(pg, p.base, "24h")  # the ledger's once it holds time
    assert 0 < wasted < alloc
    kpi = pg.locator(".kpi", has_text="Wasted GPU-h 24 h").text_content()
    assert f"{_gh(wasted)} of {_gh(alloc)}" in kpi
    assert f"${wasted * 2.5:,.2f}" in kpi  # the configured $2.50 per GPU-hour
    assert "(of allocated)" in kpi
    title = pg.locator(".kpi", has_text="Wasted GPU-h").get_attribute("title")
    # the pages' one rounding rule (api/static/fmt.js), not Python's: 27.95 reads 28.0%, not 27.9%
    assert f"{pct(wasted / alloc, 1)} of allocated" in title and "at $2.50/GPU-h" in title
    # every score shown is a percentage between 0 and 100
    for cell in pg.locator("section", has_text="Top wasting jobs").locator("td.n").all_inner_texts():
        if cell.endswith("%"):
            assert 0 <= float(cell[:-1]) <= 100
    assert p.errors == []
    p.shot("fleet-priced")


def test_top_lists_have_no_zero_rows_and_free_gpus_are_not_red(priced: tuple[Page, Seeded], sqlite_url: str) -> None:
    from sqlalchemy import select, update

    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import Allocation, Gpu, JobReport

    p, s0 = priced
    e = make_engine(sqlite_url)
    with e.begin() as c:  # the healthy job wasted nothing: a row a padded list would show as 0.0
        c.execute(update(JobReport).where(JobReport.job_pk == s0.jobs["1001"]["pk"]).values(wasted_gpu_hours=0.0))
        # a busy GPU whose allocation is gone (attribution lost): activity without a job is news,
        # so it keeps its heat colour; only a free GPU doing nothing is drawn empty
        busy_pk = c.execute(select(Gpu.id).where(Gpu.uuid == s0.gpu_uuids["node-a"][0])).scalar_one()
        c.execute(update(Allocation).where(Allocation.gpu_pk == busy_pk).values(end_ts=s0.start + 60))
    e.dispose()
    pg = p.open("/")
    s = pg.context.request.get(p.base + "/api/v1/fleet/summary?window=24h").json()
    zero_jobs = [j["job_id"] for j in s["top_jobs"] if not j["wasted_gpu_hours"]]
    assert zero_jobs  # the seed has jobs that wasted nothing: the filter is exercised
    rows = pg.locator("section", has_text="Top wasting jobs").locator("tbody tr")
    assert rows.count() == len(s["top_jobs"]) - len(zero_jobs) > 0
    shown = rows.all_inner_texts()
    for job_id in zero_jobs:
        assert not any(r.startswith(job_id + "\t") for r in shown), (job_id, shown)
    idle_free = pg.locator(f"#gpu-grid .cell.free[data-gpu='{s0.gpu_uuids['node-b'][2]}']")  # the ended job's
    assert idle_free.evaluate("el => getComputedStyle(el).backgroundColor") == "rgba(0, 0, 0, 0)"
    busy_free = pg.locator(f"#gpu-grid .cell.free[data-gpu='{s0.gpu_uuids['node-a'][0]}']")
    assert busy_free.evaluate("el => getComputedStyle(el).backgroundColor") != "rgba(0, 0, 0, 0)"
    assert pg.locator("#gpu-grid .cell.free").count() == 2
    busy = pg.locator("#gpu-grid .cell:not(.free)").first
    assert busy.evaluate("el => getComputedStyle(el).backgroundColor") != "rgba(0, 0, 0, 0)"


def test_time_range_changes_the_window(priced: tuple[Page, Seeded]) -> None:
    p, _ = priced
    pg = p.open("/")
    with pg.expect_navigation():
        pg.select_option("#range", "1h")
    pg.wait_for_function("() => window.__gpufleet && window.__gpufleet.ready === true")
    assert "window=1h" in pg.url
    assert "GPU-hours wasted, last 1 h, by cause" in pg.locator("main").text_content()
    assert any("window=1h" in u for u in p.requests if "/fleet/summary" in u)
    wasted, alloc, _ = fleet_waste(pg, p.base, "1h")
    kpi = pg.locator(".kpi", has_text="Wasted GPU-h 1 h").text_content()
    assert f"{_gh(wasted)} of {_gh(alloc)}" in kpi
    assert p.errors == []


@pytest.mark.parametrize(("q", "lands"), [("1002", r"/jobs/1002\?cluster=default$"),
                                          ("node-b", r"/nodes/node-b\?cluster=default$"),
                                          ("alice", r"/jobs\?user=alice$")])
def test_search_goes_straight_to_the_page(priced: tuple[Page, Seeded], q: str, lands: str) -> None:
    p, _ = priced
    pg = p.open("/")
    pg.fill("#search input", q)
    with pg.expect_navigation():
        pg.press("#search input", "Enter")
    assert re.search(lands, pg.url), pg.url
    assert p.errors == []


def test_search_lists_several_matches_and_says_when_none(priced: tuple[Page, Seeded]) -> None:
    p, s = priced
    pg = p.open("/jobs")
    pg.fill("#search input", "1001")  # one job id in two clusters
    pg.press("#search input", "Enter")
    links = pg.locator("#search-results a")
    links.first.wait_for()
    assert links.count() == 2
    pg.fill("#search input", "no-such-thing")
    pg.press("#search input", "Enter")
    pg.wait_for_function("() => document.querySelector('#search-results').textContent.includes('nothing named')")
    pg.fill("#search input", s.gpu_uuids["node-b"][3])  # a GPU UUID: its node
    with pg.expect_navigation():
        pg.press("#search input", "Enter")
    assert "/nodes/node-b" in pg.url
    assert p.errors == []
