"""The dashboard in a real headless Chromium against the real app: pages load without console
errors, charts hold data, filters work, XSS payloads stay text. Screenshots go to
artifacts/screenshots/ (git-ignored)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from apiseed import XSS_NAME, XSS_USER, Seeded, seed_big_job
from webpage import Page

pytestmark = pytest.mark.browser


def test_every_page_loads_clean(web: tuple[Page, Seeded]) -> None:
    p, s = web
    pg = p.open("/")
    cells = pg.locator("#gpu-grid .cell")
    assert cells.count() == 8
    with_data = pg.locator("#gpu-grid .cell[data-sm]:not([data-sm=''])").count()
    assert with_data == 7  # the ended job's GPU has no recent minute
    assert "sm active now" in pg.locator(".kpis").inner_text().lower()
    bars = pg.locator(".bars")
    assert "Idle GPUs" in bars.inner_text()  # the registry's title, not the identifier
    assert bars.locator(".bar[data-kind='idle_gpu']").count() == 1
    p.shot("fleet")

    pg = p.open("/jobs")
    assert pg.locator("table.jobs tbody tr").count() == 5
    p.shot("jobs")

    pg = p.open("/jobs/1002")
    flags = pg.locator("#flags .flag")
    assert flags.count() == 2 and "release the allocation" in flags.first.inner_text()
    # evidence.js: a key the registry lacks reads as words with its number, never snake_case
    assert "idle fraction\t97%" in flags.first.inner_text()  # a "_fraction" key reads as a ratio
    assert pg.locator("#grafana-link").get_attribute("href").startswith("http://grafana.example:3000/d/")
    assert pg.locator("table.pergpu tbody tr").count() == 2

    pg = p.open("/jobs/1001")
    pg.evaluate("() => window.gpufleetCharts.flush()")  # charts below the fold build as they scroll near
    charts = pg.evaluate("() => window.__gpufleet.charts")
    assert set(charts) == {"sm_active", "tensor_active", "dram_active", "power_w", "temp_c", "sm_clock_mhz",
                           "nvlink_tx_bytes_s", "nvlink_rx_bytes_s", "interconnect"}
    # 4 GPUs + the job line, ~120 minutes each
    assert charts["sm_active"] >= 5 * (s.minutes - 2), charts
    assert all(v > 0 for v in charts.values()), charts
    assert pg.locator("#charts canvas").count() == 9
    p.shot("job")

    pg = p.open("/nodes/node-b")
    assert pg.locator("table.gpus tbody tr").count() == 4
    events = pg.locator("table.events").inner_text()
    assert "XID 79" in events  # events.js
    p.shot("node")

    pg = p.open("/flags")
    assert pg.locator("tbody tr").count() == 2
    chips = pg.locator("tbody .chip[data-kind]")
    assert chips.count() == 2
    for i in range(2):  # each kind chip reads as its title; the identifier is kept in data-kind
        kind = chips.nth(i).get_attribute("data-kind") or ""
        text = chips.nth(i).inner_text()
        assert kind and text != kind and "_" not in text and text[0].isupper(), (kind, text)
    pg = p.open("/jobs/nope")  # a missing job shows an error, not a broken page
    assert "no job" in pg.locator("#app").inner_text()
    # the 404 of the API call is the only console error, and it is the expected one
    assert all("404" in e for e in p.errors), p.errors
    p.errors.clear()
    assert p.dialogs == []


def test_fleet_grid_updates_live(web: tuple[Page, Seeded], sqlite_url: str) -> None:
    from sqlalchemy import func, select, update

    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import Gpu, gpu_samples_1m

    p, s = web
    uuid = s.gpu_uuids["node-a"][0]
    pg = p.open("/?refresh=2")
    cell = pg.locator(f"#gpu-grid .cell[data-gpu='{uuid}']")
    assert float(cell.get_attribute("data-sm")) > 0.8
    before = cell.evaluate("el => getComputedStyle(el).backgroundColor")
    # the collector folds new samples into the current minute: the job went idle
    e = make_engine(sqlite_url)
    with e.begin() as c:
        pk = c.execute(select(Gpu.id).where(Gpu.uuid == uuid)).scalar_one()
        newest = c.execute(select(func.max(gpu_samples_1m.c.bucket)).where(gpu_samples_1m.c.gpu_pk == pk)).scalar_one()
        c.execute(update(gpu_samples_1m).where(gpu_samples_1m.c.gpu_pk == pk, gpu_samples_1m.c.bucket == newest)
                  .values(sm_active=0.03))
    e.dispose()
    pg.wait_for_function(f"() => document.querySelector(\"#gpu-grid .cell[data-gpu='{uuid}']\").dataset.sm === '0.03'",
                         timeout=10000)
    assert cell.evaluate("el => getComputedStyle(el).backgroundColor") != before
    assert p.errors == []


def test_xss_payloads_stay_inert(web: tuple[Page, Seeded]) -> None:
    p, _ = web
    for path in ("/jobs", "/jobs/666", "/flags", "/", "/nodes/node-b"):
        pg = p.open(path)
        assert pg.evaluate("() => window.__xss") is None, path
        assert pg.locator("img[src='x']").count() == 0, path
        assert pg.locator("#app script").count() == 0, path
        # "<b>x</b>" in a label and "<b>bold?</b>" in an XID message stay text, not elements
        injected = "() => [...document.querySelectorAll('#app b')].filter(b => ['x', 'bold?'].includes(b.textContent))"
        assert pg.evaluate(injected + ".length") == 0, path
    pg = p.open("/jobs/666")
    assert pg.locator("h1").inner_text().endswith(XSS_NAME)
    assert XSS_USER in pg.locator(".meta").first.inner_text()
    assert "team=<b>x</b>" in pg.locator("#app").inner_text()
    p.shot("job-xss")
    pg = p.open("/jobs")
    assert pg.get_by_text(XSS_NAME, exact=True).count() == 1
    assert p.dialogs == [] and p.errors == []


def test_jobs_filters_and_sorting(web: tuple[Page, Seeded]) -> None:
    p, _ = web
    pg = p.open("/jobs")
    rows = pg.locator("table.jobs tbody tr")

    def reloaded(before: int) -> None:
        pg.wait_for_function(f"() => (window.__gpufleet.reloads || 0) > {before}", timeout=10000)

    n = 0
    pg.select_option("select[name=flag]", "idle_gpu")
    reloaded(n)
    n += 1
    assert rows.count() == 1 and rows.first.locator("td").first.inner_text() == "1002"
    assert "flag=idle_gpu" in pg.url

    pg.select_option("select[name=flag]", "")
    reloaded(n)
    n += 1
    pg.fill("input[name=user]", "alice")
    pg.press("input[name=user]", "Enter")
    reloaded(n)
    n += 1
    assert rows.count() == 1 and rows.first.locator("td").nth(2).inner_text() == "alice"

    pg.fill("input[name=user]", "")
    pg.press("input[name=user]", "Enter")
    reloaded(n)
    n += 1
    pg.locator("th", has_text="Wasted GPU-h").click()
    reloaded(n)
    n += 1
    assert rows.first.locator("td").first.inner_text() == "1002"
    assert "sort=waste" in pg.url
    pg.locator("th", has_text="GPUs").click()
    reloaded(n)
    n += 1
    assert rows.first.locator("td").nth(5).inner_text() == "4"

    pg.select_option("select[name=state]", "ended")
    reloaded(n)
    assert {rows.nth(i).locator("td").nth(4).inner_text() for i in range(rows.count())} == {"ended"}
    # a reload keeps the filters (they live in the URL)
    pg = p.open(pg.url.removeprefix(p.base))
    assert pg.locator("select[name=state]").input_value() == "ended"
    assert p.errors == []


def test_job_page_64_gpus_24h_renders(browser: Any, sqlite_url: str,
                                       live_server: Callable[..., Any]) -> None:
    from gpufleet.storage.db import make_engine

    e = make_engine(sqlite_url)
    rows = seed_big_job(e, n_gpus=64, hours=24)
    e.dispose()
    assert rows == 64 * 1440
    srv = live_server(sqlite_url)
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    p = Page(ctx.new_page(), srv.url)
    try:
        p.open("/jobs/big")  # warm-up: first load pays for compiling uPlot and the page script
        times = []
        for _ in range(2):
            pg = p.open("/jobs/big")
            times.append(pg.evaluate("() => window.__gpufleet.renderMs"))
        pg.evaluate("() => window.gpufleetCharts.flush()")
        charts = pg.evaluate("() => window.__gpufleet.charts")
        step = pg.evaluate("() => window.__gpufleet.step")
        p.shot("job-64gpu-24h")
    finally:
        ctx.close()
    print(f"job page, 64 GPUs x 24 h: render {min(times):.0f} ms (runs {[round(t) for t in times]}), step {step} s")
    # every GPU line plus the job line, about 360 points each
    assert charts["sm_active"] >= 65 * 350, charts
    assert p.errors == []
    # How fast it renders is measured in bench/, not asserted here: a timed test fails on a loaded machine.
    assert all(t > 0 for t in times), times
