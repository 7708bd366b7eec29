"""step_time_regression says whether the GPUs slowed down with the steps: the same progress
(every rank's step time 0.5 s -> 0.7 s after 25 minutes), once with the GPUs' busy SM clock
falling from 1980 to 1400 MHz at the slowdown (power or thermal capping) and once with it
steady. Both jobs' GPU rows and progress go through the real collector; the flag's cause and
advice differ, and a job without GPU rows keeps "not known"."""

from __future__ import annotations

import time

import httpx
import pytest

from gpufleet import protocol
from gpufleet.analysis.progress.flags import run_progress_pass
from gpufleet.protocol import AgentInfo, Batch, GpuInfo, JobInfo
from gpufleet.storage.db import make_engine

from .test_progress_flags import _post, fold, scenarios

SLOW_AFTER = 1500.0  # the scenario's slowdown (s after the job's start)


def _gpu_rows(url: str, job: str, node: str, t0: float, duration: float, clock_after: float, seq: int) -> None:
    """Four busy GPUs every 10 s; their SM clock is 1980 MHz, then ``clock_after`` from the slowdown."""
    gpus = [f"GPU-{job}-{g}" for g in range(4)]
    ts, gpu, jobs, clock, util, sm = [], [], [], [], [], []
    for k in range(int(duration // 10)):
        t = t0 + 10 * k
        for u in gpus:
            ts.append(t)
            gpu.append(u)
            jobs.append(job)
            clock.append(1980.0 if t - t0 < SLOW_AFTER else clock_after)
            util.append(0.97)
            sm.append(0.8)
    for i in range(0, len(ts), 2000):
        b = Batch(agent=AgentInfo(boot_id=f"hw-{job}", seq=seq + i, node=node),
                  gpus=[GpuInfo(index=g, uuid=u, model="NVIDIA H100 80GB HBM3") for g, u in enumerate(gpus)],
                  jobs=[JobInfo(job_id=job, source="slurm", user="alice", start_ts=t0)],
                  samples={"ts": ts[i:i + 2000], "gpu": gpu[i:i + 2000], "job": jobs[i:i + 2000],
                           "sm_clock_mhz": clock[i:i + 2000], "gpu_util": util[i:i + 2000],
                           "sm_active": sm[i:i + 2000]})
        body, headers = protocol.encode(b)
        r = httpx.post(url + "/api/v1/ingest", content=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text


def test_step_time_regression_tells_slower_gpus_from_slower_work(database_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(database_url)
    engine = make_engine(database_url)
    try:
        now = 0.0
        for seq, (job, clock_after) in enumerate((("clk-fell", 1400.0), ("clk-steady", 1980.0), ("clk-none", None))):
            procs, dur = scenarios()["step_time_regression"]  # fresh processes per job
            t0 = (time.time() // 10) * 10 - dur - 60  # recent: the collector refuses old samples
            ws, end = fold(job, procs, dur, t0)
            now = max(now, end)
            _post(srv.url, ws, 10 + seq)
            if clock_after is not None:
                _gpu_rows(srv.url, job, f"hw-{job}", t0, dur, clock_after, 100_000 * (seq + 1))
        p = run_progress_pass(engine, now)
        assert p.errors == [], p.errors
        got = {}
        for job in ("clk-fell", "clk-steady", "clk-none"):
            flags = httpx.get(f"{srv.url}/api/v1/jobs/{job}", timeout=30).json()["flags"]
            (f,) = [f for f in flags if f["kind"] == "step_time_regression"]
            got[job] = f
    finally:
        engine.dispose()

    fell = got["clk-fell"]["evidence"]
    assert fell["gpu_clocks"] == "fell" and fell["cause"] == "gpu_clocks"
    assert fell["sm_clock_baseline_mhz"] == pytest.approx(1980, abs=1)
    assert fell["sm_clock_recent_mhz"] == pytest.approx(1400, abs=30)
    assert fell["judged_from"] == ["progress", "hardware"]
    advice = got["clk-fell"]["suggestion"]
    assert "throttle reasons" in advice and f"1,980 to {fell['sm_clock_recent_mhz']:,.0f} MHz" in advice

    steady = got["clk-steady"]["evidence"]
    assert steady["gpu_clocks"] == "steady" and steady["cause"] == "work"
    assert "did not slow down" in got["clk-steady"]["suggestion"]

    none = got["clk-none"]["evidence"]
    assert none["gpu_clocks"] == "not known" and "cause" not in none and none["sm_clock_recent_mhz"] is None
    for f in got.values():
        assert "{" not in f["suggestion"] and "n/a" not in f["suggestion"], f["suggestion"]
