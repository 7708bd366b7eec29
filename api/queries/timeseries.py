"""Job time series, downsampled on the server from the 1-minute rollups.

The database does the bucketing (GROUP BY a step-aligned bucket), so a 24 h x 64 GPU job
returns a few hundred points per GPU, never the raw samples. Each field is aggregated the
way the catalog says it rolls up (mean stays mean, max stays max). A mean over minutes weighs
each minute by the samples it holds (its ``n``), so a point is the mean of the stored samples:
an unweighted mean counts a job's partial first and last minutes, and a 10 s agent's minute,
as much as a full 1 Hz one."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
from sqlalchemy import ColumnElement, Integer, cast, func, literal_column, select
from sqlalchemy.orm import Session

from gpufleet.catalog import CATALOG
from gpufleet.storage.dialect import is_sqlite
from gpufleet.storage.models import Job, gpu_samples_1m, job_samples_1m

from .common import BadRequest, now, rollup_mean
from .jobs import job_gpus

DEFAULT_FIELDS = ("sm_active", "tensor_active", "dram_active", "power_w", "sm_clock_mhz")
TARGET_POINTS = 360  # per series with step=auto: one point per 1.5-2 px of a dashboard chart
MAX_POINTS = 5000  # per series with an explicit step
MAX_VALUES = 1_000_000  # GPUs x fields x points in one answer; the step grows to respect it
ROLLUP_S = 60


def _agg(field: str, col: Any, n: Any) -> Any:
    return func.max(col) if _is_max(field) else rollup_mean(col, n)


def _is_max(field: str) -> bool:
    return CATALOG[field].rollup in ("max", "last")


def _bucket(session: Session, step: int, col: Any) -> ColumnElement[Any]:
    if is_sqlite(session):
        # buckets are positive, so truncation is floor
        return cast(col / step, Integer) * step
    return func.floor(col / step) * step


def parse_fields(text: str | None) -> list[str]:
    if not text:
        return list(DEFAULT_FIELDS)
    names = [f.strip() for f in text.split(",") if f.strip()]
    bad = [n for n in names if n not in CATALOG]
    if bad:
        raise BadRequest(f"unknown field(s) {', '.join(bad)}; see the metric catalog (/api/v1/catalog)")
    if not names:
        raise BadRequest("fields= is empty")
    if len(names) > 32:
        raise BadRequest("at most 32 fields per request")
    return list(dict.fromkeys(names))


def choose_step(span: float, step: str, n_series: int, points: int = TARGET_POINTS) -> int:
    """``points``: how many points step=auto aims at (a chart's width in pixels, say)."""
    if step == "auto":
        s = max(ROLLUP_S, math.ceil(span / points / ROLLUP_S) * ROLLUP_S)
    else:
        try:
            s = int(step)
        except ValueError:
            raise BadRequest(f"step={step!r}: use auto or a number of seconds (>= 60)") from None
        if s < ROLLUP_S or s > 30 * 86400:
            raise BadRequest(f"step={step}: must be between 60 and 2592000 seconds (data is rolled up per minute)")
        s = math.ceil(s / ROLLUP_S) * ROLLUP_S
        s = max(s, math.ceil(span / MAX_POINTS / ROLLUP_S) * ROLLUP_S)
    # never answer millions of values: coarsen until GPUs x fields x points fits
    while n_series * math.ceil(span / s) > MAX_VALUES:
        s *= 2
    return s


def _round(field: str, a: np.ndarray) -> np.ndarray:
    # ratios to 4 decimals, everything else to 1: halves the JSON without visible change
    return np.round(a, 4 if CATALOG[field].unit == "ratio" else 1)


def job_timeseries(session: Session, job: Job, *, fields: list[str], gpus: list[str] | None, step: str,
                   start: float | None, end: float | None, points: int | None = None) -> dict[str, Any]:
    """``gpus``: None = every GPU of the job; [] = the job aggregate only; else those UUIDs (in
    that order). ``points``: the number of points step=auto aims at (default TARGET_POINTS)."""
    # the aggregate alone (gpu=none) names no GPU: no need to look them up
    all_gpus = job_gpus(session, job) if gpus is None or gpus else []
    if gpus is None:
        chosen = all_gpus
    else:
        known = {g["uuid"]: g for g in all_gpus}
        unknown = [u for u in gpus if u not in known]
        if unknown:
            raise BadRequest(f"GPU(s) {', '.join(unknown[:3])} did not run job {job.job_id}")
        chosen = [known[u] for u in gpus]
    t_end = end if end is not None else (job.end_ts or job.last_sample_ts or now())
    if start is None:
        # from the job's first minute of data, not its scheduler start: a job that began
        # before its node's agent did would otherwise draw a long empty axis
        first = session.execute(select(func.min(gpu_samples_1m.c.bucket))
                                .where(gpu_samples_1m.c.job_pk == job.id)).scalar()
        start = max(job.start_ts or 0.0, first or 0.0) or (t_end - 3600)
    t_start = start
    if t_end <= t_start and end is None:
        # A job that ended without a single sample (the collector closes it at its start):
        # an empty minute, not an error the caller could not have avoided.
        t_end = t_start + ROLLUP_S
    if t_end <= t_start:
        raise BadRequest("end must be after start")
    if t_end - t_start > 90 * 86400:
        raise BadRequest("at most 90 days per request")
    s = choose_step(t_end - t_start, step, max(1, len(chosen) + 1) * len(fields), points or TARGET_POINTS)
    t0 = math.floor(t_start / s) * s
    n = max(1, math.ceil((t_end - t0) / s))
    axis = t0 + s * np.arange(n, dtype=np.float64)


    def fetch(table: Any, keys: list[int] | None) -> list[np.ndarray]:
        """One (len(keys) or 1, n) grid per field. ``keys``: the GPUs (rows in that order), or
        None for one line over whatever the table holds for the job."""
        return _grids(session, table, fields, job_id=job.id, t0=t0, t_end=t_end, step=s, n=n, keys=keys,
                      raw=s == ROLLUP_S, only_keys=gpus is not None)

    series: dict[str, list[list[float]]] = {f: [] for f in fields}
    if chosen:
        for f, grid in zip(fields, fetch(gpu_samples_1m, [g["gpu_pk"] for g in chosen]), strict=True):
            series[f] = _round(f, grid).tolist()

    lines = fetch(job_samples_1m, None)
    if all(np.isnan(x).all() for x in lines):  # no job rollups (yet): average the GPUs instead
        lines = fetch(gpu_samples_1m, None)
    aggregate = {f: _round(f, x[0]).tolist() for f, x in zip(fields, lines, strict=True)}

    return {
        "start": t0, "end": t_end, "step": s, "points": n,
        "fields": [{"name": f, "unit": CATALOG[f].unit, "description": CATALOG[f].description} for f in fields],
        "t": axis.tolist(),
        "gpus": [{"uuid": g["uuid"], "node": g["node"], "index": g["index"]} for g in chosen],
        "series": series,
        "aggregate": aggregate,
    }


def _grids(session: Session, table: Any, fields: list[str], *, job_id: int, t0: float, t_end: float, step: int,
           n: int, keys: list[int] | None, raw: bool, only_keys: bool) -> list[np.ndarray]:
    """Each field's points on the axis t0 + step * i: per GPU in ``keys`` order, or one line.

    A point is the max (as the catalog says the field rolls up) of the minutes in it, or their
    mean weighed by each minute's samples; the rows' third column is that weight (``n``).
    ``raw`` (1-minute points): the rows are read as they are, no GROUP BY; else the database
    groups them by the step, which for a 64-GPU day at 240 s took 170 ms where reading the
    92,160 minutes and reducing them here took 260 ms (the rows' serialisation dominates).
    The reduction below is the same either way: with grouped rows each point has one."""
    by_gpu = keys is not None
    if is_sqlite(session):
        rows = _sqlite_rows(session, table, fields, job_id=job_id, t0=t0, t_end=t_end, step=step, keys=keys,
                            raw=raw, only_keys=only_keys)
    else:
        sql = _pg_sql(table.name, tuple(fields), by_gpu=by_gpu, raw=raw, only_keys=only_keys)
        params: dict[str, Any] = {"job": job_id, "t0": float(t0), "t_end": float(t_end)}
        if not raw:
            params["step"] = float(step)
        if by_gpu and only_keys:
            params["keys"] = list(keys or [])
        rows = _pg_rows(session, sql, params, 3 + len(fields), grouped=not raw)
    width = len(keys) if keys is not None else 1
    if by_gpu:
        order = np.argsort(np.asarray(keys, dtype=np.float64))
        sorted_keys = np.asarray(keys, dtype=np.float64)[order]
        at = np.clip(np.searchsorted(sorted_keys, rows[:, 0]), 0, max(len(keys or []) - 1, 0))
        found = sorted_keys[at] == rows[:, 0] if len(sorted_keys) else np.zeros(len(rows), bool)
        row_of = np.where(found, order[at] if len(order) else 0, -1)
    else:
        row_of = np.zeros(len(rows), np.int64)
    point = ((rows[:, 1] - t0) // step).astype(np.int64)
    keep = (row_of >= 0) & (point >= 0) & (point < n)
    flat = row_of[keep] * n + point[keep]
    weight = rows[keep, 2]
    out = []
    for k, f in enumerate(fields):
        v = rows[keep, 3 + k]
        seen = ~np.isnan(v)
        if _is_max(f):
            grid = np.full(width * n, np.nan)
            np.fmax.at(grid, flat[seen], v[seen])
        else:
            # grouped rows are one per point (already weighed in SQL); 1-minute rows of several
            # GPUs on one line (the job line from GPU rollups) weigh by their samples here
            w = weight[seen]
            total = np.bincount(flat[seen], weights=v[seen] * w, minlength=width * n)
            count = np.bincount(flat[seen], weights=w, minlength=width * n)
            with np.errstate(invalid="ignore", divide="ignore"):
                grid = np.where(count > 0, total / np.where(count > 0, count, 1), np.nan)
        out.append(grid.reshape(width, n))
    return out


def _sqlite_rows(session: Session, table: Any, fields: list[str], *, job_id: int, t0: float, t_end: float,
                 step: int, keys: list[int] | None, raw: bool, only_keys: bool) -> np.ndarray:
    by_gpu = keys is not None
    c = table.c
    if raw:
        b: Any = c.bucket
        cols = [c.gpu_pk if by_gpu else literal_column("0"), b, c.n, *(c[f] for f in fields)]
        group: list[Any] = []
    else:
        b = _bucket(session, step, c.bucket)
        cols = [c.gpu_pk if by_gpu else literal_column("0"), b, func.sum(c.n),
                *(_agg(f, c[f], c.n) for f in fields)]
        group = [c.gpu_pk, b] if by_gpu else [b]
    q = select(*cols).where(c.job_pk == job_id, c.bucket >= t0, c.bucket < t_end)
    if group:
        q = q.group_by(*group)
    if by_gpu and only_keys:
        q = q.where(c.gpu_pk.in_(keys))
    # Every bound value here is a number we computed: compiled with literal values and run on
    # the DB-API connection, no Python object per row beyond the tuple (NULL -> NaN: a gap)
    conn = session.connection()
    sql = str(q.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    dbapi: Any = conn.connection.dbapi_connection
    cur = dbapi.cursor()
    try:
        cur.execute(sql)
        rows = cur.fetchall()
    finally:
        cur.close()
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(cols))


@lru_cache(maxsize=256)
def _pg_sql(table: str, fields: tuple[str, ...], *, by_gpu: bool, raw: bool, only_keys: bool) -> str:
    """The statement for one shape of request, written once: compiling a 32-column SQLAlchemy
    select with literal values cost more than PostgreSQL took to run it (job line, 1,440 rows).
    Names come from the catalog (parse_fields checked them), values are bound parameters.

    Every column comes back as float8 with NULL as NaN, so the rows have one fixed layout numpy
    reads in one call (the NaN becomes null in the JSON, as NULL did). A mean is sum / count
    of float8 weighed by each minute's samples ``n`` over the minutes where the field is known
    (the mean of the stored samples, as ``common.rollup_mean``). The third column is the weight."""
    if raw:
        bucket = "bucket"
        vals = ["n::float8", *(f"coalesce({f}::float8, 'NaN')" for f in fields)]
    else:
        bucket = "floor(bucket / %(step)s) * %(step)s"
        vals = ["sum(n)::float8", *(f"coalesce(max({f})::float8, 'NaN')" if _is_max(f)
                else f"coalesce(sum({f}::float8 * n) / sum(n) FILTER (WHERE {f} IS NOT NULL), 'NaN')"
                for f in fields)]
    gpu = "gpu_pk::float8" if by_gpu else "0::float8"
    sql = (f"SELECT {gpu}, {bucket}, {', '.join(vals)} FROM {table} "
           "WHERE job_pk = %(job)s AND bucket >= %(t0)s AND bucket < %(t_end)s")
    if by_gpu and only_keys:
        sql += " AND gpu_pk = ANY(%(keys)s::int[])"
    if not raw:
        sql += " GROUP BY 1, 2"
    # One row back: each column as one float8[] in PostgreSQL's binary array format (array_send),
    # read by numpy in one call. (Binary COPY would do too, but psycopg yields it row by row.)
    names = ", ".join(f"c{k}" for k in range(3 + len(fields)))
    aggs = ", ".join(f"array_send(array_agg(c{k}))" for k in range(3 + len(fields)))
    return f"SELECT {aggs} FROM ({sql}) AS q({names})"


def _pg_rows(session: Session, sql: str, params: dict[str, Any], ncols: int, *, grouped: bool) -> np.ndarray:
    """The rows of ``sql`` as a (rows, ncols) float64 array, without a Python object per value."""
    dbapi: Any = session.connection().connection.dbapi_connection
    with dbapi.cursor(binary=True) as cur:
        # never a prepared (generic) plan: planned for an average job (~10 rows) it sorted a
        # 64-GPU day's 92k rows for a GroupAggregate, 20% slower than the hash this job gets
        if grouped:
            # a 64-GPU day groups into ~23k rows: hashed in memory, not spilled to disk; the
            # SET is pipelined with the query (one round trip)
            with dbapi.pipeline():
                cur.execute("SET LOCAL work_mem = '32MB'")
                cur.execute(sql, params, prepare=False)
        else:
            cur.execute(sql, params, prepare=False)
        got = cur.fetchone()
    if got is None or got[0] is None:
        return np.empty((0, ncols))
    # (ncols, rows) transposed: each column stays contiguous for the reduction's reads
    return np.array([_float8_array(bytes(x)) for x in got]).T


def _float8_array(data: bytes) -> np.ndarray:
    # array_send of a one-dimensional float8[] without NULLs: int32 ndim, flags and element
    # type, int32 length and lower bound, then (int32 length 8, big-endian float8) per element
    n = int.from_bytes(data[12:16], "big")
    rec = np.dtype([("len", ">i4"), ("v", ">f8")])
    return np.frombuffer(data, dtype=rec, count=n, offset=20)["v"].astype(np.float64)
