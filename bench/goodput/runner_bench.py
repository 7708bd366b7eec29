"""The DB runner end to end: cold pass over an hour of history, then the steady state (30 s of
new samples per pass, what `gpufleet up` does every 30 s), then a pass with nothing new.

    .venv/bin/python bench/goodput/runner_bench.py            # 256 GPUs (32 jobs x 8), SQLite
    .venv/bin/python bench/goodput/runner_bench.py --quick    # 64 GPUs
    .venv/bin/python bench/goodput/runner_bench.py --database-url postgresql://postgres@127.0.0.1/DB  # migrated, empty

Samples go in through the collector's write path (not timed); timed: ``run_analysis``."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np

from gpufleet.catalog import CATALOG
from gpufleet.protocol import AgentInfo, Allocation, Batch, GpuInfo, JobInfo

T0 = 1_790_000_000.0


def batches(n_jobs: int, t_from: float, t_to: float, seq: int) -> list[Batch]:
    rng = np.random.default_rng(int(t_from))
    out = []
    steps = np.arange(t_from + 1, t_to + 1, 1.0)
    for j in range(n_jobs):
        node = f"bench-{j:04d}"
        level = 0.05 + 0.9 * (j % 10) / 10
        g = 8
        ts = np.repeat(steps, g)
        n = len(ts)
        cols: dict[str, list[float | int | str | None]] = {
            "ts": ts.tolist(), "gpu": [f"GPU-bench-{j}-{i}" for i in range(g)] * len(steps),
            "job": [f"job-{j}"] * n}
        for f in CATALOG.fields:
            if f.unit == "ratio":
                cols[f.name] = np.clip(level + rng.normal(0, 0.05, n), 0, 1).tolist()
        cols["sm_clock_mhz"] = [1980.0] * n
        cols["fb_used_bytes"] = [4e10] * n
        cols["clock_event_reasons"] = [0] * n
        for f in ("xid_last", "ecc_dbe_volatile", "row_remap_failure", "nvlink_error_count"):
            cols[f] = [0] * n
        out.append(Batch(agent=AgentInfo(boot_id=f"bench-{node}", seq=seq, node=node),
                         gpus=[GpuInfo(index=i, uuid=f"GPU-bench-{j}-{i}", model="NVIDIA H100 80GB HBM3")
                               for i in range(g)],
                         jobs=[JobInfo(job_id=f"job-{j}", start_ts=T0)],
                         allocations=[Allocation(gpu_uuid=f"GPU-bench-{j}-{i}", job_id=f"job-{j}", since=T0)
                                      for i in range(g)],
                         samples=cols))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 jobs (64 GPUs)")
    ap.add_argument("--jobs", type=int, default=32, help="8-GPU jobs")
    ap.add_argument("--minutes", type=int, default=60)
    ap.add_argument("--database-url", default=None, help="a migrated, empty database (default: a fresh SQLite file)")
    a = ap.parse_args(argv)
    from gpufleet.analysis.runner import run_analysis
    from gpufleet.collector.columns import prepare
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.migrate import upgrade
    from gpufleet.storage.writes import write_batches

    n_jobs = 8 if a.quick else a.jobs
    url = a.database_url
    if url is None:
        url = f"sqlite:///{tempfile.mkdtemp(prefix='gpufleet-bench-')}/bench.db"
        upgrade(url)
    engine = make_engine(url)
    writer = make_engine(url)  # the collector's own connections
    seq = 0
    t_hist = T0 + a.minutes * 60
    chunk = 600.0
    t = T0
    w0 = time.perf_counter()
    while t < t_hist:
        with writer.begin() as conn:
            write_batches(conn, [prepare(b) for b in batches(n_jobs, t, min(t_hist, t + chunk), seq)], now=t + chunk)
        seq += 1
        t += chunk
    load_s = time.perf_counter() - w0
    gpus = n_jobs * 8
    print(f"{gpus} GPUs in {n_jobs} jobs, {a.minutes} min at 1 Hz = {gpus * a.minutes * 60:,} samples "
          f"({url.split(':')[0]}, loaded in {load_s:.1f} s)")
    s = run_analysis(engine, now=t_hist)
    print(f"cold pass:        {s.duration_s:7.3f} s, {s.rows_read:,} rows read, {s.jobs_analyzed} jobs, "
          f"{s.flags_opened} flags")
    times = []
    for k in range(3):
        t1 = t_hist + 30 * k
        with writer.begin() as conn:
            write_batches(conn, [prepare(b) for b in batches(n_jobs, t1, t1 + 30, seq)], now=t1 + 30)
        seq += 1
        s = run_analysis(engine, now=t1 + 30)
        times.append(s.duration_s)
    print(f"incremental pass: {np.median(times):7.3f} s (median of 3), {s.rows_read:,} rows read (30 s new + re-read "
          f"margin), {s.reports_written} reports rewritten")
    s = run_analysis(engine, now=t_hist + 200)
    print(f"nothing new:      {s.duration_s:7.3f} s, {s.jobs_due} jobs due")
    engine.dispose()
    writer.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
