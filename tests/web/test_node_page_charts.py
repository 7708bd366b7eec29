"""The node page in a real Chromium (node.js): per-GPU charts of SM activity, power, temperature
and memory with a legend that highlights one GPU, the node's events decoded and drawn on the
charts, the jobs that held its GPUs linked, a range picker that refetches; no console errors,
no request to another origin."""

from __future__ import annotations

import pytest
from apiseed import Seeded
from webpage import Page

CHARTS = ("sm_active", "power_w", "temp_c", "fb_used_bytes")


def _watch(p: Page) -> tuple[list[str], list[str]]:
    foreign: list[str] = []
    series: list[str] = []
    p.page.on("request", lambda r: foreign.append(r.url) if not r.url.startswith(p.base) else None)
    p.page.on("request", lambda r: series.append(r.url) if "/timeseries" in r.url else None)
    return foreign, series


@pytest.mark.browser
def test_node_page_draws_per_gpu_charts_events_and_jobs(web: tuple[Page, Seeded]) -> None:
    p, s = web
    foreign, series = _watch(p)
    pg = p.open("/nodes/node-b")
    points: dict[str, int] = pg.evaluate("() => window.__gpufleet.charts")
    step = pg.evaluate("() => window.__gpufleet.step")
    assert step == 60  # the axis starts at the node's first data (2 h ago), not 22 empty hours before
    # 3 of node-b's GPUs have all 120 seeded minutes (the 4th held a job for 30): memory and
    # temperature as well as SM activity
    assert set(points) == set(CHARTS) and all(points[f] >= 3 * (s.minutes * 60 // step - 2) for f in CHARTS), points
    assert pg.locator("#node-charts .chart").count() == 4
    assert pg.locator("#node-charts canvas").count() >= 4
    legend = pg.locator("#node-legend button.lg")
    assert legend.all_inner_texts() == [f"GPU {i}" for i in range(4)]
    assert legend.nth(3).get_attribute("data-gpu") == s.gpu_uuids["node-b"][3]
    legend.nth(3).click()
    assert "on" in (legend.nth(3).get_attribute("class") or "")
    # the cursor readout names the highlighted GPU
    box = pg.locator("#node-chart-power_w .u-over").bounding_box()
    assert box is not None
    pg.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] / 2)
    pg.wait_for_function("() => document.querySelector('#node-chart-power_w .rd').textContent.includes('GPU 3')")
    assert pg.locator("#node-chart-power_w .rd").inner_text().endswith("300 W")  # GPU 3 ran the 300 W job

    ev = pg.locator("#node-events tbody tr")
    assert ev.count() == 2
    xid = pg.locator("#node-events tr[data-kind='xid']").inner_text()
    assert "XID 79" in xid and "GPU has fallen off the bus" in xid and "reboot the node" in xid
    assert "<b>bold?</b>" in xid  # the message stays text
    assert "ecc sbe" in pg.locator("#node-events tr[data-kind='ecc_sbe']").inner_text()
    gpu_link = pg.locator("#node-events tr[data-kind='xid'] a")
    assert gpu_link.get_attribute("href") == f"/gpus/{s.gpu_uuids['node-b'][3]}"

    jobs = pg.locator("table.nodejobs tbody tr")
    ids = sorted(pg.locator("table.nodejobs tbody tr td:first-child").all_inner_texts())
    assert ids == ["1002", "1003", "666"] and jobs.count() == 3
    assert pg.locator("table.nodejobs a[href='/jobs/1003?cluster=default']").count() == 1
    ended = pg.locator("table.nodejobs tbody tr", has_text="1003").inner_text()
    assert "ended" in ended and "running" not in ended
    p.shot("node-page")

    # wait for the refetch itself: a JS condition on len(series) would hold the count the
    # f-string read before the request event arrived (then it never turns true, or is true
    # before the refetch)
    before = len(series)
    with pg.expect_response(lambda r: "/timeseries" in r.url and "start=-21600s" in r.url) as refetch:
        pg.locator("#node-range button", has_text="6 h").click()
    assert refetch.value.ok
    pg.wait_for_function("() => document.querySelector('#node-range button.on').textContent === '6 h'")
    pg.wait_for_function("() => window.__gpufleet.plots.length === 4")
    assert any("start=-21600s" in u for u in series[before:]), series
    assert p.errors == [] and foreign == []


@pytest.mark.browser
def test_node_without_samples_says_so(web: tuple[Page, Seeded], sqlite_url: str) -> None:
    from sqlalchemy import insert, select

    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import Cluster, Node

    e = make_engine(sqlite_url)
    with e.begin() as c:
        cid = c.execute(select(Cluster.id).where(Cluster.name == "default")).scalar_one()
        c.execute(insert(Node).values(cluster_id=cid, name="node-empty", agent_version="0.1.0", last_seen=None,
                                      labels={}))
    e.dispose()
    p, _ = web
    pg = p.open("/nodes/node-empty")
    assert "No samples from this node" in pg.locator("#node-charts").inner_text()
    assert "No job held this node" in pg.locator("#app").inner_text()
    assert p.errors == []
