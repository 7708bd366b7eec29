"""The goodput panel in headless Chromium: a job with progress shows ETTR, badput by cause and
step time per rank with the slow rank marked; a job without says it shows the hardware view;
the fleet page shows fleet ETTR."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from gpufleet import protocol
from gpufleet.protocol import AgentInfo, Batch

from .test_api import windows

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "web"))

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage"]


def test_goodput_panel_and_fleet_ettr(sqlite_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    from webpage import Page

    srv = live_server(sqlite_url)
    body, headers = protocol.encode(Batch(agent=AgentInfo(boot_id="web", seq=0, node="n1"),
                                          progress=windows("dp-web", 4, 12, slow_rank=2)))
    assert httpx.post(srv.url + "/api/v1/ingest", content=body, headers=headers, timeout=30).status_code == 200
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = Page(b.new_context(viewport={"width": 1440, "height": 900}).new_page(), srv.url)
            pg = page.open("/jobs/dp-web?cluster=default")
            pg.wait_for_selector("#rank-steptime")
            assert pg.get_attribute("#goodput-view", "data-source") == "progress"
            assert "ETTR" in pg.inner_text("#goodput")
            causes = pg.eval_on_selector_all("#badput tr", "rs => rs.map(r => r.dataset.cause)")
            assert causes[0] == "productive" and "data_wait" in causes
            slow = pg.eval_on_selector_all("#rank-steptime .keys .slow", "ks => ks.map(k => k.textContent)")
            assert len(slow) == 1 and slow[0].startswith("rank 2")
            # the finding reads with the registry's title, labels and units (evidence.js), no raw keys
            finding = pg.inner_text("#progress-findings li[data-kind='slow_rank']")
            assert finding.startswith("Slow rank") and "step time" in finding and " s" in finding, finding
            assert "peers_step_s" not in finding and "step_s" not in finding, finding
            pg = page.open("/")
            text = pg.inner_text("main").lower()
            assert "fleet ettr" in text and "1 job reporting progress" not in text  # a tooltip, not text
            ettr = pg.eval_on_selector_all(".kpi", "ks => ks.filter(k => k.textContent.includes(\"ETTR\"))"
                                           ".map(k => k.querySelector(\".v\").textContent)")
            assert len(ettr) == 1 and ettr[0].endswith("%"), ettr
            assert page.errors == [], page.errors
        finally:
            b.close()
