"""Screenshots of the real demo: `gpufleet up` (simulated default fleet) on a temp data dir, the
fleet page while history replays (the "replaying history: N%" banner), then the fleet, flags,
a job, a node and a GPU page once analysed. Saves under artifacts/screenshots/demo-*.png and
prints what each page showed; fails on a console error or a request to another origin.

    .venv/bin/python bench/web/demo_screens.py
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

OUT = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage"]


def main() -> int:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    OUT.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as data:
        proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "up", "--port", str(port), "--data-dir", data],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=data)
        try:
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
                page = b.new_page(viewport={"width": 1440, "height": 900})
                page.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
                page.on("request", lambda r: problems.append(f"foreign: {r.url}")
                        if urlsplit(r.url).scheme.startswith("http") and urlsplit(r.url).netloc != f"127.0.0.1:{port}"
                        else None)
                while True:
                    try:
                        if httpx.get(base + "/", timeout=2).status_code == 200:
                            break
                    except httpx.HTTPError:
                        time.sleep(0.3)
                page.goto(base + "/")
                try:
                    page.wait_for_selector("#replay", timeout=10000)
                    print("while replaying:", page.locator("#replay").inner_text())
                except PlaywrightTimeout:  # the replay may already be over on a fast machine
                    print("while replaying: no banner seen")
                page.screenshot(path=str(OUT / "demo-replaying.png"), full_page=True)
                time.sleep(40)  # the first analysis pass after the replay
                for name, path in [("fleet", "/"), ("flags", "/flags")]:
                    page.goto(base + path)
                    page.wait_for_function("() => window.__gpufleet && window.__gpufleet.ready === true")
                    page.screenshot(path=str(OUT / f"demo-{name}.png"), full_page=True)
                flags = httpx.get(base + "/api/v1/flags", params={"open": "true", "limit": 500}).json()["data"]
                summary = httpx.get(base + "/api/v1/fleet/summary").json()
                print("GPUs allocated:", summary["gpus_allocated"], "of", summary["gpus"])
                straggler = next((f for f in flags if f["kind"] == "straggler"), flags[0])
                page.goto(f"{base}/jobs/{straggler['job_id']}?cluster={straggler['cluster']}")
                page.wait_for_function("() => window.__gpufleet && window.__gpufleet.ready === true")
                page.screenshot(path=str(OUT / "demo-job.png"), full_page=True)
                fault = next((f for f in flags if f["kind"] == "hw_fault"), None)
                job = httpx.get(f"{base}/api/v1/jobs/{(fault or straggler)['job_id']}").json()
                gpu = job["gpus"][0]
                page.goto(f"{base}/nodes/{gpu['node']}")
                page.wait_for_function("() => window.__gpufleet && window.__gpufleet.ready === true")
                page.screenshot(path=str(OUT / "demo-node.png"), full_page=True)
                page.goto(f"{base}/gpus/{gpu['uuid']}")
                page.wait_for_function("() => window.__gpufleet && window.__gpufleet.ready === true")
                page.screenshot(path=str(OUT / "demo-gpu.png"), full_page=True)
                b.close()
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    print("kinds open:", sorted({f["kind"] for f in flags}))
    print("problems:", problems or "none")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
