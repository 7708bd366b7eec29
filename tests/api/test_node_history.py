"""A node's history over the REST API, on SQLite and PostgreSQL: per-GPU series downsampled from
the 1-minute rollups (the node page's charts) and the jobs that held its GPUs."""

from __future__ import annotations

import math

import httpx
from apiseed import Seeded

Api = tuple[httpx.Client, Seeded]


def test_node_timeseries_per_gpu_from_the_rollups(api: Api) -> None:
    c, s = api
    r = c.get("/api/v1/nodes/node-b/timeseries")
    assert r.status_code == 200, r.text
    b = r.json()
    assert [g["uuid"] for g in b["gpus"]] == s.gpu_uuids["node-b"]
    assert [f["name"] for f in b["fields"]] == ["sm_active", "power_w", "temp_c", "fb_used_bytes"]
    # the axis starts at the node's first minute of data, one point per minute for 2 hours
    assert b["step"] == 60 and b["t"][0] == s.start and len(b["t"]) == b["points"]
    power = b["series"]["power_w"]
    assert len(power) == 4 and all(len(row) == b["points"] for row in power)
    # GPU 0 held the idle job (75 W) the whole time; GPU 2 the job that ended after 30 minutes:
    # no rollup after it, so null (not measured), never 0
    assert {v for v in power[0] if v is not None} == {75.0}
    assert sum(v is not None for v in power[2]) == 30 and power[2][-1] is None
    assert all(v is not None for v in b["series"]["temp_c"][3][10:])

    coarse = c.get("/api/v1/nodes/node-b/timeseries", params={"fields": "sm_active", "step": "600"}).json()
    assert coarse["step"] == 600 and list(coarse["series"]) == ["sm_active"]
    assert len(coarse["t"]) == math.ceil((b["end"] - coarse["start"]) / 600)
    recent = c.get("/api/v1/nodes/node-b/timeseries", params={"start": "-30m"}).json()
    assert recent["start"] >= s.now - 1800 - 60 and all(v is None for v in recent["series"]["power_w"][2])


def test_node_timeseries_errors_are_clear(api: Api) -> None:
    c, _ = api
    r = c.get("/api/v1/nodes/nope/timeseries")
    assert r.status_code == 404 and "nope" in r.json()["detail"]
    r = c.get("/api/v1/nodes/node-b/timeseries", params={"fields": "sm_active,bogus"})
    assert r.status_code == 400 and "bogus" in r.json()["detail"]
    r = c.get("/api/v1/nodes/node-b/timeseries", params={"start": "-1h", "end": "-2h"})
    assert r.status_code == 400 and "after start" in r.json()["detail"]
    assert c.get("/api/v1/nodes/node-b/timeseries", params={"step": "10"}).status_code == 400


def test_node_detail_lists_the_jobs_that_held_its_gpus(api: Api) -> None:
    c, s = api
    jobs = c.get("/api/v1/nodes/node-b").json()["jobs"]
    assert [j["job_id"] for j in jobs] == ["666", "1002", "1003"]  # newest first
    by_id = {j["job_id"]: j for j in jobs}
    assert by_id["1002"]["gpus"] == 2 and by_id["1002"]["end_ts"] is None
    assert by_id["1003"]["end_ts"] == s.start + 1800 and by_id["1003"]["state"] == "ended"
    assert [j["job_id"] for j in c.get("/api/v1/nodes/node-a").json()["jobs"]] == ["1001"]
