"""The deployment page in headless Chromium: simulated replicas (one loaded past its SLO) stored
through the intake, drawn from GET /api/v1/deployments/{name}; the page shows the API's numbers,
its charts and findings without console errors. Screenshot: artifacts/screenshots/serving-deployment.png."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.sim_serving import EngineModel, Workload, simulate
from gpufleet.serving_expo import measures_to_json, minutes_of, parse_exposition, snapshot

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
T0 = int(time.time() // 60 * 60) - 30 * 60
MODEL = EngineModel(step_base_s=0.012, prefill_s_per_token=0.0001, decode_s_per_seq=0.0003, max_num_seqs=64,
                    kv_capacity_tokens=40_000)


def records(replica: str, rate: float, seed: int) -> list[dict[str, Any]]:
    res = simulate(MODEL, Workload(rate_rps=rate, duration_s=900, burst_factor=2.0, seed=seed), drain=False)
    scrapes = [(T0 + t, snapshot(parse_exposition(p), "vllm")) for t, p in res.pages]
    return [{"deployment": "llama-8b-chat", "replica": replica, "minute": m, "engine": "vllm", "gpus": 1,
             "gpu_uuids": [f"GPU-{replica}"], "job_id": f"serving/{replica}", "measures": measures_to_json(s)}
            for m, s in minutes_of(scrapes).items() if m < T0 + 900]


def test_deployment_page(sqlite_url: str, live_server: Callable[..., Any]) -> None:
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium at /usr/bin/chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    srv = live_server(sqlite_url)
    minutes = records("chat-0", 2.0, 1) + records("chat-1", 4.5, 2)
    body = {"cluster": "default", "node": "gpu-node-1", "minutes": minutes,
            "deployments": {"llama-8b-chat": {"gpufleet.io/slo-preset": "mlperf-llama3.1-8b-interactive"}}}
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        assert c.post("/api/v1/serving/minutes", json=body).status_code == 200
        api = c.get("/api/v1/deployments/llama-8b-chat", params={"start": str(T0), "end": str(T0 + 900)}).json()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, timeout=180_000)
        try:
            page = b.new_context(viewport={"width": 1400, "height": 900}).new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            # generous bounds: on a loaded machine the page's load and first draw have taken over 30 s
            page.goto(f"{srv.url}/deployments/llama-8b-chat?start={T0}&end={T0 + 900}", timeout=180_000)
            page.wait_for_function("() => window.__gpufleet && window.__gpufleet.ready === true", timeout=180_000)
            text = page.inner_text("#app")
            # the pages' one shell (api/web.py _shell): the navigation with Silences, the search box
            header = page.inner_text("header")
            has_search = page.locator("header input").count() > 0
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "serving-deployment.png"), full_page=True)
        finally:
            b.close()
    assert errors == [], errors
    assert "Silences" in header and "Flags" in header and has_search
    s = api["summary"]
    assert f"{100 * s['goodput_share']:.1f}%" in text
    assert f"{100 * s['ttft_attainment']:.1f}%" in text
    # an SLO between bucket bounds is said to be an estimate, with what the buckets prove
    for key in ("ttft", "tpot"):
        if s[f"{key}_attainment_exact"] is False:
            assert "estimated; proven" in text.lower()  # the labels are upper-cased by CSS
        elif s[f"{key}_attainment_exact"] is True:
            assert "exact (on a bucket bound)" in text.lower()
    assert "chat-0" in text and "chat-1" in text and "SLO 500 ms" not in text  # the SLO line is drawn, not text
    assert page_has_charts(text) and ("slo_missed" in text) == any(f["kind"] == "slo_missed" for f in api["findings"])


def page_has_charts(text: str) -> bool:
    return "SLO attainment per minute" in text and "p99 TPOT against its SLO" in text
