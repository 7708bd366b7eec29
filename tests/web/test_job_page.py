"""The job page as an instrument (issue 19 item 1, docs/web.md), in headless Debian Chromium on
the real app: the legend names every GPU and the flagged one, the heatmap paints, events are
decoded on the shared timeline, the throttle reasons are named, one range picker and a drag-zoom
set every chart's range, compare draws two runs; no console error, no request off the origin.
Screenshots: artifacts/screenshots/job-instrument*.png."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from apiseed import Seeded, seed_big_job
from webpage import Page

# every chart's x range, the shared timeline's, and how many charts are built
RANGES_JS = """() => { const s = window.__gpufleet;
  return { tl: s.timeline.range, charts: s.plots.map((p) => [p.field, p.u.scales.x.min, p.u.scales.x.max]) }; }"""


def _record_requests(p: Page) -> list[str]:
    seen: list[str] = []
    p.page.on("request", lambda r: seen.append(r.url))
    return seen


def _same_origin(p: Page, urls: list[str]) -> None:
    origin = urlsplit(p.base).netloc
    off = [u for u in urls if urlsplit(u).scheme in ("http", "https") and urlsplit(u).netloc != origin]
    assert off == [], off


def _all_built(pg: Any) -> None:
    pg.evaluate("() => window.gpufleetCharts.flush()")


def test_job_page_legend_heatmap_events_reasons(web: tuple[Page, Seeded]) -> None:
    p, _ = web
    urls = _record_requests(p)
    pg = p.open("/jobs/666")  # one GPU (node-b:3), a throttled flag on it, XID 79 while it ran
    legend = pg.locator("#gpu-legend")
    assert legend.locator(".lg").count() == 1
    chip = legend.locator(".lg").first
    assert chip.inner_text().startswith("node-b:3")
    assert "flagged" in (chip.get_attribute("class") or "")
    assert "Throttled" in chip.inner_text() or "throttled" in chip.inner_text()
    assert "highlighted: node-b:3" in pg.locator("#flagged-note").inner_text()
    # the event as NVIDIA means it, on the job's timeline
    events = pg.locator("#job-events").inner_text()
    assert "XID 79: GPU has fallen off the bus" in events and "node-b:3" in events
    _all_built(pg)
    # the seeded GPU reports sw_power_cap every third minute: decoded and timed on the SM clock chart
    reasons = pg.locator("#chart-sm_clock_mhz .chart-foot").inner_text()
    assert "sw_power_cap" in reasons and "hw_slowdown" not in reasons, reasons
    # the heatmap painted cells (not the grey of no data) for the job's minutes
    px = pg.evaluate("""() => { const c = document.getElementById('heatmap-canvas');
      const d = c.getContext('2d').getImageData(c.width - 5, 2, 1, 1).data; return [d[0], d[1], d[2], d[3]]; }""")
    assert px[3] == 255 and px[:3] != [48, 54, 61], px
    assert pg.locator("#heatmap-field option").count() >= 10  # any numeric catalog field
    p.shot("job-instrument")
    assert p.errors == []
    _same_origin(p, urls)


def test_job_page_picker_and_zoom_set_every_chart(web: tuple[Page, Seeded]) -> None:
    p, _ = web
    pg = p.open("/jobs/1001")
    _all_built(pg)
    before = pg.evaluate(RANGES_JS)
    assert len(before["charts"]) == 9  # 8 per-GPU charts + PCIe/IB
    assert {f for f, _, _ in before["charts"]} >= {"sm_active", "temp_c", "sm_clock_mhz", "nvlink_tx_bytes_s"}
    span = before["tl"][1] - before["tl"][0]
    assert span > 3600  # the seed holds 2 h
    pg.locator("#range-picker button[data-range='1h']").click()
    after = pg.evaluate(RANGES_JS)
    assert after["tl"][1] - after["tl"][0] == pytest.approx(3600)
    for field, lo, hi in after["charts"]:
        assert (lo, hi) == pytest.approx(tuple(after["tl"])), field
    assert "(1h 00m)" in pg.locator("#range-label").text_content()
    # a drag on one chart zooms all of them
    over = pg.locator("#chart-power_w .u-over")
    over.scroll_into_view_if_needed()
    box = over.bounding_box()
    pg.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + 40)
    pg.mouse.down()
    pg.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + 40, steps=5)
    pg.mouse.up()
    zoomed = pg.evaluate(RANGES_JS)
    z = zoomed["tl"][1] - zoomed["tl"][0]
    assert 0 < z < 0.5 * 3600, zoomed["tl"]
    for field, lo, hi in zoomed["charts"]:
        assert (lo, hi) == pytest.approx(tuple(zoomed["tl"])), field
    # the whole job again
    pg.locator("#range-picker button[data-range='all']").click()
    assert pg.evaluate(RANGES_JS)["tl"] == pytest.approx(before["tl"])
    # a legend click highlights that GPU on every chart
    pg.locator("#gpu-legend .lg").nth(2).click()
    widths = pg.evaluate("() => window.__gpufleet.plots.filter((p) => p.u.series.length > 5)"
                         ".map((p) => p.u.series.slice(1, 5).map((s) => s.width))")
    assert widths and all(w == [1, 1, 2.2, 1] for w in widths), widths
    # the heatmap takes any catalog field: one already loaded, one fetched on the same grid
    pg.locator("#heatmap-field").select_option("temp_c")
    pg.wait_for_function("() => window.__gpufleet.heatmapField === 'temp_c'")
    assert "°C" in pg.locator(".heat-scale").inner_text()
    pg.locator("#heatmap-field").select_option("fb_used_bytes")
    pg.wait_for_function("() => window.__gpufleet.heatmapField === 'fb_used_bytes'")
    assert "GiB" in pg.locator(".heat-scale").inner_text()
    p.shot("job-instrument-zoom")
    assert p.errors == []


def test_job_page_compare_with_previous_run(web: tuple[Page, Seeded], sqlite_url: str) -> None:
    p, s = web
    from sqlalchemy import insert, select

    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import Cluster, Job

    e = make_engine(sqlite_url)  # the database the web fixture seeded and serves
    with e.begin() as c:
        cid = c.execute(select(Cluster.id).where(Cluster.name == "default")).scalar_one()
        c.execute(insert(Job).values(cluster_id=cid, job_id="0999", source="slurm", user="alice", name="llama-pretrain",
                                     state="ended", start_ts=s.start - 7200, end_ts=s.start - 3600, labels={}))
    e.dispose()
    pg = p.open("/jobs/1001")
    pg.locator("#compare").scroll_into_view_if_needed()
    opts = pg.locator("#compare-run option")
    opts.nth(1).wait_for(state="attached")
    assert opts.nth(1).inner_text().startswith("0999 ·")
    pg.locator("#compare-id").fill("1002")
    pg.locator("#compare button[type=submit]").click()
    pg.wait_for_function("() => window.__gpufleet.compared === '1002'")
    rows = pg.locator("#compare-out table.compare tbody tr")
    assert rows.count() == 2
    assert rows.nth(0).inner_text().startswith("1001") and rows.nth(1).inner_text().startswith("1002")
    assert pg.locator("#compare-out canvas").count() >= 3
    p.shot("job-instrument-compare")
    assert p.errors == []


def test_job_page_64_gpus_legend_and_heatmap(browser: Any, sqlite_url: str, live_server: Callable[..., Any]) -> None:
    from gpufleet.storage.db import make_engine

    e = make_engine(sqlite_url)
    seed_big_job(e, n_gpus=64, hours=24)
    e.dispose()
    srv = live_server(sqlite_url)
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    p = Page(ctx.new_page(), srv.url)
    try:
        pg = p.open("/jobs/big")
        assert pg.locator("#gpu-legend .lg").count() == 64
        assert pg.locator("#gpu-legend .lg").nth(63).inner_text().startswith("big-007:7")
        # 64 rows of the heatmap; the names column names each node once
        assert pg.evaluate("() => document.getElementById('heatmap-canvas').height") >= 64 * 6
        assert "big-000" in pg.locator(".heat-names").inner_text()
        assert pg.evaluate("() => window.__gpufleet.interactiveMs") > 0
        p.shot("job-instrument-64gpu")
    finally:
        ctx.close()
    assert p.errors == []



def test_job_page_nic_charts_with_link_rate(web: tuple[Page, Seeded], sqlite_url: str) -> None:
    p, s = web
    from sqlalchemy import insert, select

    from gpufleet.storage.collectives_models import GpuNicRow, NicSampleRow
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import Gpu, Node

    e = make_engine(sqlite_url)
    with e.begin() as c:  # node-a (job 1001's node): two ports, mlx5_1 trained down to 200 Gb/s
        nid = c.execute(select(Node.id).where(Node.name == "node-a")).scalar_one()
        gpu0 = c.execute(select(Gpu.id).where(Gpu.node_id == nid, Gpu.index == 0)).scalar_one()
        c.execute(insert(GpuNicRow).values(gpu_pk=gpu0, node_id=nid, nic="mlx5_0", mode="rail", seen_ts=s.now))
        c.execute(insert(NicSampleRow), [
            {"node_id": nid, "ts": s.now - 60 * m, "nic": nic, "interval_s": 60.0, "link_layer": "InfiniBand",
             "state": "ACTIVE", "rate_gbps": rate, "tx_bytes_s": 2.0e10, "rx_bytes_s": 1.5e10, "xmit_wait": 0.0,
             "errors": 0.0, "counters": {}}
            for m in range(30) for nic, rate in (("mlx5_0", 400.0), ("mlx5_1", 200.0))])
    e.dispose()
    pg = p.open("/jobs/1001")
    pg.locator("#nic-charts").scroll_into_view_if_needed()
    pg.wait_for_function("() => window.__gpufleet.nicCharts !== undefined")
    assert pg.evaluate("() => window.__gpufleet.nicCharts") == 2
    keys = pg.locator("#nic-tx_bytes_s .keys").inner_text()
    assert "node-a:mlx5_0 (GPU 0)" in keys and "node-a:mlx5_1 at 25 GB/s" in keys  # 200 Gb/s in GB/s
    assert "mlx5_0 (GPU 0) at" not in keys  # the port at the top rate is not called out
    # the NIC charts join the shared range: the picker moves them too
    pg.locator("#range-picker button[data-range='1h']").click()
    r = pg.evaluate(RANGES_JS)
    nic = [(lo, hi) for f, lo, hi in r["charts"] if f in ("tx_bytes_s", "rx_bytes_s")]
    assert len(nic) == 2 and all(x == pytest.approx(tuple(r["tl"])) for x in nic)
    p.shot("job-instrument-nics")
    assert p.errors == []
