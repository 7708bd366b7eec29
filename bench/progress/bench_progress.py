"""Cost of the progress client per call, and the relay's CPU per 1,000 events/s.

    .venv/bin/python bench/progress/bench_progress.py [--calls 200000] [--rate 10000] [--seconds 5]

1. ``progress.step`` timed call by call (perf_counter_ns around each), its flusher shipping to a
   live relay on a Unix socket, beside two references measured the same way in the same run: an
   empty function call (the timer's own cost) and a bare ``deque.append`` of the same tuple.
2. A separate process calls ``progress.step`` at ``--rate`` per second for ``--seconds``; the
   relay thread's CPU time (``time.thread_time``) per wall second, per 1,000 events/s.
Results: docs/benchmarks.md ("Training progress")."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def pct(xs: list[int], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000.0  # us


def timed(fn, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    out = [0] * n
    pc = time.perf_counter_ns
    for i in range(n):
        t0 = pc()
        fn(i)
        out[i] = pc() - t0
    return out


EMITTER = """
import os, sys, time
from gpufleet import progress
rate, seconds = float(sys.argv[1]), float(sys.argv[2])
progress.init(job_id="bench", rank=0)
n = int(rate * seconds); t0 = time.monotonic()
for i in range(n):
    progress.step(i, tokens=1)
    lag = t0 + (i + 1) / rate - time.monotonic()
    if lag > 0 and i % 50 == 0:
        time.sleep(lag)
progress.shutdown()
print(progress._reporter.dropped if progress._reporter else 0)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--rate", type=float, default=10_000.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    from gpufleet.agent.progress_relay import ProgressRelay
    from gpufleet.progress import Reporter

    d = tempfile.mkdtemp(prefix="gpf-bench-", dir="/tmp")
    path = os.path.join(d, "p.sock")
    relay = ProgressRelay(path)
    r = Reporter(path)
    r.init(job_id="bench", rank=0)
    q: deque[tuple[object, ...]] = deque()

    def empty(i: int) -> None:
        pass

    def bare(i: int) -> None:
        q.append(("s", time.monotonic(), i, 1, None))
        if len(q) > 4096:
            q.clear()

    def step(i: int) -> None:
        r.step(i, tokens=1)

    res = {}
    for name, fn in (("empty call (timer)", empty), ("deque.append", bare), ("progress.step", step)):
        xs = timed(fn, a.calls)
        res[name] = {"p50_us": round(pct(xs, 0.5), 3), "p99_us": round(pct(xs, 0.99), 3),
                     "p999_us": round(pct(xs, 0.999), 3)}
    r.shutdown()
    time.sleep(0.5)
    cpu0, t0, ev0 = relay.cpu_s, time.monotonic(), relay.events
    out = subprocess.run([sys.executable, "-c", EMITTER, str(a.rate), str(a.seconds)], capture_output=True,
                         text=True, env={**os.environ, "GPUFLEET_PROGRESS": path, "PYTHONPATH": str(REPO)}, check=True)
    time.sleep(0.5)
    wall = time.monotonic() - t0
    cpu = relay.cpu_s - cpu0
    events = relay.events - ev0
    relay.close()
    rate = events / a.seconds
    res["relay"] = {"events": events, "emitter_dropped": int(out.stdout.strip() or 0), "wall_s": round(wall, 2),
                    "cpu_s": round(cpu, 3), "cpu_share_per_1000_ev_s": round(cpu / a.seconds / (rate / 1000), 5)}
    res["ratio progress.step / deque.append p99"] = round(res["progress.step"]["p99_us"] /
                                                          res["deque.append"]["p99_us"], 2)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
