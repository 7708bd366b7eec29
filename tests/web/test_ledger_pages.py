"""The pages read one ledger: jobs analysed by the real engine (simulated telemetry), then every
goodput, coverage and waste figure the fleet, jobs, job and flags pages render in Chromium is
checked against GET /api/v1/fleet/ledger and GET /api/v1/jobs/{id}/ledger for the same range,
under the pages' one rounding rule (api/static/fmt.js). Screenshots at 1440 px:
artifacts/screenshots/ledger-*.png."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from webpage import Page, gh, pct

from gpufleet.agent.simulator import make_job
from gpufleet.analysis.runner import run_analysis
from gpufleet.storage.db import make_engine
from tests.analysis.conftest import ingest

pytestmark = pytest.mark.browser
JOBS = (("idle_gpu", "l-idle"), ("low_sm_activity", "l-low"), ("vision_train", "l-good"))


@pytest.fixture
def analysed(browser: Any, sqlite_url: str, live_server: Callable[..., Any]) -> Iterator[Page]:
    t1 = time.time() - 60
    t0 = t1 - 45 * 60
    e = make_engine(sqlite_url)
    try:
        for i, (profile, job_id) in enumerate(JOBS):
            ingest(e, make_job(profile, job_id, 2, t0, 4 * 3600, node_prefix=f"l{i}"), t0, t1)
        assert run_analysis(e, now=t1 + 5).errors == []
    finally:
        e.dispose()
    srv = live_server(sqlite_url, cost__gpu_hour_price=2.5)
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    page = Page(ctx.new_page(), srv.url)
    if not page.page.context.request.get(srv.url + "/api/v1/fleet/ledger?group_by=cause").ok:
        ctx.close()
        pytest.skip("this server has no ledger API yet")
    yield page
    ctx.close()


def _get(p: Page, path: str) -> Any:
    r = p.page.context.request.get(p.base + path)
    assert r.ok, (path, r.status)
    return r.json()


def _kpis(pg: Any, scope: str = "main") -> dict[str, str]:
    return {k.locator(".l").inner_text().strip().lower(): k.locator(".v").inner_text().strip()
            for k in pg.locator(f"{scope} .kpi").all()}


def _rows(pg: Any, table: str) -> list[dict[str, str]]:
    return pg.evaluate("""(sel) => {
      const t = document.querySelector(sel);
      const heads = [...t.querySelectorAll("thead th")].map((th) => th.textContent.trim());
      return [...t.querySelectorAll("tbody tr")].map((tr) =>
        Object.fromEntries([...tr.querySelectorAll("td")].map((td, i) => [heads[i], td.textContent.trim()])));
    }""", table)


def test_pages_read_the_ledger(analysed: Page) -> None:
    p = analysed
    pg = p.open("/?window=24h")
    fleet = _get(p, "/api/v1/fleet/ledger?group_by=cause&start=-24h")
    users = _get(p, "/api/v1/fleet/ledger?group_by=user&start=-24h")
    t = fleet["total"]
    assert t["allocated_gpu_hours"] > 0 and t["wasted_gpu_hours"] > 0
    k = _kpis(pg)
    assert k["goodput 24 h"] == pct(t["goodput"]) and k["coverage 24 h"] == pct(t["coverage"])
    assert k["wasted gpu-h 24 h (of allocated)"].startswith(
        f"{gh(t['wasted_gpu_hours'])} of {gh(t['allocated_gpu_hours'])}")
    assert "fleet ettr" not in k  # one model: no second goodput figure beside the ledger's
    bars = {b.get_attribute("data-kind"): b.locator(".n").inner_text() for b in pg.locator(".bars .bar").all()}
    badput = {g["key"]: g["gpu_hours"] for g in fleet["groups"] if g["kind"] == "badput" and g["gpu_hours"]}
    assert bars == {k: gh(v) for k, v in badput.items() if gh(v) != "0.0"}  # the rest: one line, "+N causes"
    # waste by cause adds up to the fleet's waste (within the rounding of each category)
    assert sum(g["gpu_hours"] for g in fleet["groups"] if g["kind"] == "badput") == pytest.approx(
        t["wasted_gpu_hours"], abs=1e-3)
    shown = _rows(pg, "table.topusers") if pg.locator("table.topusers").count() else []
    want = [g for g in users["groups"] if g["wasted_gpu_hours"] > 0][:10]
    assert [(r["User"], r["Wasted GPU-h"], r["Goodput"]) for r in shown] == \
        [(g["key"] or "–", gh(g["wasted_gpu_hours"]), pct(g["goodput"])) for g in want]
    p.shot("ledger-fleet")

    pg = p.open("/jobs")
    rows = {r["Job"]: r for r in _rows(pg, "table.jobs")}
    for _, job_id in JOBS:
        led = _get(p, f"/api/v1/jobs/{job_id}/ledger")
        assert rows[job_id]["Goodput"] == pct(led["goodput"])  # the list's goodput is the ledger's
        assert rows[job_id]["Wasted GPU-h"] == gh(led["wasted_gpu_hours"])
    p.shot("ledger-jobs")

    for _, job_id in JOBS:
        led = _get(p, f"/api/v1/jobs/{job_id}/ledger")
        pg = p.open(f"/jobs/{job_id}")
        k = _kpis(pg, "#job-kpis")
        assert k["goodput"] == pct(led["goodput"]) and k["coverage"] == pct(led["coverage"])
        assert k["allocated gpu-h"] == gh(led["allocated_gpu_hours"])
        assert k["wasted gpu-h"] == gh(led["wasted_gpu_hours"])
        cats = {r.get_attribute("data-cause"): r.locator("td.n").first.inner_text()
                for r in pg.locator("#ledger tr").all()}
        assert cats == {c: f"{gh(v)} GPU-h" for c, v in led["categories"].items() if v > 0}
        assert sum(led["categories"].values()) == pytest.approx(led["allocated_gpu_hours"], rel=1e-3)
        if job_id == "l-idle":
            p.shot("ledger-job")
        # the per-GPU CSV's ledger columns add up to the job's ledger
        csv_rows = list(csv.DictReader(io.StringIO(p.page.context.request.get(
            f"{p.base}/api/v1/jobs/{job_id}?format=csv").text())))
        for col in ("allocated_gpu_hours", "wasted_gpu_hours", "productive_gpu_hours", "unobserved_gpu_hours"):
            assert sum(float(r[col]) for r in csv_rows) == pytest.approx(led[col], abs=2e-3), col
        # a flag's waste is its share of the ledger: together never more than the job's waste
        flags = _get(p, f"/api/v1/jobs/{job_id}")["flags"]
        assert sum(f["wasted_gpu_hours"] for f in flags) <= led["wasted_gpu_hours"] + 1e-3

    pg = p.open("/flags?open=")
    api = _get(p, "/api/v1/flags?limit=200")["data"]
    flag_rows = _rows(pg, "table.flagtable")
    assert [(r["Job"], r["Wasted GPU-h"]) for r in flag_rows] == [(f["job_id"], gh(f["wasted_gpu_hours"])) for f in api]
    p.shot("ledger-flags")
    assert p.errors == []
