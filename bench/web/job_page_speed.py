"""The 64-GPU x 24 h job page: time from its data arriving to the page being interactive, in
headless Debian Chromium (issue 19 item 8; goal <= 300 ms). Two servers on one database, loads
interleaved: this tree's page, and the reference: the page as it was at ``--ref`` (api/static
from git, the old single-file app.js job page), served by the same app.

Measured per load, from the browser's own clocks:
  * ``data``: the end of the last time-series response the page waits for (Resource Timing
    responseEnd; this page fetches the below-the-fold fields once it is interactive);
  * ``interactive`` (this page only): the ``job:interactive`` mark job.js sets once what is on
    screen is drawn, the range picker and legend wired (charts below the fold wait until they
    scroll near);
  * ``parsed`` (this page): the ``job:data`` mark, once the responses are parsed and the
    job's detail, timeline and catalog calls are in (the rest of ``interactive`` is drawing);
  * ``ready``: body[data-ready] set (every panel, the goodput panel included), both pages;
  * ``all charts``: this page's gpufleetCharts.flush() building every lazy chart (its cost if a
    reader scrolls the whole page at once; it waits for the later fields if still on the way).

    .venv/bin/python bench/web/job_page_speed.py --quick      # 5 loads per page, SQLite seed
    .venv/bin/python bench/web/job_page_speed.py --loads 15

Screenshot: artifacts/screenshots/bench-job-64gpu.png."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "api"))  # the seed the web tests use
sys.path.insert(0, str(REPO / "bench" / "api"))
from bench_api import server  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage"]
SHOTS = REPO / "artifacts" / "screenshots"
REF = "dbe27de"  # the last commit whose job page is app.js's single-file one
# body[data-ready] as the browser sees it: a MutationObserver set before any page script runs
READY_PROBE = """new MutationObserver((m, o) => { if (document.body && document.body.dataset.ready) {
  window.__benchReady = performance.now(); o.disconnect(); } }).observe(document, { subtree: true, attributes: true,
  attributeFilter: ["data-ready"] });"""
TIMES_JS = """async () => {
  const mark = performance.getEntriesByName("job:interactive")[0];
  const got = performance.getEntriesByName("job:data")[0];
  // the series the page waited for: every one requested before its job:data mark (the old page:
  // all of them); this page fetches the below-the-fold fields after it is interactive
  const ts = performance.getEntriesByType("resource").filter((r) => r.name.includes("/timeseries?")
    && (!got || r.startTime < got.startTime));
  const data = Math.max(...ts.map((r) => r.responseEnd));
  let all = null;
  if (window.gpufleetCharts) {
    const t0 = performance.now(); await window.gpufleetCharts.flush(); all = performance.now() - t0;
  }
  return { data, interactive: mark ? mark.startTime - data : null, parsed: got ? got.startTime - data : null,
           ready: window.__benchReady - data, flush: all };
}"""


def static_at(ref: str, into: Path) -> Path:
    git = ["git", "-C", str(REPO), "archive", ref, "api/static"]
    blob = subprocess.run(git, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as t:
        t.extractall(into, filter="data")
    out = into / "api" / "static"
    # today's shell names files the reference did not have: served empty there (the old app.js
    # never calls them), so the reference loads without a failed request per file
    for f in (REPO / "api" / "static").iterdir():
        if f.is_file() and not (out / f.name).exists():
            (out / f.name).write_text("")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="5 loads per page")
    ap.add_argument("--loads", type=int, default=15)
    ap.add_argument("--ref", default=REF, help=f"git ref of the reference page (default {REF})")
    a = ap.parse_args()
    loads = 5 if a.quick else a.loads
    from apiseed import seed_big_job
    from playwright.sync_api import sync_playwright

    from gpufleet.storage.db import make_engine
    from gpufleet.storage.migrate import upgrade

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        upgrade(url)
        e = make_engine(url)
        rows = seed_big_job(e, n_gpus=64, hours=24)
        e.dispose()
        print(f"seeded 64 GPUs x 24 h ({rows:,} per-GPU rollup rows); reference page at {a.ref}", flush=True)
        old_static = static_at(a.ref, Path(tmp) / "ref")
        # the reference server serves the page files of --ref
        patch = f"import gpufleet.api.web as w\nw.STATIC = __import__('pathlib').Path({str(old_static)!r})\n"
        with server(url) as new, server(url, prelude=patch) as old, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            out: dict[str, list[dict[str, float]]] = {"new": [], "ref": []}
            errors: list[str] = []
            pages = {}
            for side, base in (("new", new), ("ref", old)):
                ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
                ctx.add_init_script(READY_PROBE)
                pg = ctx.new_page()
                if side == "new":
                    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                pages[side] = (pg, base)
            for i in range(loads + 1):  # interleaved; the first load of each warms caches, not counted
                for side in ("new", "ref"):
                    pg, base = pages[side]
                    pg.goto(base + "/jobs/big")
                    pg.wait_for_function("() => window.__benchReady !== undefined", timeout=60000)
                    t = pg.evaluate(TIMES_JS)
                    if i:
                        out[side].append(t)
            SHOTS.mkdir(parents=True, exist_ok=True)
            pages["new"][0].screenshot(path=str(SHOTS / "bench-job-64gpu.png"), full_page=False)
            browser.close()

    def med(side: str, key: str) -> float:
        return statistics.median(x[key] for x in out[side])

    def mx(side: str, key: str) -> float:
        return max(x[key] for x in out[side])

    print(f"{'':34s}{'p50 ms':>8s}{'max ms':>8s}  (n={loads}, interleaved)")
    print(f"{'data -> interactive (this page)':34s}{med('new', 'interactive'):8.0f}{mx('new', 'interactive'):8.0f}")
    print(f"{'  of which JSON parse + other calls':34s}{med('new', 'parsed'):8.0f}{mx('new', 'parsed'):8.0f}")
    print(f"{'data -> ready (this page)':34s}{med('new', 'ready'):8.0f}{mx('new', 'ready'):8.0f}")
    print(f"{'data -> ready (reference page)':34s}{med('ref', 'ready'):8.0f}{mx('ref', 'ready'):8.0f}")
    print(f"{'all lazy charts built (this page)':34s}{med('new', 'flush'):8.0f}{mx('new', 'flush'):8.0f}")
    print(f"ratio ready reference / this page: {med('ref', 'ready') / med('new', 'ready'):.2f}x; "
          f"reference ready / this page interactive: {med('ref', 'ready') / med('new', 'interactive'):.2f}x")
    if errors:
        print("console errors (this page):", errors)
    sys.exit(1 if os.environ.get("BENCH_STRICT") and errors else 0)


if __name__ == "__main__":
    main()
