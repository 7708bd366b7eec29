"""How honest is the demo: start `gpufleet up` as the README does (simulated default fleet,
default settings) on a temp data dir, poll the API, and record when each flag kind first shows.
Prints a JSON report: seconds to first page, when the replayed history reached 25/50/75/100%
(the page's "replaying history" state), seconds to each kind's first open flag, the number of
kinds shown at 2 minutes against the registry's, and any "collector unavailable" log lines.

    .venv/bin/python bench/web/demo_flags.py [--seconds 150]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=150.0, help="how long to watch (default 150)")
    ap.add_argument("--mark", type=float, default=120.0, help="the kinds count reported at this second")
    args = ap.parse_args()
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    with tempfile.TemporaryDirectory() as data:
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "up", "--port", str(port), "--data-dir", data],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=data)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
        reader.start()
        first: dict[str, float] = {}
        page_s: float | None = None
        registry: list[str] = []
        at_mark: int | None = None
        replay: dict[str, float] = {}  # "25%".."100%": when the page's replay progress first reached it
        try:
            while (now := time.monotonic() - t0) < args.seconds:
                try:
                    if page_s is None and httpx.get(base + "/", timeout=5).status_code == 200:
                        page_s = now
                    if page_s is not None:
                        rp = httpx.get(base + "/web/replay", timeout=5).json()
                        if rp.get("cycles_total"):
                            for q in (25, 50, 75, 100):
                                if (rp.get("percent") or 0) >= q:
                                    replay.setdefault(f"{q}%", round(now, 1))
                        if not registry:
                            kinds = httpx.get(base + "/api/v1/flag-kinds", timeout=5).json()["kinds"]
                            registry = [k["name"] for k in kinds]
                        r = httpx.get(base + "/api/v1/flags", params={"open": "true", "limit": 500}, timeout=10)
                        for f in r.json()["data"]:
                            first.setdefault(f["kind"], round(now, 1))
                except (httpx.HTTPError, KeyError, ValueError):
                    pass
                if at_mark is None and now >= args.mark:
                    at_mark = len(first)
                time.sleep(3)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            reader.join(timeout=5)
    report: dict[str, Any] = {
        "command": "gpufleet up --port P --data-dir TMP (defaults otherwise)",
        "first_page_s": None if page_s is None else round(page_s, 1),
        "registry_kinds": len(registry),
        f"kinds_shown_at_{args.mark:.0f}s": at_mark,
        "replay_progress_s": replay,
        "first_seen_s": dict(sorted(first.items(), key=lambda kv: kv[1])),
        "never_shown": sorted(set(registry) - set(first)),
        "collector_unavailable_lines": [ln.strip() for ln in lines if "unavailable" in ln],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
