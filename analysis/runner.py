"""The database wrapper around the pure heuristics: which jobs are due, read their samples
(incrementally for running jobs), write ``job_reports`` and open/update/resolve ``flags``.

``run_analysis`` is what ``gpufleet up`` calls in-process every 30 s and what the Celery
tasks call in production. It is idempotent: a second run over the same data writes nothing
(reports are only written when they change; flags keep their opened_at/resolved_at).
Each job is its own transaction, so one bad job cannot block the others."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
from sqlalchemy import Engine, and_, exists, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, OperationalError

from gpufleet.storage.dialect import is_postgres
from gpufleet.storage.models import Allocation, Event, Flag, Gpu, Job, JobReport, Node

from .collectives.load import load_fabric
from .config import Thresholds, load_thresholds
from .detectors import features_for
from .features import RAW_FIELDS, MinuteFeatures, add_histograms, histograms
from .progress.flags import run_progress_pass
from .report import JobAnalysis, JobMeta, analyze
from .state import CACHE, JobState, StateCache
from .workload import classify

log = logging.getLogger(__name__)
_RUN_LOCK = threading.Lock()  # one analysis pass at a time per process (state is per process)


@dataclass
class AnalysisSummary:
    jobs_due: int = 0
    jobs_analyzed: int = 0
    reports_written: int = 0
    flags_opened: int = 0
    flags_updated: int = 0
    flags_resolved: int = 0
    jobs_closed: int = 0
    rows_read: int = 0
    duration_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    job_pks_changed: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _close_stale(engine: Engine, now: float) -> int:
    try:
        from gpufleet.storage import writes
    except ImportError:  # the collector's write path is optional for analysis
        return 0
    fn = getattr(writes, "close_stale_jobs", None)
    if fn is None:
        return 0
    with engine.begin() as conn:
        return int(fn(conn, now) or 0)


def due_jobs(conn: Connection) -> list[int]:
    """Jobs with samples newer than their report, never analyzed, or ended with open flags."""
    j, r, f = Job.__table__, JobReport.__table__, Flag.__table__
    open_flags = exists().where(f.c.job_pk == j.c.id, f.c.open.is_(True))
    q = (select(j.c.id).select_from(j.outerjoin(r, r.c.job_pk == j.c.id))
         .where(or_(and_(r.c.job_pk.is_(None), j.c.last_sample_ts.is_not(None)),
                    j.c.last_sample_ts > r.c.analyzed_until,
                    and_(j.c.state != "running", open_flags)))
         .order_by(j.c.id))
    return list(conn.execute(q).scalars())


def run_analysis(engine: Engine, *, now: float | None = None, job_pks: list[int] | None = None,
                 thresholds: Thresholds | None = None, cache: StateCache | None = None,
                 on_job_done: Callable[[int], None] | None = None) -> AnalysisSummary:
    """Analyze the due jobs (or exactly ``job_pks``); see the module docstring.
    ``on_job_done(job_pk)`` runs after each job's transaction (the Celery task refreshes its
    lock there)."""
    t0 = time.perf_counter()
    now = time.time() if now is None else now
    th = thresholds or load_thresholds()
    cache = cache if cache is not None else CACHE
    s = AnalysisSummary()
    job_pks_given = job_pks
    with _RUN_LOCK:
        try:
            s.jobs_closed = _close_stale(engine, now)
        except Exception as e:  # never let the collector's housekeeping stop analysis
            log.warning("close_stale_jobs failed: %s", e)
        if job_pks is None:
            with engine.connect() as conn:
                job_pks = due_jobs(conn)
        s.jobs_due = len(job_pks)
        for pk in job_pks:
            for attempt in range(2):
                try:
                    _analyze_one(engine, pk, now, th, cache, s)
                    break
                except (IntegrityError, OperationalError) as e:
                    # A concurrent analyzer inserted the same report/flag, or a lock timed
                    # out: the retry sees its rows and updates them.
                    if attempt:
                        s.errors.append(f"job {pk}: {type(e).__name__}: {e}")
                except Exception as e:
                    log.exception("analysis of job %s failed", pk)
                    s.errors.append(f"job {pk}: {type(e).__name__}: {e}")
                    cache.drop((_db_key(engine), pk))
                    break
            if on_job_done is not None:
                on_job_done(pk)
        if job_pks_given is None:  # the periodic pass: the jobs' own progress too (docs/progress.md)
            pp = run_progress_pass(engine, now)
            s.errors.extend(pp.errors)
            s.flags_opened, s.flags_resolved = s.flags_opened + pp.opened, s.flags_resolved + pp.resolved
            s.job_pks_changed.extend(pk for pk in pp.changed if pk not in s.job_pks_changed)
    s.duration_s = round(time.perf_counter() - t0, 4)
    return s


def _db_key(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def _job_gpus(conn: Connection, job_pk: int, extra: set[int]) -> dict[int, tuple[str, int, str | None, str]]:
    """gpu_pk -> (uuid, index, model, node name) for the job's allocated GPUs and ``extra``."""
    a = Allocation.__table__
    pks = set(conn.execute(select(a.c.gpu_pk).where(a.c.job_pk == job_pk)).scalars()) | extra
    if not pks:
        return {}
    g, n = Gpu.__table__, Node.__table__
    rows = conn.execute(select(g.c.id, g.c.uuid, g.c.index, g.c.model, n.c.name)
                        .select_from(g.join(n, n.c.id == g.c.node_id)).where(g.c.id.in_(sorted(pks))))
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}


# NULL -> -1 in SQL (every field read is >= 0 by the catalog), so rows convert to numpy with
# one np.fromiter over plain floats instead of a per-value None check (10x faster).
_COLS = ", ".join(f"COALESCE({f}, -1)" for f in RAW_FIELDS)
_NCOL = 2 + len(RAW_FIELDS)


def _read_samples(conn: Connection, job_pk: int, since: float) -> np.ndarray:
    """(rows, 2 + len(RAW_FIELDS)) float64: ts, gpu_pk, fields (NaN = NULL)."""
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    sql = (f"SELECT ts, gpu_pk, {_COLS} FROM gpu_samples WHERE job_pk = {mark} AND ts >= {mark} "
           "ORDER BY gpu_pk, ts")
    params = (job_pk, float(since) if np.isfinite(since) else -1e18)
    if is_postgres(conn):
        # Binary results: floats arrive as 8 bytes, not text to parse (2-3x faster); never
        # server-prepared (psycopg's auto-prepare ends in DEALLOCATE ALL after a rollback).
        dbapi = conn.connection.driver_connection
        if dbapi is None:  # SQLAlchemy types it Optional: None only once the connection is closed
            raise RuntimeError("the database connection is closed")
        with dbapi.cursor(binary=True) as cur:
            cur.execute(sql, params, prepare=False)
            rows = cur.fetchall()
    else:
        rows = conn.exec_driver_sql(sql, params).fetchall()
    if not rows:
        return np.zeros((0, _NCOL))
    data = np.fromiter(chain.from_iterable(rows), dtype=np.float64, count=len(rows) * _NCOL).reshape(-1, _NCOL)
    vals = data[:, 2:]
    vals[vals < 0] = np.nan
    return data


def _update_state(conn: Connection, job_pk: int, st: JobState | None, th: Thresholds) -> tuple[JobState, int]:
    since = st.reread_from if st else float("-inf")
    data = _read_samples(conn, job_pk, since)
    if st is None:
        st = JobState(gpu_pks=[], feats=MinuteFeatures.empty(0))
    if len(data) == 0:
        return st, 0
    ts, gpk = data[:, 0], data[:, 1].astype(np.int64)
    st.add_gpus(sorted(set(np.unique(gpk).tolist())))
    row_of = {pk: i for i, pk in enumerate(st.gpu_pks)}
    gi = np.vectorize(row_of.__getitem__, otypes=[np.int64])(gpk) if len(gpk) else gpk
    cols = {name: data[:, 2 + i] for i, name in enumerate(RAW_FIELDS)}
    g = th.general
    new = features_for(th, ts, gi, cols, len(st.gpu_pks))
    # Minutes from the re-read start on are replaced by what was just read.
    cut = int(np.floor(since / 60.0)) if np.isfinite(since) else int(np.floor(ts.min() / 60.0))
    st.feats = st.feats.before(cut).extend(new) if st.feats.shape[1] else new
    # Next re-read start: a minute boundary before the newest sample of the slowest GPU
    # (bounded, so a dead node does not pin it), minus a margin for late flushes.
    last_per_gpu = np.full(len(st.gpu_pks), -np.inf)
    np.maximum.at(last_per_gpu, gi, ts)
    newest = float(ts.max())
    slowest = float(np.min(last_per_gpu[np.isfinite(last_per_gpu)]))
    nxt = max(slowest, newest - g.reread_max_s) - g.reread_margin_s
    nxt = max(np.floor(nxt / 60.0) * 60.0, since)
    done = ts < nxt
    st.hist_before = add_histograms(st.hist_before, histograms(cols, done))
    st.hist_tail = histograms(cols, ~done)
    st.reread_from = nxt
    st.first_ts = float(ts.min()) if st.first_ts is None else min(st.first_ts, float(ts.min()))
    st.last_ts = newest if st.last_ts is None else max(st.last_ts, newest)
    return st, len(data)


EventRow = tuple[float, int | None, str, int | None]


def _events(conn: Connection, gpu_row: dict[int, int], t0: float, t1: float) -> list[EventRow]:
    if not gpu_row:
        return []
    e = Event.__table__
    q = select(e.c.ts, e.c.gpu_pk, e.c.kind, e.c.code).where(
        e.c.gpu_pk.in_(sorted(gpu_row)), e.c.ts >= t0, e.c.ts <= t1 + 60)
    return [(float(r[0]), gpu_row.get(r[1]), r[2], r[3]) for r in conn.execute(q)]


def _analyze_one(engine: Engine, job_pk: int, now: float, th: Thresholds, cache: StateCache,
                 s: AnalysisSummary) -> None:
    key = (_db_key(engine), job_pk)
    jt = Job.__table__
    with engine.begin() as conn:
        job = conn.execute(select(jt).where(jt.c.id == job_pk)).mappings().first()
        if job is None:
            cache.drop(key)
            return
        st, nrows = _update_state(conn, job_pk, cache.get(key), th)
        s.rows_read += nrows
        gpus = _job_gpus(conn, job_pk, set(st.gpu_pks))
        # GPUs allocated but never reporting still count: they are allocated time.
        st.add_gpus(sorted(gpus))
        cache.put(key, st)
        running = job["state"] == "running"
        models = Counter(m for (_, _, m, _) in gpus.values() if m)
        meta = JobMeta(
            job_id=job["job_id"], start_ts=job["start_ts"], end_ts=job["end_ts"], running=running,
            gpu_uuids=[gpus.get(p, (f"gpu-pk-{p}", -1, None, "?"))[0] for p in st.gpu_pks],
            gpu_nodes=[gpus.get(p, ("", -1, None, "?"))[3] for p in st.gpu_pks],
            gpu_indexes=[int(gpus.get(p, ("", -1, None, "?"))[1]) for p in st.gpu_pks],
            model=models.most_common(1)[0][0] if models else None,
            workload=classify(source=job["source"], name=job["name"], partition=job["partition"],
                              namespace=job["namespace"],
                              labels=job["labels"] if isinstance(job["labels"], dict) else None),
        )
        if st.first_ts is None:
            return  # no samples yet
        events = _events(conn, {p: i for i, p in enumerate(st.gpu_pks)}, st.first_ts, st.last_ts or st.first_ts)
        fabric = load_fabric(conn, job_pk)  # NCCL collectives and NICs (docs/nccl.md)
        res = analyze(meta, st.feats, st.hist(), th=th, events=events, first_ts=st.first_ts, last_ts=st.last_ts,
                      fabric=fabric)
        s.jobs_analyzed += 1
        analyzed_until = float(st.last_ts or 0.0)
        if not running and job["end_ts"] is not None:
            analyzed_until = max(analyzed_until, float(job["end_ts"]))
        changed = _write_report(conn, job_pk, res, analyzed_until, now)
        changed |= _sync_flags(conn, job_pk, res, now, s)
        if changed:
            s.reports_written += 1 if changed & 1 else 0
            s.job_pks_changed.append(job_pk)


def _write_report(conn: Connection, job_pk: int, res: JobAnalysis, analyzed_until: float, now: float) -> int:
    r = JobReport.__table__
    values = {"analyzed_until": analyzed_until, "goodput_score": res.goodput_score,
              "allocated_gpu_hours": res.allocated_gpu_hours, "wasted_gpu_hours": res.wasted_gpu_hours,
              "report": res.report}
    old = conn.execute(select(r).where(r.c.job_pk == job_pk)).mappings().first()
    if old is None:
        conn.execute(r.insert().values(job_pk=job_pk, computed_at=now, **values))
        return 1
    same = all(_same(old[k], v) for k, v in values.items())
    if same:
        return 0
    conn.execute(r.update().where(r.c.job_pk == job_pk).values(computed_at=now, **values))
    return 1


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(b)))  # float4 round trips
    return bool(a == b)


def _sync_flags(conn: Connection, job_pk: int, res: JobAnalysis, now: float, s: AnalysisSummary) -> int:
    f = Flag.__table__
    rows = conn.execute(select(f).where(f.c.job_pk == job_pk)).mappings()
    existing = {(row["kind"], row["scope"]): row for row in rows}
    changed = 0
    seen: set[tuple[str, str]] = set()
    for fd in res.findings:
        k = (fd.kind, fd.scope)
        if k in seen:
            continue
        seen.add(k)
        values = {"severity": fd.severity, "start_ts": fd.start_ts, "end_ts": fd.end_ts,
                  "wasted_gpu_hours": fd.wasted_gpu_hours, "evidence": fd.evidence, "suggestion": fd.suggestion,
                  "open": fd.ongoing}
        old = existing.get(k)
        if old is None:
            conn.execute(f.insert().values(job_pk=job_pk, kind=fd.kind, scope=fd.scope, opened_at=now,
                                           resolved_at=None if fd.ongoing else now, **values))
            s.flags_opened += 1
            changed |= 2
            continue
        if all(_same(old[c], v) for c, v in values.items()):
            continue
        upd = dict(values)
        if old["open"] and not fd.ongoing:
            upd["resolved_at"] = now
            s.flags_resolved += 1
        elif not old["open"] and fd.ongoing:
            upd["opened_at"], upd["resolved_at"] = now, None  # reopened: a new episode
            s.flags_opened += 1
        else:
            s.flags_updated += 1
        conn.execute(f.update().where(f.c.id == old["id"]).values(**upd))
        changed |= 2
    for k, old in existing.items():
        # Progress scopes are the progress pass's (analysis.progress.flags), judged from other data.
        if k not in seen and old["open"] and not str(old["scope"]).startswith("progress"):
            # No longer supported by the data (e.g. the job recovered): resolve, keep the row.
            conn.execute(f.update().where(f.c.id == old["id"]).values(open=False, resolved_at=now))
            s.flags_resolved += 1
            changed |= 2
    return changed


__all__ = ["AnalysisSummary", "due_jobs", "run_analysis"]
