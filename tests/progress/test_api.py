"""Where users read it: the job's ``goodput`` (progress view, or a marked hardware view), the
per-rank series with the slow rank marked, and the fleet summary's ETTR."""

from __future__ import annotations

import time

import httpx

from gpufleet import protocol
from gpufleet.protocol import AgentInfo, Batch, ProgressWindow


def windows(job: str, ranks: int, n: int, slow_rank: int | None = None) -> list[ProgressWindow]:
    t0 = (time.time() // 10) * 10 - 10 * n
    out = []
    for r in range(ranks):
        st = 0.5 * (1.4 if r == slow_rank else 1.0)
        for k in range(n):
            steps = int(8 / st)
            out.append(ProgressWindow(job_id=job, rank=r, pid=100 + r, host=f"h{r // 2}", gpu=str(r % 2),
                                      start=t0 + 10 * k, end=t0 + 10 * k + 10, steps=steps,
                                      first_step=k * steps + 1, last_step=(k + 1) * steps, max_step=(k + 1) * steps,
                                      tokens=steps * 1000, productive_s=steps * st,
                                      spans={"data_wait": 10 - steps * st}, step_time_p50_s=st, step_time_p95_s=st,
                                      step_hist={"-8": steps}, since_step_s=0.1, alive=True,
                                      process_start=t0 if k == 0 else None))
    return out


def test_job_goodput_progress_series_and_fleet(sqlite_url: str, live_server) -> None:  # type: ignore[no-untyped-def]
    srv = live_server(sqlite_url)
    ws = windows("dp-job", 4, 12, slow_rank=3)
    body, headers = protocol.encode(Batch(agent=AgentInfo(boot_id="api", seq=0, node="n1"), progress=ws))
    assert httpx.post(srv.url + "/api/v1/ingest", content=body, headers=headers, timeout=30).status_code == 200
    j = httpx.get(srv.url + "/api/v1/jobs/dp-job", timeout=30).json()
    g = j["goodput"]
    assert g["source"] == "progress" and g["ranks"] == 4 and g["allocation_source"] == "progress"
    assert 0.75 < g["ettr"] < 0.85  # 8 of every 10 s in steps, the rest waiting for data
    assert g["badput_s"]["data_wait"] > 0 and g["badput_s"]["idle"] == 0.0
    slow = [f for f in g["findings"] if f["scope"] == "progress:rank3"]
    assert len(slow) == 1 and slow[0]["evidence"]["host"] == "h1" and slow[0]["evidence"]["gpu"] == "1"
    p = httpx.get(srv.url + "/api/v1/jobs/dp-job/progress", timeout=30).json()
    assert [r["rank"] for r in p["ranks"]] == [0, 1, 2, 3] and len(p["ranks"][0]["t"]) == 12
    assert [r["slow"] for r in p["ranks"]] == [False, False, False, True]
    fleet = httpx.get(srv.url + "/api/v1/fleet/summary", timeout=30).json()
    assert fleet["goodput"]["jobs"] == 1 and abs(fleet["goodput"]["ettr"] - g["ettr"]) < 0.02
    # A job without progress says it shows the hardware view, with nothing made up.
    gpu = protocol.GpuInfo(index=0, uuid="GPU-hw-only", model="NVIDIA H100 80GB HBM3")
    b = Batch(agent=AgentInfo(boot_id="api", seq=1, node="n1"), gpus=[gpu], jobs=[protocol.JobInfo(job_id="hw-only")],
              allocations=[protocol.Allocation(gpu_uuid=gpu.uuid, job_id="hw-only", since=time.time() - 60)],
              samples={"ts": [time.time() - 5], "gpu": [gpu.uuid], "job": ["hw-only"], "sm_active": [0.5]})
    body, headers = protocol.encode(b)
    assert httpx.post(srv.url + "/api/v1/ingest", content=body, headers=headers, timeout=30).status_code == 200
    r = httpx.get(srv.url + "/api/v1/jobs/hw-only", timeout=30)
    assert r.status_code == 200 and r.json()["goodput"]["source"] == "hardware"
    assert r.json()["goodput"]["ettr"] is None and r.json()["goodput"]["badput_s"] == {}
    assert httpx.get(srv.url + "/api/v1/jobs/nope/progress", timeout=30).status_code == 404
