"""The two time-series goals of issue 16 over real HTTP, old tree against new, interleaved.

    .venv/bin/python bench/api/bench_timeseries.py                      # this tree only
    .venv/bin/python bench/api/bench_timeseries.py --old /tmp/gpufleet-old   # A/B (see below)

The fleet is fleetgen's (1,000 GPUs x 24 h of 1-minute rollups, loaded in ~20 s; its 64-GPU
job ``big-64`` runs the whole day). One uvicorn process per tree (gpufleet.server.create_app),
both on the same throwaway database; each round sends ``--requests`` requests to one, then to the
other, so a noisy minute of a shared box hits both. Per request it reports the p50 wall time
(one sequential httpx client, body read and parsed, as bench/ingest/run.py's query part
measures; also the p50 to the body's last byte, before the client's own ``json.loads``, which
for a 341 KiB answer is ~8 ms of the client's CPU and no part of the server's answer), the
server process's CPU, PostgreSQL's CPU (every backend of the database) and the
client's CPU, and the load average.

``--old DIR``: DIR holds an importable ``gpufleet`` package of the tree before (the
"tree before, as an importable package" recipe in docs/benchmarks.md); its server runs with DIR
first on sys.path. VictoriaMetrics answering the same questions is bench/ingest/run.py
``--only query`` (it loads the same raw samples into both stores)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_api import server, throwaway_db
from fleetgen import generate

from gpufleet.catalog import CATALOG

ALL_FIELDS = ",".join(CATALOG.names)
CASES: dict[str, dict[str, str]] = {
    "job line, all fields, 1-minute points (goal <= 20 ms)": {"gpu": "none", "fields": ALL_FIELDS, "step": "60"},
    "per-GPU, the job page's 5 fields, step auto (goal <= 300 ms)": {},
    "per-GPU, 5 fields, 1-minute points": {"step": "60"},
    "per-GPU, all fields, step auto": {"fields": ALL_FIELDS},
}


def _cpu(procs: Callable[[], Iterator[psutil.Process]]) -> float:
    total = 0.0
    for p in procs():
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _backends(db: str) -> Callable[[], Iterator[psutil.Process]]:
    def procs() -> Iterator[psutil.Process]:
        for p in psutil.process_iter(["username", "cmdline"]):
            # a backend's title: "postgres: [<cluster>: ]<user> <database> <client> <state>"
            words = " ".join(p.info["cmdline"] or []).split()
            if words[:1] == ["postgres:"] and db in words[1:4]:
                yield p
    return procs


def _server_process(base: str) -> psutil.Process:
    port = base.rsplit(":", 1)[1]
    for p in psutil.process_iter(["cmdline"]):
        if f"port={port}" in " ".join(p.info["cmdline"] or []):
            return p
    raise RuntimeError(f"no server process on port {port}")


def run(old: str | None, requests: int, rounds: int, hours: float) -> list[dict[str, Any]]:
    with throwaway_db("postgresql") as url:
        from gpufleet.storage.db import make_engine
        from gpufleet.storage.migrate import upgrade

        upgrade(url)
        e = make_engine(url)
        fleet = generate(e, hours=hours)
        e.dispose()
        print(f"fleet: {fleet.gpus} GPUs x {hours:g} h, {fleet.rollup_rows:,} GPU rollup rows, "
              f"{fleet.seconds:.0f} s to load", flush=True)
        trees = {"new": ""}
        if old:
            trees = {"old": f"import sys; sys.path.insert(0, {old!r})\n", **trees}
        db = url.rsplit("/", 1)[1]
        out: list[dict[str, Any]] = []
        with ExitStack() as stack:
            bases = {k: stack.enter_context(server(url, prelude)) for k, prelude in trees.items()}
            clients = {k: stack.enter_context(httpx.Client(base_url=b, timeout=120)) for k, b in bases.items()}
            procs = {k: _server_process(b) for k, b in bases.items()}
            for case, params in CASES.items():
                got: dict[str, dict[str, list[float]]] = {k: {} for k in trees}
                size: dict[str, int] = {}
                for c in clients.values():  # warm-up: plans, caches, prepared statements
                    for _ in range(3):
                        c.get(f"/api/v1/jobs/{fleet.big_job}/timeseries", params=params).raise_for_status()
                for _ in range(rounds):
                    for k, c in clients.items():
                        s0, b0, c0 = _cpu(lambda k=k: iter([procs[k]])), _cpu(_backends(db)), time.process_time()
                        wall, answered = [], []
                        for _ in range(requests):
                            t = time.perf_counter()
                            r = c.get(f"/api/v1/jobs/{fleet.big_job}/timeseries", params=params)
                            r.raise_for_status()
                            t_body = time.perf_counter()  # the whole body received
                            r.json()
                            wall.append((time.perf_counter() - t) * 1000)
                            answered.append((t_body - t) * 1000)
                            size[k] = len(r.content)
                        g = got[k]
                        g.setdefault("wall", []).extend(wall)
                        g.setdefault("answered", []).extend(answered)
                        g.setdefault("server", []).append((_cpu(lambda k=k: iter([procs[k]])) - s0) / requests * 1000)
                        g.setdefault("postgres", []).append((_cpu(_backends(db)) - b0) / requests * 1000)
                        g.setdefault("client", []).append((time.process_time() - c0) / requests * 1000)
                for k in trees:
                    g = got[k]
                    row = {"case": case, "tree": k, "p50_ms": statistics.median(g["wall"]),
                           "p50_answered_ms": statistics.median(g["answered"]),
                           "server_cpu_ms": statistics.median(g["server"]),
                           "postgres_cpu_ms": statistics.median(g["postgres"]),
                           "client_cpu_ms": statistics.median(g["client"]), "kib": size[k] / 1024,
                           "load": os.getloadavg()[0]}
                    out.append(row)
                    print(f"{k:3s} {case:62s} p50 {row['p50_ms']:7.1f} ms (last byte {row['p50_answered_ms']:6.1f} ms)"
                          f"  CPU per request: server "
                          f"{row['server_cpu_ms']:5.1f} ms, postgres {row['postgres_cpu_ms']:5.1f} ms, client "
                          f"{row['client_cpu_ms']:5.1f} ms  {row['kib']:6.0f} KiB  load {row['load']:.1f}", flush=True)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", default=None, help="a directory holding the old tree's gpufleet package (A/B)")
    ap.add_argument("--requests", type=int, default=5, help="requests per tree per round (default 5)")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    ap.add_argument("--hours", type=float, default=24.0)
    a = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    run(a.old, a.requests, a.rounds, a.hours)


if __name__ == "__main__":
    main()
