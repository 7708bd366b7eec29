"""Dashboard render time on the 1,000-GPU x 24 h fleet, in headless Debian Chromium: from
navigation start to the page's data drawn (window.__gpufleet.renderMs, set when every chart
and table holds its data), for the fleet page (1,000 GPU cells) and the 64-GPU x 24 h job page.
Screenshots go to artifacts/screenshots/bench-*.png.

    .venv/bin/python bench/api/web_render.py --quick      # throwaway PostgreSQL, 3 loads each
    .venv/bin/python bench/api/web_render.py --url URL    # an existing database (not dropped)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_api import server, throwaway_db

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage"]
SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="use this database (already holding a fleetgen fleet)")
    ap.add_argument("--db", choices=["postgresql", "sqlite"], default="postgresql")
    ap.add_argument("--quick", action="store_true", help="3 loads per page instead of 10")
    a = ap.parse_args()
    loads = 3 if a.quick else 10
    from playwright.sync_api import sync_playwright

    with (nullcontext(a.url) if a.url else throwaway_db(a.db)) as url:
        if not a.url:
            from fleetgen import generate

            from gpufleet.storage.db import make_engine
            from gpufleet.storage.migrate import upgrade

            upgrade(url)
            e = make_engine(url)
            f = generate(e)
            e.dispose()
            print(f"generated {f.gpus} GPUs x 24 h ({f.rollup_rows:,} rollup rows) in {f.seconds:.1f} s", flush=True)
        with server(url) as base, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            SHOTS.mkdir(parents=True, exist_ok=True)
            for name, path in (("fleet (1,000 GPUs)", "/"), ("job (64 GPUs x 24 h)", "/jobs/big-64"),
                               ("jobs list", "/jobs?sort=waste")):
                times = []
                for i in range(loads + 1):  # the first load warms caches and is not counted
                    page.goto(base + path)
                    page.wait_for_function("() => window.__gpufleet && window.__gpufleet.ready === true",
                                           timeout=30000)
                    if i:
                        times.append(page.evaluate("() => window.__gpufleet.renderMs"))
                slug = path.strip("/").replace("/", "-").split("?")[0] or "fleet"
                page.screenshot(path=str(SHOTS / f"bench-{slug}.png"), full_page=False)
                print(f"{name:24s} render p50 {statistics.median(times):6.0f} ms  max {max(times):6.0f} ms "
                      f"(n={loads})", flush=True)
            browser.close()
            if errors:
                print("console errors:", errors)


if __name__ == "__main__":
    main()
