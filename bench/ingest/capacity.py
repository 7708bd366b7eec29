#!/usr/bin/env python
"""The capacity model of docs/capacity.md, computed from what bench/ingest/run.py measured here.

    .venv/bin/python bench/ingest/run.py --quick --query-hours 24 --json /tmp/ingest.json
    .venv/bin/python bench/ingest/capacity.py /tmp/ingest.json --analysis-cpu-s-per-gpu-hour 0.00015

Per-unit costs come from the run (the last round of the ingest table, the storage and query
parts); the analysis cost per GPU-hour is bench/goodput's figure, passed in. The arithmetic is
linear on purpose: every cost here is per GPU-sample or per GPU-minute, which is what grows
with a fleet. Headroom (--headroom, default 2x) covers bursts such as agents replaying spools
after a collector outage."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

ROWS_PER_REQUEST = 80  # the bench's batches: 8 GPUs x 10 s


def unit_costs(r: dict[str, Any], analysis_s_per_gpu_hour: float) -> dict[str, float]:
    pg, s, q = r["pg"], r["storage"], r.get("query", {})
    per_sample = 1 / ROWS_PER_REQUEST
    return {
        "collector_cpu_s_per_sample": pg["collector_cpu_ms_per_req"] / 1e3 * per_sample,
        "postgres_cpu_s_per_sample": pg["postgres_cpu_ms_per_req"] / 1e3 * per_sample,
        "wal_bytes_per_sample": pg["wal_bytes_per_gpu_sample"],
        "raw_bytes_per_sample": s["raw_bytes_per_gpu_sample"],
        "minute_bytes_per_gpu_day": s["rollup_bytes_per_gpu_day"] + s["features_bytes_per_gpu_day"],
        "analysis_cpu_s_per_gpu_hour": analysis_s_per_gpu_hour,
        "job_page_query_s": q.get("api_gpu_page", {}).get("ms", math.nan) / 1e3,
    }


def fleet(u: dict[str, float], gpus: int, hz: float, raw_days: float, minute_days: float,
          headroom: float, page_views_per_s: float) -> dict[str, float]:
    samples_s = gpus * hz
    return {
        "samples_s": samples_s,
        "collector_cores": headroom * samples_s * u["collector_cpu_s_per_sample"],
        "postgres_ingest_cores": headroom * samples_s * u["postgres_cpu_s_per_sample"],
        "analysis_cores": headroom * gpus * u["analysis_cpu_s_per_gpu_hour"] / 3600,
        "wal_mb_s": samples_s * u["wal_bytes_per_sample"] / 1e6,
        "wal_tb_day": samples_s * u["wal_bytes_per_sample"] * 86400 / 1e12,
        "raw_tb": samples_s * u["raw_bytes_per_sample"] * 86400 * raw_days / 1e12,
        "minute_tb": gpus * u["minute_bytes_per_gpu_day"] * minute_days / 1e12,
        # a job page view costs about its latency in one database core (the query is the
        # request's work), so that many cores serve the given rate
        "dashboard_cores": page_views_per_s * u["job_page_query_s"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="bench/ingest/run.py --json output")
    ap.add_argument("--analysis-cpu-s-per-gpu-hour", type=float, required=True,
                    help="bench/goodput's analysis CPU seconds per GPU-hour of 1 Hz data")
    ap.add_argument("--hz", type=float, default=1.0)
    ap.add_argument("--raw-days", type=float, default=7.0, help="raw retention (default 7 days)")
    ap.add_argument("--minute-days", type=float, default=400.0, help="rollup/feature retention (default 400 days)")
    ap.add_argument("--headroom", type=float, default=2.0)
    ap.add_argument("--page-views-per-s", type=float, default=20.0, help="dashboard job-page loads per second")
    a = ap.parse_args()
    r = json.loads(a.results.read_text())
    u = unit_costs(r, a.analysis_cpu_s_per_gpu_hour)
    print("| unit cost (measured) | value |\n|---|---|")
    print(f"| collector CPU per 1,000 GPU-samples | {1e3 * 1e3 * u['collector_cpu_s_per_sample']:.2f} ms |")
    print("| PostgreSQL CPU per 1,000 GPU-samples (upper bound) | "
          f"{1e3 * 1e3 * u['postgres_cpu_s_per_sample']:.2f} ms |")
    print(f"| WAL per GPU-minute (upper bound) | {60 * u['wal_bytes_per_sample'] / 1024:.1f} KiB |")
    print(f"| raw bytes per GPU-minute | {60 * u['raw_bytes_per_sample'] / 1024:.2f} KiB |")
    print(f"| rollups + minute features per GPU-minute | {u['minute_bytes_per_gpu_day'] / 1440 / 1024:.2f} KiB |")
    print(f"| analysis CPU per GPU-hour | {1e3 * u['analysis_cpu_s_per_gpu_hour']:.3f} ms |")
    print(f"| job page query (64 GPUs x 24 h, p50) | {1e3 * u['job_page_query_s']:.0f} ms |")
    print(f"\n| at {a.hz:g} Hz, headroom {a.headroom:g}x, raw {a.raw_days:g} d, minutes {a.minute_days:g} d "
          f"| 10,000 GPUs | 100,000 GPUs |\n|---|---|---|")
    rows = [fleet(u, n, a.hz, a.raw_days, a.minute_days, a.headroom, a.page_views_per_s) for n in (10_000, 100_000)]
    for key, label, f in (("samples_s", "GPU-samples/s", "{:,.0f}"), ("collector_cores", "collector cores", "{:.2f}"),
                          ("postgres_ingest_cores", "PostgreSQL cores for ingest", "{:.2f}"),
                          ("analysis_cores", "analysis worker cores", "{:.2f}"),
                          ("wal_mb_s", "WAL MB/s", "{:.1f}"), ("wal_tb_day", "WAL TB/day", "{:.2f}"),
                          ("raw_tb", "raw samples on disk, TB", "{:.2f}"),
                          ("minute_tb", "rollups + features on disk, TB", "{:.2f}"),
                          ("dashboard_cores", f"database cores for {a.page_views_per_s:g} job pages/s",
                           "{:.1f}")):
        print(f"| {label} | {f.format(rows[0][key])} | {f.format(rows[1][key])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
