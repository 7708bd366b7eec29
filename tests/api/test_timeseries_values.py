"""Job time-series values over real HTTP, against means and maxima the test computes itself
from the 1-minute rows it wrote: 1-minute points (read as they are) and coarser steps (grouped
by the database), gaps and NULL fields as null (unknown is never zero), the GPUs in the order
asked for, the job line from the GPUs when there are no job rollups, and points=."""

from __future__ import annotations

import math
import random
from typing import Any

import httpx
import pytest
from apiseed import Seeded
from sqlalchemy import Engine, insert, select

from gpufleet.catalog import CATALOG
from gpufleet.storage.models import Allocation, Cluster, Gpu, Job, Node, gpu_samples_1m

Api = tuple[httpx.Client, Seeded]

MINUTES = 50
FIELDS = ("sm_active", "temp_c", "xid_last", "nvlink_tx_bytes_s")  # mean, max, last (-> max), all NULL on GPU 2


def _seed(engine: Engine, start: float) -> tuple[list[str], dict[tuple[int, float], dict[str, float | None]]]:
    """Three GPUs of job "tsjob", random values; GPU 1 misses minutes 10-19; GPU 2 never
    reports NVLink; GPU 0's temperature is missing in minute 7. No job rollups. Each minute
    holds a random number of samples (``n``, kept under the key "n"): a coarser point weighs
    its minutes by it, as a mean over the stored samples does."""
    rng = random.Random(16)
    rows: list[dict[str, Any]] = []
    known: dict[tuple[int, float], dict[str, float | None]] = {}
    with engine.begin() as c:
        cid = c.execute(select(Cluster.id).where(Cluster.name == "default")).scalar_one()
        jpk = c.execute(insert(Job).values(cluster_id=cid, job_id="tsjob", user="ts", state="running",
                                           start_ts=start, last_sample_ts=start + MINUTES * 60, labels={})
                        .returning(Job.id)).scalar_one()
        nid = c.execute(insert(Node).values(cluster_id=cid, name="ts-node", labels={}).returning(Node.id)).scalar_one()
        uuids = [f"GPU-ts-{i}" for i in range(3)]
        for i, u in enumerate(uuids):
            pk = c.execute(insert(Gpu).values(node_id=nid, uuid=u, index=i).returning(Gpu.id)).scalar_one()
            c.execute(insert(Allocation).values(job_pk=jpk, gpu_pk=pk, start_ts=start, end_ts=None))
            for m in range(MINUTES):
                if i == 1 and 10 <= m < 20:
                    continue
                ts = start + m * 60
                v: dict[str, float | None] = {
                    "sm_active": rng.random(), "temp_c": 40 + 30 * rng.random(),
                    "xid_last": float(rng.choice([0, 13, 79])),
                    "nvlink_tx_bytes_s": None if i == 2 else 1e9 * rng.random()}
                if i == 0 and m == 7:
                    v["temp_c"] = None
                n = rng.choice([1, 6, 30, 60])  # partial minutes: an agent's start, a 10 s cadence
                known[(i, ts)] = {**v, "n": float(n)}
                r: dict[str, Any] = {f.name: None for f in CATALOG.fields}
                r.update(v, bucket=ts, last_ts=ts + 59, gpu_pk=pk, job_pk=jpk, n=n)
                rows.append(r)
        c.execute(insert(gpu_samples_1m), rows)
    return uuids, known


def _expected(known: dict[tuple[int, float], dict[str, float | None]], gpus: list[int] | None, field: str,
              t: float, step: int) -> float | None:
    """The point at t: the max, or the mean over the samples (each minute weighed by its ``n``),
    of the minutes [t, t + step) of those GPUs (None: all)."""
    got = [(v[field], v["n"]) for (g, ts), v in known.items()
           if (gpus is None or g in gpus) and t <= ts < t + step and v[field] is not None]
    if not got:
        return None
    if CATALOG[field].rollup in ("max", "last"):
        return max(x for x, _ in got)  # type: ignore[type-var]
    return sum(x * n for x, n in got) / sum(n for _, n in got)  # type: ignore[operator, misc]


def _close(got: float | None, want: float | None, field: str) -> bool:
    if want is None or got is None:
        return got is want
    return math.isclose(got, want, abs_tol=6e-5 if CATALOG[field].unit == "ratio" else 0.06, rel_tol=1e-6)


def _check(c: httpx.Client, known: dict[tuple[int, float], dict[str, float | None]], uuids: list[str],
           params: dict[str, Any], order: list[int]) -> dict[str, Any]:
    r = c.get("/api/v1/jobs/tsjob/timeseries", params={"fields": ",".join(FIELDS), **params})
    assert r.status_code == 200, r.text
    ts = r.json()
    assert [g["uuid"] for g in ts["gpus"]] == [uuids[i] for i in order]
    step = ts["step"]
    assert len(ts["t"]) == ts["points"]
    for f in FIELDS:
        for row, g in enumerate(order):
            got = ts["series"][f][row]
            want = [_expected(known, [g], f, t, step) for t in ts["t"]]
            bad = [(t, x, y) for t, x, y in zip(ts["t"], got, want, strict=True) if not _close(x, y, f)]
            assert not bad, (f, g, step, bad[:3])
        # no job rollups for this job: the job line is every GPU's minutes together
        want_line = [_expected(known, None, f, t, step) for t in ts["t"]]
        bad = [(t, x, y) for t, x, y in zip(ts["t"], ts["aggregate"][f], want_line, strict=True) if not _close(x, y, f)]
        assert not bad, (f, "aggregate", step, bad[:3])
    return ts


Known = dict[tuple[int, float], dict[str, float | None]]


@pytest.fixture
def tsjob(api: Api, seeded: tuple[str, Any]) -> tuple[httpx.Client, Seeded, list[str], Known]:
    """The API client over the seeded fleet plus job "tsjob" (_seed): client, fleet, UUIDs, values."""
    from gpufleet.storage.db import make_engine

    c, s = api
    e = make_engine(seeded[0])
    try:
        uuids, known = _seed(e, s.start)
    finally:
        e.dispose()
    return c, s, uuids, known


@pytest.mark.parametrize("step", ["60", "180", "auto"])
def test_timeseries_points_are_the_minutes_means_and_maxima(tsjob: tuple[httpx.Client, Seeded, list[str], Known],
                                                            step: str) -> None:
    c, s, uuids, known = tsjob
    end = s.start + MINUTES * 60
    ts = _check(c, known, uuids, {"step": step, "start": s.start, "end": end}, [0, 1, 2])
    assert ts["step"] == (60 if step == "auto" else int(step))
    # the gap and the never-reported field are null, not zero
    gap = ts["t"].index(s.start + 12 * 60) if step == "60" else None
    if gap is not None:
        assert ts["series"]["sm_active"][1][gap] is None and ts["series"]["sm_active"][0][gap] is not None
    assert all(v is None for v in ts["series"]["nvlink_tx_bytes_s"][2])
    # GPUs in the order asked for, the job line still over every GPU
    _check(c, known, uuids, {"step": step, "start": s.start, "end": end, "gpu": f"{uuids[2]},{uuids[0]}"}, [2, 0])


def test_timeseries_points_parameter_sets_the_auto_step(tsjob: tuple[httpx.Client, Seeded, list[str], Known]) -> None:
    c, s, uuids, known = tsjob
    end = s.start + MINUTES * 60
    ts = _check(c, known, uuids, {"points": 10, "start": s.start, "end": end}, [0, 1, 2])
    assert ts["step"] == 300 and ts["points"] in (10, 11)  # 11 when start is not on a 300-s boundary
    for bad in (0, 9, 5001, "many"):
        assert c.get("/api/v1/jobs/tsjob/timeseries", params={"points": bad}).status_code in (400, 422)


def test_node_series_weigh_each_minute_by_its_samples(tsjob: tuple[httpx.Client, Seeded, list[str], Known]) -> None:
    """The node page's per-GPU lines group minutes the same way: a 3-minute point is the mean
    of the samples stored in it, not of the minutes (each minute here holds 1-60 samples)."""
    c, s, uuids, known = tsjob
    r = c.get("/api/v1/nodes/ts-node/timeseries",
              params={"fields": ",".join(FIELDS), "step": "180", "start": s.start, "end": s.start + MINUTES * 60})
    assert r.status_code == 200, r.text
    ts = r.json()
    assert [g["uuid"] for g in ts["gpus"]] == uuids and ts["step"] == 180
    for f in FIELDS:
        for g in range(3):
            want = [_expected(known, [g], f, t, 180) for t in ts["t"]]
            bad = [(t, x, y) for t, x, y in zip(ts["t"], ts["series"][f][g], want, strict=True) if not _close(x, y, f)]
            assert not bad, (f, g, bad[:3])
