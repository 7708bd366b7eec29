"""GET /api/v1/jobs/{id}/ledger and /api/v1/fleet/ledger over a real server, on jobs analysed by
the real runner (SQLite and PostgreSQL): the job's categories add up to its allocation and to its
report; the fleet's every grouping adds up to the same total, which is the sum of the jobs;
cost at the configured price; bad arguments are 400s, an unknown job a 404."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx
from sqlalchemy import select

from gpufleet.agent.simulator import make_job
from gpufleet.analysis.runner import run_analysis
from gpufleet.storage.db import make_engine
from gpufleet.storage.models import Job, JobReport
from tests.analysis.conftest import T0, ingest

TOL = 2e-3  # GPU-hours: each figure is rounded to 4 decimals


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TOL * max(1.0, abs(b))


def test_ledger_endpoints_add_up(database_url: str, live_server: Callable[..., Any]) -> None:
    e = make_engine(database_url)
    jobs = [replace(make_job("idle_gpu", "l-idle", 2, T0, 3600, node_prefix="a", user="ann"), account="acct1"),
            replace(make_job("vision_train", "l-good", 2, T0 + 300, 3600, node_prefix="b", user="bob"),
                    account="acct1"),
            replace(make_job("throttled", "l-thr", 1, T0 + 600, 3600, node_prefix="c", user="ann"),
                    account="acct2")]
    t1 = T0 + 35 * 60
    try:
        for j in jobs:
            ingest(e, j, j.start_ts, t1)
        assert run_analysis(e, now=t1 + 5).errors == []
        with e.connect() as c:
            reports = {jid: rep for jid, rep in c.execute(
                select(Job.job_id, JobReport.report).join(JobReport, JobReport.job_pk == Job.id))}
    finally:
        e.dispose()
    srv = live_server(database_url, cost__gpu_hour_price=2.5)
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        alloc_sum = 0.0
        for j in jobs:
            r = c.get(f"/api/v1/jobs/{j.job_id}/ledger")
            assert r.status_code == 200, r.text
            d = r.json()
            rep = reports[j.job_id]
            assert d["analyzed"] and d["job_id"] == j.job_id and d["currency"] and d["price_per_gpu_hour"] == 2.5
            assert _close(sum(d["categories"].values()), d["allocated_gpu_hours"])
            assert _close(d["allocated_gpu_hours"], rep["allocated_gpu_hours"])
            assert d["goodput"] == rep["goodput_score"]
            assert _close(d["wasted_gpu_hours"], rep["wasted_gpu_hours_total"])
            assert _close(sum(f["wasted_gpu_hours"] for f in d["flags"]), d["wasted_gpu_hours"])
            assert abs(d["cost"] - d["wasted_gpu_hours"] * 2.5) <= 0.011  # (both rounded)
            series = d["minutes"]["gpu_s"]
            assert len(d["minutes"]["t"]) == len(next(iter(series.values())))
            assert _close(sum(sum(v) for v in series.values()) / 3600, d["allocated_gpu_hours"])
            assert len(d["by_gpu"]) == len(j.gpus)
            hourly = c.get(f"/api/v1/jobs/{j.job_id}/ledger", params={"step": "600"}).json()["minutes"]
            assert hourly["step"] == 600 and len(hourly["t"]) < len(d["minutes"]["t"])
            assert _close(sum(sum(v) for v in hourly["gpu_s"].values()) / 3600, d["allocated_gpu_hours"])
            alloc_sum += d["allocated_gpu_hours"]
        idle = c.get("/api/v1/jobs/l-idle/ledger").json()
        assert idle["categories"].get("idle_gpu", 0) > 0.5 and idle["goodput"] is not None and idle["goodput"] < 0.1

        everything = {"start": str(T0 - 3600), "end": str(T0 + 3 * 3600)}
        totals = []
        for group_by in ("cause", "job", "user", "account", "team", "cluster"):
            r = c.get("/api/v1/fleet/ledger", params={**everything, "group_by": group_by})
            assert r.status_code == 200, r.text
            d = r.json()
            total = d["total"]
            totals.append(total)
            assert total["jobs"] == 3 and _close(total["allocated_gpu_hours"], alloc_sum)
            assert _close(sum(total["categories"].values()), total["allocated_gpu_hours"])
            if group_by == "cause":
                assert _close(sum(g["gpu_hours"] for g in d["groups"]), total["allocated_gpu_hours"])
                assert {g["key"] for g in d["groups"]} == set(total["categories"])
                continue
            for k in ("allocated_gpu_hours", "wasted_gpu_hours", "productive_gpu_hours", "unobserved_gpu_hours"):
                assert _close(sum(g[k] for g in d["groups"]), total[k]), (group_by, k)
            assert sum(g["jobs"] for g in d["groups"]) == 3
        assert {round(t["allocated_gpu_hours"], 3) for t in totals} == {round(totals[0]["allocated_gpu_hours"], 3)}
        users = c.get("/api/v1/fleet/ledger", params={**everything, "group_by": "user"}).json()["groups"]
        assert {g["key"] for g in users} == {"ann", "bob"}
        assert {g["key"] for g in c.get("/api/v1/fleet/ledger", params={**everything, "group_by": "account"})
                .json()["groups"]} == {"acct1", "acct2"}
        by_job = c.get("/api/v1/fleet/ledger", params={**everything, "group_by": "job"}).json()["groups"]
        assert {g["key"] for g in by_job} == {"l-idle", "l-good", "l-thr"} and by_job[0]["key"] == "l-idle"
        assert by_job[0]["user"] == "ann" and by_job[0]["cluster"] == "default"
        # the most wasteful only: the rest summed in omitted, so it still adds up
        top = c.get("/api/v1/fleet/ledger", params={**everything, "group_by": "job", "limit": "1"}).json()
        assert [g["key"] for g in top["groups"]] == ["l-idle"] and top["omitted"]["groups"] == 2
        assert _close(top["groups"][0]["allocated_gpu_hours"] + top["omitted"]["allocated_gpu_hours"],
                      top["total"]["allocated_gpu_hours"])
        # a range covering part of the jobs: fewer GPU-hours, still adding up
        part = c.get("/api/v1/fleet/ledger", params={"start": str(T0 + 600), "end": str(T0 + 1200),
                                                     "group_by": "user"}).json()
        assert 0 < part["total"]["allocated_gpu_hours"] < alloc_sum
        assert _close(sum(g["allocated_gpu_hours"] for g in part["groups"]), part["total"]["allocated_gpu_hours"])

        assert c.get("/api/v1/fleet/ledger", params={"group_by": "planet"}).status_code in (400, 422)
        r = c.get("/api/v1/fleet/ledger", params={"start": str(T0 + 10), "end": str(T0)})
        assert r.status_code == 400 and "end" in r.json()["detail"]
        assert c.get("/api/v1/jobs/l-idle/ledger", params={"step": "90"}).status_code == 400
        r = c.get("/api/v1/jobs/nope/ledger")
        assert r.status_code == 404 and "nope" in r.json()["detail"]


def test_progress_flags_take_their_categories_once(database_url: str, live_server: Callable[..., Any]) -> None:
    """A progress flag's waste is its categories of the job's ledger; a category both views share
    (hung) is not counted for the progress flag where a hardware flag already holds it."""
    from sqlalchemy import insert

    from gpufleet.storage.gpu_ledger import GpuLedgerMinute
    from gpufleet.storage.models import Cluster, Flag

    e = make_engine(database_url)
    try:
        with e.begin() as c:
            cl = c.execute(select(Cluster.id).where(Cluster.name == "default")).scalar_one()
            pk = c.execute(insert(Job).values(cluster_id=cl, job_id="p1", state="ended", start_ts=T0,
                                              end_ts=T0 + 600).returning(Job.id)).scalar_one()
            m = int(T0 // 60)
            c.execute(insert(GpuLedgerMinute), [
                {"job_pk": pk, "minute": m, "category": "productive", "gpu_s": 1800.0},
                {"job_pk": pk, "minute": m + 1, "category": "restart_lost", "gpu_s": 720.0},
                {"job_pk": pk, "minute": m + 2, "category": "hung", "gpu_s": 1080.0}])
            base = {"job_pk": pk, "start_ts": T0, "end_ts": T0 + 600, "evidence": {}, "suggestion": "",
                    "open": False, "opened_at": T0, "resolved_at": T0 + 600}
            c.execute(insert(Flag), [
                {**base, "kind": "hung", "scope": "", "severity": "warning", "wasted_gpu_hours": 0.2},
                {**base, "kind": "hung", "scope": "progress", "severity": "warning", "wasted_gpu_hours": 9.0},
                {**base, "kind": "restart_lost_progress", "scope": "progress", "severity": "warning",
                 "wasted_gpu_hours": 9.0},
                {**base, "kind": "slow_rank", "scope": "progress:rank3", "severity": "info",
                 "wasted_gpu_hours": 9.0}])
    finally:
        e.dispose()
    srv = live_server(database_url)
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        d = c.get("/api/v1/jobs/p1/ledger").json()
    got = {(f["kind"], f["scope"]): f["wasted_gpu_hours"] for f in d["flags"]}
    assert got == {("hung", ""): 0.2, ("hung", "progress"): 0.1, ("restart_lost_progress", "progress"): 0.2,
                   ("slow_rank", "progress:rank3"): 0.0}
    assert _close(sum(got.values()), d["wasted_gpu_hours"]) and d["wasted_gpu_hours"] == 0.5
