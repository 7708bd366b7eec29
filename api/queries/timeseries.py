"""Job time series, downsampled on the server from the 1-minute rollups.

The database does the bucketing (GROUP BY a step-aligned bucket), so a 24 h x 64 GPU job
returns a few hundred points per GPU, never the raw samples. Each field is aggregated the
way the catalog says it rolls up (mean stays mean, max stays max)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sqlalchemy import ColumnElement, Integer, cast, func, select
from sqlalchemy.orm import Session

from gpufleet.catalog import CATALOG
from gpufleet.storage.dialect import is_sqlite
from gpufleet.storage.models import Job, gpu_samples_1m, job_samples_1m

from .common import BadRequest, now
from .jobs import job_gpus

DEFAULT_FIELDS = ("sm_active", "tensor_active", "dram_active", "power_w", "sm_clock_mhz")
TARGET_POINTS = 360  # per series with step=auto: one point per 1.5-2 px of a dashboard chart
MAX_POINTS = 5000  # per series with an explicit step
MAX_VALUES = 1_000_000  # GPUs x fields x points in one answer; the step grows to respect it
ROLLUP_S = 60


def _agg(field: str, col: Any) -> Any:
    return func.max(col) if CATALOG[field].rollup in ("max", "last") else func.avg(col)


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


def choose_step(span: float, step: str, n_series: int) -> int:
    if step == "auto":
        s = max(ROLLUP_S, math.ceil(span / TARGET_POINTS / ROLLUP_S) * ROLLUP_S)
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
                   start: float | None, end: float | None) -> dict[str, Any]:
    """``gpus``: None = every GPU of the job; [] = the job aggregate only; else those UUIDs."""
    all_gpus = job_gpus(session, job)
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
    s = choose_step(t_end - t_start, step, max(1, len(chosen) + 1) * len(fields))
    t0 = math.floor(t_start / s) * s
    n = max(1, math.ceil((t_end - t0) / s))
    axis = t0 + s * np.arange(n, dtype=np.float64)

    def fetch(table: Any, by_gpu: bool, pks: list[int] | None) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        b = _bucket(session, s, table.c.bucket).label("b")
        cols = [b, *(_agg(f, table.c[f]).label(f) for f in fields)]
        group = [b]
        if by_gpu:
            cols.insert(0, table.c.gpu_pk)
            group.insert(0, table.c.gpu_pk)
        q = select(*cols).where(table.c.job_pk == job.id, table.c.bucket >= t0, table.c.bucket < t_end).group_by(*group)
        if pks is not None:
            q = q.where(table.c.gpu_pk.in_(pks))
        # Every bound value here is a number we computed, so the statement is compiled with
        # literal values and run on the DB-API cursor directly: ~30k grouped rows skip SQLAlchemy's
        # per-row result objects (a fifth of this endpoint's time on PostgreSQL).
        conn = session.connection()
        sql = str(q.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
        cur = conn.connection.cursor()
        try:
            cur.execute(sql)
            rows = cur.fetchall()
        finally:
            cur.close()
        if not rows:
            return np.empty(0, np.int64), np.empty(0, np.int64), [np.empty(0) for _ in fields]
        arr = np.array([[(r[0] if by_gpu else 0), r[1 if by_gpu else 0]] for r in rows], dtype=np.float64)
        vals = [np.array([r[i + (2 if by_gpu else 1)] for r in rows], dtype=np.float64) for i in range(len(fields))]
        idx = np.clip(((arr[:, 1] - t0) // s).astype(np.int64), 0, n - 1)
        return arr[:, 0].astype(np.int64), idx, vals

    series: dict[str, list[list[float]]] = {f: [] for f in fields}
    if chosen:
        pos = {g["gpu_pk"]: i for i, g in enumerate(chosen)}
        gpk, idx, vals = fetch(gpu_samples_1m, True, None if gpus is None else [g["gpu_pk"] for g in chosen])
        keep = np.array([p in pos for p in gpk.tolist()], dtype=bool) if len(gpk) else np.empty(0, bool)
        rows_i = np.array([pos.get(p, 0) for p in gpk.tolist()], dtype=np.int64)
        for f, v in zip(fields, vals, strict=True):
            grid = np.full((len(chosen), n), np.nan)
            grid[rows_i[keep], idx[keep]] = v[keep]
            series[f] = _round(f, grid).tolist()

    aggregate: dict[str, list[float]] = {}
    _, idx, vals = fetch(job_samples_1m, False, None)
    if len(idx) == 0:  # no job rollups (yet): average the GPUs instead
        _, idx, vals = fetch(gpu_samples_1m, False, None)
    for f, v in zip(fields, vals, strict=True):
        line = np.full(n, np.nan)
        line[idx] = v
        aggregate[f] = _round(f, line).tolist()

    return {
        "start": t0, "end": t_end, "step": s, "points": n,
        "fields": [{"name": f, "unit": CATALOG[f].unit, "description": CATALOG[f].description} for f in fields],
        "t": axis.tolist(),
        "gpus": [{"uuid": g["uuid"], "node": g["node"], "index": g["index"]} for g in chosen],
        "series": series,
        "aggregate": aggregate,
    }
