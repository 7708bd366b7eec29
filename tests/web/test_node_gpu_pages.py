"""Node and GPU pages in a real Chromium: XIDs decoded with NVIDIA's meanings (gpufleet/xid.toml),
GPU UUIDs as links to a GPU page that shows current values, the jobs that held the GPU and its
events. Plus the XID table itself: well-formed, one entry per code."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from apiseed import Seeded
from webpage import Page

from gpufleet.api.web import XID_ACTIONS, xid_table

XID_TOML = Path(__file__).resolve().parents[2] / "gpufleet" / "xid.toml"


def test_xid_table_is_well_formed_and_has_the_codes_fleets_see() -> None:
    raw = tomllib.loads(XID_TOML.read_text())["xid"]
    t = xid_table()
    assert len(t) == len(raw)  # one entry per code
    assert {13, 31, 43, 48, 63, 64, 74, 79, 94, 95} <= set(t)
    assert t[79]["meaning"] == "GPU has fallen off the bus" and t[79]["action"] == XID_ACTIONS["RESTART_BM"]
    assert t[31]["origin"] == "application" and t[48]["origin"] == "hardware"


@pytest.mark.browser
def test_node_page_decodes_xids_and_links_gpus(web: tuple[Page, Seeded]) -> None:
    p, s = web
    pg = p.open("/nodes/node-b")
    row = pg.locator("table.events tbody tr[data-kind='xid']").inner_text()  # events.js: one column each
    assert all(t in row for t in ("XID 79", "GPU has fallen off the bus", "hardware", "reboot the node")), row
    uuid = s.gpu_uuids["node-b"][3]
    link = pg.locator(f"table.gpus a[href='/gpus/{uuid}']")
    assert link.count() == 1 and link.inner_text() == uuid
    assert pg.evaluate("() => window.gpufleetXid.describe('xid', 999)") == "XID 999 (not in gpufleet's table)"
    p.shot("node")
    with pg.expect_navigation():
        link.click()
    pg.wait_for_function("() => window.__gpufleet && window.__gpufleet.ready === true")
    assert pg.locator("h1").inner_text() == "GPU 3 on node-b"
    assert uuid in pg.locator(".meta").inner_text()
    kpis = pg.locator(".kpis").inner_text()
    assert "%" in kpis and " W" in kpis and "°C" in kpis and "MHz" in kpis
    jobs = pg.locator("table.gpujobs tbody tr")
    assert jobs.count() >= 1 and "666" in jobs.first.inner_text()
    assert "GPU has fallen off the bus" in pg.locator("table.events").inner_text()
    p.shot("gpu")
    assert p.errors == []


@pytest.mark.browser
def test_missing_gpu_says_so(web: tuple[Page, Seeded]) -> None:
    p, _ = web
    pg = p.open("/gpus/GPU-nope")
    assert "no gpu" in pg.locator("#app").inner_text().lower() or "not found" in pg.locator("#app").inner_text().lower()
    assert p.errors and all("404" in e for e in p.errors), p.errors
