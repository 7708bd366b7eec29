"""POST /api/v1/ingest over real HTTP into real SQLite and PostgreSQL."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from sqlalchemy import text

from gpufleet import protocol
from gpufleet.catalog import CATALOG
from gpufleet.storage.db import make_engine
from gpufleet.storage.raw_read import count_raw_samples, raw_records

from .conftest import make_batch


def counts(url: str) -> dict[str, int]:
    e = make_engine(url)
    try:
        with e.connect() as c:
            return {"raw_samples": count_raw_samples(c)} | {
                t: c.execute(text(f"select count(*) from {t}")).scalar_one()
                for t in ("gpu_samples_1m", "job_samples_1m", "jobs", "gpus", "nodes",
                          "ingest_batches", "events", "allocations")}
    finally:
        e.dispose()


def post(url: str, batch: protocol.Batch, compress: str | None = "zstd", token: str | None = None,
         packed: bool = True) -> httpx.Response:
    body, headers = protocol.encode(batch, compress=compress, packed=packed)  # type: ignore[arg-type]
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(url + "/api/v1/ingest", content=body, headers=headers, timeout=30)


@pytest.mark.parametrize("compress", ["zstd", "gzip", None])
def test_ingest_stores_once_and_acknowledges_retry_as_duplicate(database_url, live_server, compress) -> None:
    srv = live_server(database_url)
    b = make_batch("n1", seq=7, start=time.time() - 30)
    r = post(srv.url, b, compress)
    assert r.status_code == 200, r.text
    assert r.json() == {"stored": 80, "duplicate": False}
    r = post(srv.url, b, compress)  # the agent lost our acknowledgement and retries
    assert r.json() == {"stored": 0, "duplicate": True}
    c = counts(database_url)
    assert c["raw_samples"] == 80 and c["ingest_batches"] == 1 and c["gpus"] == 8 and c["nodes"] == 1
    assert c["jobs"] == 1 and c["allocations"] == 8


def test_json_body(database_url, live_server) -> None:
    srv = live_server(database_url)
    b = make_batch("n1", seq=1, start=time.time() - 30, gpus=2, seconds=3)
    body = protocol.msgspec.json.encode(b)
    r = httpx.post(srv.url + "/api/v1/ingest", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["stored"] == 6
    assert counts(database_url)["raw_samples"] == 6


def test_rejected_value_names_field_and_row_and_stores_nothing(database_url, live_server) -> None:
    srv = live_server(database_url)
    b = make_batch("n1", seq=1, start=time.time() - 30)
    b.samples["sm_active"][17] = 1.5
    r = post(srv.url, b)
    assert r.status_code == 422
    assert "samples.sm_active[17]" in r.json()["detail"] and "1.5" in r.json()["detail"]
    c = counts(database_url)
    assert c["raw_samples"] == 0 and c["ingest_batches"] == 0 and c["jobs"] == 0 and c["gpus"] == 0


_BOTH_FORMS = [
    (lambda b: b.samples.__setitem__("bogus_field", [1.0] * 80), 422, "samples.bogus_field"),
    (lambda b: b.samples["ts"].__setitem__(5, time.time() + 86400), 422, "samples.ts[5]"),
    (lambda b: b.samples["ts"].__setitem__(6, 1.0), 422, "samples.ts[6]"),
    (lambda b: b.samples["xid_last"].__setitem__(2, 1.5), 422, "samples.xid_last[2]"),
    (lambda b: b.samples["gpu"].__setitem__(9, "GPU-not-listed"), 422, "samples.gpu[9]"),
    (lambda b: setattr(b.agent, "node", "x" * 300), 422, "agent.node"),
    (lambda b: setattr(b.agent, "boot_id", ""), 422, "agent.boot_id"),
    (lambda b: b.samples["job"].__setitem__(4, "a\x00b"), 422, "samples.job[4]"),
    (lambda b: b.samples["temp_c"].__setitem__(3, float("inf")), 422, "samples.temp_c[3]"),
]
# Only the list form can say these: packed NaN means "not available" and a packed column
# cannot be shorter than the others (tests/collector/test_packed.py covers its own errors).
_LIST_FORM_ONLY = [
    (lambda b: b.samples["temp_c"].__setitem__(3, float("nan")), 422, "samples.temp_c[3]"),
    (lambda b: b.samples["power_w"].pop(), 422, "samples.power_w"),
]


@pytest.mark.parametrize(("mutate", "status", "needle", "packed"),
                         [(*c, p) for c in _BOTH_FORMS for p in (False, True)] + [(*c, False) for c in _LIST_FORM_ONLY])
def test_limits_are_4xx_naming_the_field(database_url, live_server, mutate, status, needle, packed) -> None:
    srv = live_server(database_url)
    b = make_batch("n1", seq=1, start=time.time() - 30)
    mutate(b)
    r = post(srv.url, b, packed=packed)
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"]
    assert counts(database_url)["raw_samples"] == 0


def test_size_limits(sqlite_url, live_server) -> None:
    srv = live_server(sqlite_url, max_body_bytes=16384, max_rows_per_batch=50)
    b = make_batch("n1", seq=1, start=time.time() - 30)  # 80 rows
    body, headers = protocol.encode(b, compress=None)
    r = httpx.post(srv.url + "/api/v1/ingest", content=body, headers=headers)
    assert r.status_code == 413
    small = make_batch("n1", seq=2, start=time.time() - 30, gpus=8, seconds=7, fields=())  # 56 rows
    r = post(srv.url, small)
    assert r.status_code == 413 and "56 rows" in r.json()["detail"]
    bomb = protocol.gzip.compress(b"\x00" * 100_000)  # tiny on the wire, big inflated
    r = httpx.post(srv.url + "/api/v1/ingest", content=bomb,
                   headers={"Content-Type": protocol.MSGPACK, "Content-Encoding": "gzip"})
    assert r.status_code == 413
    assert counts(sqlite_url)["raw_samples"] == 0


def test_unsupported_encoding_and_type(sqlite_url, live_server) -> None:
    srv = live_server(sqlite_url)
    r = httpx.post(srv.url + "/api/v1/ingest", content=b"x", headers={"Content-Encoding": "br"})
    assert r.status_code == 415
    r = httpx.post(srv.url + "/api/v1/ingest", content=b"x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415


def test_rollups_match_raw_samples(database_url, live_server) -> None:
    """Two batches land in the same minutes; the rollups equal aggregates of the raw rows."""
    srv = live_server(database_url)
    start = (time.time() // 60) * 60 - 120 + 25  # 25 s into a minute: batches straddle a boundary
    for seq in range(4):
        b = make_batch("n1", seq=seq, start=start + seq * 10, gpus=2, seed=seq)
        b.samples["sm_active"][0] = None  # a null is skipped by the mean, not counted as 0
        assert post(srv.url, b).status_code == 200
    e = make_engine(database_url)
    with e.connect() as c:
        raw = raw_records(c)
        roll = c.execute(text("select * from gpu_samples_1m")).mappings().all()
        jroll = c.execute(text("select * from job_samples_1m")).mappings().all()
    e.dispose()
    assert sum(r["n"] for r in roll) == len(raw) == 80
    assert sum(r["n"] for r in jroll) == 80
    checked = 0
    for r in roll:
        rows = [x for x in raw if x["gpu_pk"] == r["gpu_pk"] and r["bucket"] <= x["ts"] < r["bucket"] + 60]
        assert len(rows) == r["n"]
        for f in ("temp_c", "fb_used_bytes", "energy_j", "clock_event_reasons"):
            vals = [x[f] for x in rows]
            kind = CATALOG[f].rollup
            want = max(vals) if kind == "max" else vals[-1] if kind == "last" else float(np.mean(vals))
            assert r[f] == pytest.approx(want, rel=1e-5), (f, kind)
            checked += 1
        sm = [x["sm_active"] for x in rows if x["sm_active"] is not None]
        # means merge per batch weighted by rows: exact when no nulls, close otherwise
        assert r["sm_active"] == pytest.approx(float(np.mean(sm)), abs=0.05)
    assert checked >= 16


def test_events_and_job_lifecycle(database_url, live_server) -> None:
    from gpufleet.protocol import Event
    from gpufleet.storage.jobs import close_stale_jobs

    srv = live_server(database_url)
    now = time.time()
    b1 = make_batch("n1", seq=0, start=now - 60, gpus=2, job="a")
    b1.events = [Event(ts=now - 55, kind="xid", gpu_uuid=b1.gpus[0].uuid, code=79, message="fell off")]
    b2 = make_batch("n1", seq=1, start=now - 50, gpus=2, job="b")
    for b in (b1, b2):
        assert post(srv.url, b).status_code == 200
    e = make_engine(database_url)
    with e.connect() as c:
        jobs = {r.job_id: r for r in c.execute(text("select * from jobs"))}
        allocs = c.execute(text("select j.job_id, a.start_ts, a.end_ts from allocations a "
                                "join jobs j on j.id = a.job_pk order by a.id")).all()
        ev = c.execute(text("select kind, code, gpu_pk from events")).all()
    assert jobs["a"].start_ts == pytest.approx(now - 60) and jobs["a"].last_sample_ts == pytest.approx(now - 51)
    assert jobs["b"].state == "running"
    # job a's allocation closed when b's first sample arrived on the same GPUs
    assert [(j, end is None) for j, _, end in allocs] == [("a", False), ("a", False), ("b", True), ("b", True)]
    assert all(end == pytest.approx(now - 50) for j, _, end in allocs if j == "a")
    assert ev == [("xid", 79, ev[0][2])] and ev[0][2] is not None
    with e.begin() as c:
        assert close_stale_jobs(c, now + 200) == 0  # 250 s since the last sample: still running
        assert close_stale_jobs(c, now + 400) == 2
    with e.connect() as c:
        rows = c.execute(text("select state, end_ts, last_sample_ts from jobs")).all()
        assert all(s == "ended" and end == last for s, end, last in rows)
        assert c.execute(text("select count(*) from allocations where end_ts is null")).scalar_one() == 0
    e.dispose()
