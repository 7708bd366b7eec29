"""REST API against a real server on SQLite and PostgreSQL, over a seeded fleet."""

from __future__ import annotations

import csv
import io
import socket
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from apiseed import XSS_NAME, Seeded

Api = tuple[httpx.Client, Seeded]


def test_jobs_list_filters_sorting_and_cursor(api: Api) -> None:
    c, _ = api
    r = c.get("/api/v1/jobs")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == 5 and len(body["data"]) == 5
    # default: newest start first; the XSS job started last in the default cluster
    assert body["data"][0]["job_id"] == "666"

    by_waste = c.get("/api/v1/jobs", params={"sort": "waste"}).json()["data"]
    assert by_waste[0]["job_id"] == "1002" and by_waste[0]["wasted_gpu_hours"] == pytest.approx(3.8)
    assert {f["kind"] for f in by_waste[0]["flags"]} == {"idle_gpu", "no_tensor_cores"}
    by_gpus = c.get("/api/v1/jobs", params={"sort": "gpus", "cluster": "default"}).json()["data"]
    assert [j["n_gpus"] for j in by_gpus] == [4, 2, 1, 1]
    asc = c.get("/api/v1/jobs", params={"sort": "gpus", "order": "asc", "cluster": "default"}).json()["data"]
    assert asc[-1]["job_id"] == "1001"

    assert [j["job_id"] for j in c.get("/api/v1/jobs", params={"user": "bob"}).json()["data"]] == ["1002"]
    ended = c.get("/api/v1/jobs", params={"state": "ended", "cluster": "default"}).json()
    assert [j["job_id"] for j in ended["data"]] == ["1003"] and ended["count"] == 1
    flagged = c.get("/api/v1/jobs", params={"flag": "throttled"}).json()["data"]
    assert [j["job_id"] for j in flagged] == ["666"] and flagged[0]["name"] == XSS_NAME
    assert c.get("/api/v1/jobs", params={"cluster": "other"}).json()["count"] == 1
    # the other cluster's job ended a day before the window
    assert c.get("/api/v1/jobs", params={"since": "-6h"}).json()["count"] == 4
    assert c.get("/api/v1/jobs", params={"until": "2000-01-01T00:00:00"}).json()["count"] == 0

    # cursor pagination walks every job once, in order, with a stable count
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = c.get("/api/v1/jobs", params={"limit": 2, "sort": "waste", **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        p = page.json()
        assert p["count"] == 5
        seen += [f"{j['cluster']}/{j['job_id']}" for j in p["data"]]
        cursor = p["next_cursor"]
        if not cursor:
            break
    assert len(seen) == 5 and len(set(seen)) == 5
    assert seen[0] == "default/1002"

    for bad in ({"cursor": "not-a-cursor"}, {"since": "yesterday"}, {"sort": "name"}, {"limit": 0}):
        r = c.get("/api/v1/jobs", params=bad)
        assert r.status_code in (400, 422), (bad, r.text)
        assert "detail" in r.json()


def test_job_detail_with_report_flags_and_links(api: Api) -> None:
    c, s = api
    r = c.get("/api/v1/jobs/1002")
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["user"] == "bob" and j["n_gpus"] == 2 and j["nodes"] == ["node-b"]
    assert [g["uuid"] for g in j["gpus"]] == s.gpu_uuids["node-b"][:2]
    assert all(g["current"] is not None for g in j["gpus"])
    assert j["summary"]["source"] == "report" and j["summary"]["goodput_score"] == pytest.approx(0.05)
    assert j["report"]["stats"]["sm_active"]["mean"] == pytest.approx(0.01)
    kinds = [(f["kind"], f["open"]) for f in j["flags"]]
    assert kinds[0] == ("idle_gpu", True) and ("no_tensor_cores", False) in kinds
    idle = j["flags"][0]
    assert idle["evidence"]["idle_fraction"] == pytest.approx(0.97) and "release" in idle["suggestion"]
    assert j["links"]["grafana"].startswith("http://grafana.example:3000/d/gpufleet-job/")
    assert f"var-job={s.jobs['1002']['pk']}" in j["links"]["grafana"] and "var-cluster=default" in j["links"]["grafana"]
    assert j["links"]["web"] == "/jobs/1002?cluster=default"

    # same job id in another cluster is another job
    other = c.get("/api/v1/jobs/1001", params={"cluster": "other"}).json()
    assert other["user"] == "dave" and other["n_gpus"] == 0 and other["flags"] == []
    assert c.get("/api/v1/jobs/1001", params={"cluster": "nope"}).status_code == 404
    assert c.get("/api/v1/jobs/does-not-exist").status_code == 404


def test_job_without_report_gets_live_numbers(api: Api) -> None:
    c, _ = api
    j = c.get("/api/v1/jobs/1003").json()
    assert j["state"] == "ended" and j["report"] is None and j["flags"] == []
    s = j["summary"]
    assert s["source"] == "live" and s["goodput_score"] is None
    assert s["sm_active_mean"] == pytest.approx(0.5, abs=0.05)
    assert s["allocated_gpu_hours"] == pytest.approx(0.5, abs=0.01)  # 1 GPU x 30 min
    assert len(j["per_gpu"]) == 1 and j["per_gpu"][0]["sm_active_mean"] == pytest.approx(0.5, abs=0.05)


def test_job_csv_per_gpu_report(api: Api) -> None:
    c, s = api
    for r in (c.get("/api/v1/jobs/1001", headers={"Accept": "text/csv"}),
              c.get("/api/v1/jobs/1001", params={"format": "csv"})):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(r.text)))
        assert [row["gpu_uuid"] for row in rows] == s.gpu_uuids["node-a"]
        assert float(rows[0]["sm_active_mean"]) == pytest.approx(0.92)
    # a job without a report gets its per-GPU CSV from the rollups
    live = list(csv.DictReader(io.StringIO(c.get("/api/v1/jobs/666", params={"format": "csv"}).text)))
    assert len(live) == 1 and float(live[0]["sm_active_mean"]) == pytest.approx(0.3, abs=0.05)


def test_timeseries_downsampled_per_gpu_and_aggregate(api: Api) -> None:
    c, s = api
    r = c.get("/api/v1/jobs/1001/timeseries")
    assert r.status_code == 200, r.text
    ts = r.json()
    assert ts["step"] == 60 and ts["points"] == len(ts["t"]) >= s.minutes
    assert [g["uuid"] for g in ts["gpus"]] == s.gpu_uuids["node-a"]
    assert set(ts["series"]) == {"sm_active", "tensor_active", "dram_active", "power_w", "sm_clock_mhz"}
    sm = ts["series"]["sm_active"]
    assert len(sm) == 4 and all(len(row) == ts["points"] for row in sm)
    vals = [v for v in sm[0] if v is not None]
    assert len(vals) >= s.minutes - 1 and 0.85 < sum(vals) / len(vals) < 0.97
    agg = [v for v in ts["aggregate"]["sm_active"] if v is not None]
    assert len(agg) >= s.minutes - 1

    coarse = c.get("/api/v1/jobs/1001/timeseries", params={"step": 600, "fields": "power_w,temp_c"}).json()
    assert coarse["step"] == 600 and coarse["points"] <= s.minutes // 10 + 2
    assert set(coarse["series"]) == {"power_w", "temp_c"}
    assert max(v for v in coarse["series"]["temp_c"][0] if v is not None) > 80  # max rollup stays max

    only = c.get("/api/v1/jobs/1001/timeseries",
                 params={"gpu": s.gpu_uuids["node-a"][1], "fields": "sm_active"}).json()
    assert len(only["gpus"]) == 1 and len(only["series"]["sm_active"]) == 1
    agg_only = c.get("/api/v1/jobs/1001/timeseries", params={"gpu": "none"}).json()
    assert agg_only["gpus"] == [] and agg_only["series"]["sm_active"] == []

    window = c.get("/api/v1/jobs/1001/timeseries", params={"start": s.start, "end": s.start + 3600}).json()
    assert window["points"] == 60

    for bad in ({"fields": "nope"}, {"step": "5"}, {"gpu": "GPU-not-in-job"}, {"start": s.start + 10, "end": s.start}):
        r = c.get("/api/v1/jobs/1001/timeseries", params=bad)
        assert r.status_code in (400, 422), (bad, r.text)
    assert c.get("/api/v1/jobs/9999/timeseries").status_code == 404


def test_nodes_gpus_events_and_throttling(api: Api) -> None:
    c, s = api
    nodes = c.get("/api/v1/nodes").json()
    assert nodes["count"] == 2 and [n["name"] for n in nodes["data"]] == ["node-a", "node-b"]
    g0 = nodes["data"][0]["gpus"][0]
    assert g0["job"]["job_id"] == "1001" and 0.8 < g0["current"]["sm_active"] <= 1.0
    page = c.get("/api/v1/nodes", params={"limit": 1}).json()
    assert len(page["data"]) == 1 and page["next_cursor"]
    nxt = c.get("/api/v1/nodes", params={"limit": 1, "cursor": page["next_cursor"]}).json()
    assert nxt["data"][0]["name"] == "node-b" and nxt["next_cursor"] is None

    nb = c.get("/api/v1/nodes/node-b").json()
    assert [e["kind"] for e in nb["events"]] == ["xid", "ecc_sbe"] and nb["events"][0]["code"] == 79
    gpu3 = nb["gpus"][3]
    assert gpu3["job"]["job_id"] == "666"
    assert 0.2 < gpu3["throttle"]["throttled_fraction"] < 0.5
    assert nb["gpus"][2]["job"] is None  # job 1003 ended
    assert c.get("/api/v1/nodes/node-z").status_code == 404

    g = c.get(f"/api/v1/gpus/{s.gpu_uuids['node-b'][3]}").json()
    assert g["node"] == "node-b" and g["events"][0]["code"] == 79 and g["jobs"][0]["job_id"] == "666"
    assert "sw_power_cap" in g["current"]["clock_event_reasons"] or g["current"]["clock_event_reasons"] == []
    assert c.get("/api/v1/gpus/GPU-nope").status_code == 404


def test_fleet_summary_and_flags(api: Api) -> None:
    c, _ = api
    f = c.get("/api/v1/fleet/summary", params={"window": "24h"}).json()
    assert f["nodes"] == 2 and f["gpus"] == 8 and f["gpus_allocated"] == 7
    assert f["gpus_reporting"] == 7  # the ended job's GPU stopped reporting
    # the seeded ledger's causes (a flag that books nothing, no_tensor_cores, is no cause of waste)
    assert set(f["wasted_gpu_hours"]) == {"idle_gpu", "throttled", "straggler"}
    assert f["wasted_gpu_hours"]["idle_gpu"] == pytest.approx(3.8, rel=0.02)
    assert f["top_jobs"][0]["job_id"] == "1002" and f["top_users"][0]["user"] == "bob"
    assert f["open_flags"] == {"critical": 1, "warning": 1}
    assert 0.3 < f["window"]["sm_active"] < 0.8
    short = c.get("/api/v1/fleet/summary", params={"window": "30m"}).json()
    assert short["wasted_gpu_hours"]["idle_gpu"] < f["wasted_gpu_hours"]["idle_gpu"]
    assert c.get("/api/v1/fleet/summary", params={"window": "forever"}).status_code == 422

    open_ = c.get("/api/v1/flags", params={"open": "true"}).json()
    assert [x["kind"] for x in open_["data"]] == ["idle_gpu", "throttled"]
    assert open_["data"][0]["job_id"] == "1002" and open_["data"][0]["evidence"]["gpus"] == 2
    assert c.get("/api/v1/flags", params={"open": "false"}).json()["count"] == 1
    assert c.get("/api/v1/flags", params={"kind": "throttled"}).json()["data"][0]["job_name"] == XSS_NAME


def test_health_ready_metrics_and_openapi(api: Api) -> None:
    c, _ = api
    assert c.get("/healthz").json() == {"status": "ok"}
    assert c.get("/readyz").json() == {"status": "ok"}
    c.get("/api/v1/jobs")
    m = c.get("/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    assert 'gpufleet_api_requests_total{method="GET",route="/api/v1/jobs",status="200"}' in m.text
    assert "gpufleet_api_request_seconds_bucket" in m.text and "gpufleet_jobs_running 3.0" in m.text
    spec = c.get("/openapi.json").json()
    for path in ("/api/v1/jobs", "/api/v1/jobs/{job_id}", "/api/v1/jobs/{job_id}/timeseries", "/api/v1/nodes",
                 "/api/v1/nodes/{name}", "/api/v1/gpus/{uuid}", "/api/v1/fleet/summary", "/api/v1/flags"):
        assert path in spec["paths"], path
    assert c.get("/docs").status_code == 200


def test_metrics_registry_is_per_app(sqlite_url: str, live_server: Callable[..., Any]) -> None:
    a, b = live_server(sqlite_url), live_server(sqlite_url)
    for _ in range(3):
        httpx.get(f"{a.url}/healthz")
    line = 'gpufleet_api_requests_total{method="GET",route="/healthz",status="200"}'
    assert f"{line} 3.0" in httpx.get(f"{a.url}/metrics").text
    assert line not in httpx.get(f"{b.url}/metrics").text


def test_readyz_reports_database_down() -> None:
    import threading
    import time

    import uvicorn
    from fastapi import FastAPI

    from gpufleet.api import routes_ops
    from gpufleet.storage.db import make_engine

    def port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    app = FastAPI()  # just the ops router, on an engine whose server is not there
    app.state.engine = make_engine(f"postgresql://postgres@127.0.0.1:{port()}/nothing",
                                   connect_args={"connect_timeout": 2})
    app.include_router(routes_ops.router)
    listen = socket.socket()  # bound here and handed over: no free-port race with uvicorn's bind
    listen.bind(("127.0.0.1", 0))
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=listen.getsockname()[1], log_level="warning"))
    th = threading.Thread(target=srv.run, kwargs={"sockets": [listen]}, daemon=True)
    th.start()
    deadline = time.time() + 20
    while not srv.started and time.time() < deadline:
        time.sleep(0.02)
    try:
        assert srv.started, "the test server did not start"
        base = f"http://127.0.0.1:{srv.config.port}"
        r = httpx.get(f"{base}/readyz", timeout=10)
        assert r.status_code == 503 and r.json()["status"] == "unavailable"
        assert httpx.get(f"{base}/healthz").status_code == 200
    finally:
        srv.should_exit = True
        th.join(10)
        listen.close()
        app.state.engine.dispose()


def test_auth_roles(seeded: tuple[str, Seeded], live_server: Callable[..., Any]) -> None:
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.tokens import create_token

    url, _ = seeded
    e = make_engine(url)
    viewer = create_token(e, "dash", "viewer")
    agent = create_token(e, "node-a", "agent", cluster="default", node="node-a")
    e.dispose()
    srv = live_server(url, allow_anonymous=False)
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        r = c.get("/api/v1/jobs")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert c.get("/api/v1/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/v1/jobs", headers={"Authorization": f"Bearer {agent}"}).status_code == 403
        ok = c.get("/api/v1/jobs/1002", headers={"Authorization": f"Bearer {viewer}"})
        assert ok.status_code == 200 and ok.json()["job_id"] == "1002"
        assert c.get("/healthz").status_code == 200 and c.get("/readyz").status_code == 200


def test_kubernetes_job_ids_with_slashes(api: Api, seeded: tuple[str, Seeded]) -> None:
    from sqlalchemy import insert, select

    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import Allocation, Cluster, Gpu, Job

    c, s = api
    e = make_engine(seeded[0])
    with e.begin() as conn:
        cid = conn.execute(select(Cluster.id).where(Cluster.name == "default")).scalar_one()
        pk = conn.execute(insert(Job).values(cluster_id=cid, job_id="ml-team/trainer-0", source="kubernetes",
                                             namespace="ml-team", name="trainer-0", state="running",
                                             start_ts=s.start).returning(Job.id)).scalar_one()
        # node-b GPU 2 is free (job 1003 ended): one open allocation per GPU
        gpk = conn.execute(select(Gpu.id).where(Gpu.uuid == s.gpu_uuids["node-b"][2])).scalar_one()
        conn.execute(insert(Allocation).values(job_pk=pk, gpu_pk=gpk, start_ts=s.start))
    e.dispose()
    r = c.get("/api/v1/jobs/ml-team%2Ftrainer-0")
    assert r.status_code == 200, r.text
    assert r.json()["job_id"] == "ml-team/trainer-0" and r.json()["namespace"] == "ml-team"
    assert r.json()["links"]["web"] == "/jobs/ml-team%2Ftrainer-0?cluster=default"
    assert c.get("/api/v1/jobs/ml-team/trainer-0").json()["n_gpus"] == 1
    ts = c.get("/api/v1/jobs/ml-team%2Ftrainer-0/timeseries", params={"gpu": "none"})
    assert ts.status_code == 200 and ts.json()["gpus"] == [], ts.text
    assert c.get("/jobs/ml-team%2Ftrainer-0").status_code == 200


def test_csv_cells_never_start_a_formula() -> None:
    from gpufleet.api.routes_jobs import per_gpu_csv

    out = per_gpu_csv([{"gpu_uuid": "GPU-1", "node": "=HYPERLINK(\"http://x\")", "index": 0, "sm_active_mean": 0.5}])
    row = next(iter(csv.DictReader(io.StringIO(out))))
    assert row["node"].startswith("'=") and row["sm_active_mean"] == "0.5"
