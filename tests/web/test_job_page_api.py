"""The two endpoints the job page adds (docs/web.md): ``/timeline`` (the events of the job's
GPUs while it held them, the capacities its charts draw, the clock-reason bits) and
``/previous-runs`` (earlier jobs of the same name), over real HTTP on the seeded database (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from apiseed import seed
from sqlalchemy import insert, select

from gpufleet.storage.db import make_engine
from gpufleet.storage.models import Allocation, Cluster, Event, Gpu, Job, JobReport, Node


def _serve(database_url: str, live_server: Callable[..., Any]) -> tuple[httpx.Client, Any]:
    e = make_engine(database_url)
    s = seed(e)
    e.dispose()
    return httpx.Client(base_url=live_server(database_url).url, timeout=30), s


def test_timeline_events_only_while_the_job_held_the_gpu(database_url: str, live_server: Callable[..., Any]) -> None:
    c, s = _serve(database_url, live_server)
    e = make_engine(database_url)
    with e.begin() as conn:  # a node-wide event on node-b while job 666 runs, one before it started
        nid = conn.execute(select(Node.id).where(Node.name == "node-b")).scalar_one()
        conn.execute(insert(Event).values(ts=s.now - 300, node_id=nid, gpu_pk=None, kind="other", code=None,
                                          message="node-wide"))
        conn.execute(insert(Event).values(ts=s.start - 3600, node_id=nid, gpu_pk=None, kind="other", code=None,
                                          message="before every job"))
    e.dispose()
    t = c.get("/api/v1/jobs/666/timeline").json()
    assert [(x["kind"], x["code"], x["node"], x["gpu_index"]) for x in t["events"]] == [
        ("xid", 79, "node-b", 3), ("other", None, "node-b", None)]
    assert t["events"][0]["message"] == "GPU has fallen off the bus <b>bold?</b>"  # as stored; the page writes text
    # job 1003 held node-b GPU 2 for its first 30 minutes: the ECC event 15 minutes ago is not its
    t = c.get("/api/v1/jobs/1003/timeline").json()
    assert [x["kind"] for x in t["events"]] == []
    lim = t["limits"]
    assert lim["model"] == "NVIDIA H100 80GB HBM3"
    assert lim["nvlink_bytes_s"] == 4.5e11 and lim["ib_bytes_s"] == 5.0e10 and lim["max_sm_clock_mhz"] == 1980
    assert t["reason_bits"]["throttle"]["8"] == "hw_slowdown" and t["reason_bits"]["other"]["1"] == "gpu_idle"
    r = c.get("/api/v1/jobs/nope/timeline")
    assert r.status_code == 404 and "no job 'nope'" in r.json()["detail"]


def test_previous_runs_same_name_and_cluster_newest_first(database_url: str, live_server: Callable[..., Any]) -> None:
    c, s = _serve(database_url, live_server)
    e = make_engine(database_url)
    with e.begin() as conn:
        cid = conn.execute(select(Cluster.id).where(Cluster.name == "default")).scalar_one()
        other = conn.execute(select(Cluster.id).where(Cluster.name == "other")).scalar_one()
        gpu = conn.execute(select(Gpu.id).limit(1)).scalar_one()

        def job(job_id: str, start: float, cluster: int = cid, name: str = "llama-pretrain") -> int:
            return conn.execute(insert(Job).values(cluster_id=cluster, job_id=job_id, source="slurm", user="alice",
                                                   name=name, state="ended", start_ts=start, end_ts=start + 600,
                                                   labels={}).returning(Job.id)).scalar_one()

        older = job("0990", s.start - 9000)
        job("0995", s.start - 4000)
        job("0996", s.start - 3000, cluster=other)  # same name, other cluster
        job("0997", s.start - 2000, name="llama-pretrain-v2")
        job("2000", s.start + 60)  # started after 1001: not a previous run
        conn.execute(insert(Allocation).values(job_pk=older, gpu_pk=gpu, start_ts=s.start - 9000,
                                               end_ts=s.start - 8400))
        conn.execute(insert(JobReport).values(job_pk=older, computed_at=s.now, analyzed_until=s.now, goodput_score=0.4,
                                              allocated_gpu_hours=0.2, wasted_gpu_hours=0.1, report={}))
    e.dispose()
    r = c.get("/api/v1/jobs/1001/previous-runs").json()
    assert r["name"] == "llama-pretrain"
    assert [x["job_id"] for x in r["data"]] == ["0995", "0990"]
    newest, oldest = r["data"]
    assert newest["goodput_score"] is None and newest["n_gpus"] == 0  # not analysed: unknown, not zero
    assert oldest["goodput_score"] == 0.4 and oldest["n_gpus"] == 1 and oldest["wasted_gpu_hours"] == 0.1
    assert [x["job_id"] for x in c.get("/api/v1/jobs/1001/previous-runs?limit=1").json()["data"]] == ["0995"]
    assert c.get("/api/v1/jobs/1001/previous-runs?limit=0").status_code == 422
    assert c.get("/api/v1/jobs/nope/previous-runs").status_code == 404
