"""The database wrapper around the pure heuristics: which jobs are due, read their minute
features (folded at ingest, storage.minute_features; never raw samples; incrementally for
running jobs, see analysis.state), write ``job_reports`` and open/update/resolve ``flags``.

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
from typing import Any

import numpy as np
from sqlalchemy import Engine, and_, exists, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, OperationalError

from gpufleet.storage.gpu_ledger import write_job_ledger
from gpufleet.storage.minute_features import HIST_SPAN_S, READ_COLUMNS, read_hist, read_states
from gpufleet.storage.models import Allocation, Event, Flag, Gpu, Job, JobReport, Node

from .collectives.load import load_fabric
from .config import Thresholds, load_thresholds
from .features import HIST_BINS, HIST_FIELDS, MinuteFeatures, from_states
from .ledger import fold_progress_only, progress_only_gpus
from .progress.flags import progress_jobs, run_progress_pass, store_progress_shares
from .progress.load import job_allocation, load_windows
from .report import JobAnalysis, JobMeta, analyze
from .serving.flags import WINDOW_S as SERVING_RECENT_S
from .serving.flags import is_serving_scope, job_serving_cells, run_serving_pass, serving_jobs, store_serving_shares
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


def due_jobs(conn: Connection, now: float | None = None) -> list[int]:
    """Jobs with samples newer than their report, never analyzed, or ended with open flags; the
    progress pass's jobs no GPU sample reached (their ledger is their progress's, refolded
    while their progress is recent: ``now``, default the clock); and serving replicas' jobs with
    recent replica-minutes (their ledger's serving view, docs/serving.md "Ledger")."""
    j, r, f = Job.__table__, JobReport.__table__, Flag.__table__
    open_flags = exists().where(f.c.job_pk == j.c.id, f.c.open.is_(True))
    q = (select(j.c.id).select_from(j.outerjoin(r, r.c.job_pk == j.c.id))
         .where(or_(and_(r.c.job_pk.is_(None), j.c.last_sample_ts.is_not(None)),
                    j.c.last_sample_ts > r.c.analyzed_until,
                    and_(j.c.state != "running", open_flags)))
         .order_by(j.c.id))
    due = list(conn.execute(q).scalars())
    seen = set(due)
    now = time.time() if now is None else now
    pks = [pk for pk in progress_jobs(conn, now) if pk not in seen]
    if pks:
        due = sorted(due + list(conn.execute(select(j.c.id).where(j.c.id.in_(pks), j.c.last_sample_ts.is_(None)))
                                .scalars()))
    seen = set(due)
    replicas = [pk for pk in serving_jobs(conn, now - SERVING_RECENT_S) if pk not in seen]
    return sorted(due + replicas) if replicas else due


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
                job_pks = due_jobs(conn, now)
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
            sp = run_serving_pass(engine, now)  # serving deployments' findings (docs/serving.md)
            s.flags_opened, s.flags_resolved = s.flags_opened + sp.opened, s.flags_resolved + sp.resolved
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


def _changed_runs(hours: list[int]) -> list[tuple[int, int]]:
    """Sorted hours as runs of consecutive ones: (first, last)."""
    runs: list[tuple[int, int]] = []
    for h in sorted(hours):
        if runs and h == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], h)
        else:
            runs.append((h, h))
    return runs


def _read_changed(conn: Connection, job_pk: int, st: JobState) -> int:
    """Re-read the job's feature rows of every hour whose fold counter moved since ``st`` read
    it (all hours for a new state). Counters are read first: a batch committed in between
    moves its counter again, so the next pass reads it. Returns the rows read."""
    hist = read_hist(conn, job_pk)
    changed = [r.hour for r in hist if st.folds.get(r.hour) != r.folds]
    nrows = 0
    for h0, h1 in _changed_runs(changed):
        data = read_states(conn, job_pk, h0 * HIST_SPAN_S, (h1 + 1) * HIST_SPAN_S)
        nrows += len(data)
        hour = np.floor(data[:, 0] / HIST_SPAN_S).astype(np.int64)
        for h in range(h0, h1 + 1):
            st.chunks[h] = data[hour == h]
    if changed or len(hist) != len(st.folds):
        st.folds = {r.hour: r.folds for r in hist}
        total = np.sum([r.h for r in hist], axis=0) if hist else np.zeros(len(HIST_FIELDS) * HIST_BINS, np.int64)
        st.hist_all = {name: total[i * HIST_BINS:(i + 1) * HIST_BINS].copy() for i, name in enumerate(HIST_FIELDS)}
    return nrows


def _build(st: JobState, allocated: set[int], changed: bool) -> None:
    """The job's MinuteFeatures from every kept row: GPUs that reported, in pk order, then the
    allocated ones that never did (they are allocated time). Depends only on the rows, so
    a warm state and a cold read build the same arrays."""
    data = np.concatenate([st.chunks[h] for h in sorted(st.chunks)]) if st.chunks else np.zeros((0, 2))
    reporting = sorted(set(data[:, 1].astype(np.int64).tolist())) if len(data) else []
    gpu_pks = reporting + sorted(allocated - set(reporting))
    if not changed and gpu_pks == st.gpu_pks:
        return
    st.gpu_pks = gpu_pks
    if not len(data):
        st.feats, st.first_ts, st.last_ts = MinuteFeatures.empty(len(gpu_pks)), None, None
        return
    st.feats = from_states(data, gpu_pks)
    st.first_ts = float(data[:, _FIRST_TS].min())
    st.last_ts = float(data[:, _LAST_TS].max())


_FIRST_TS, _LAST_TS = READ_COLUMNS.index("first_ts"), READ_COLUMNS.index("last_ts")


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
        st = cache.get(key) or JobState(gpu_pks=[], feats=MinuteFeatures.empty(0))
        nrows = _read_changed(conn, job_pk, st)
        s.rows_read += nrows
        reporting = {int(p) for c in st.chunks.values() for p in np.unique(c[:, 1]).tolist()}
        gpus = _job_gpus(conn, job_pk, reporting)
        # GPUs allocated but never reporting still count: they are allocated time.
        _build(st, set(gpus) | reporting, nrows > 0)
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
        if st.first_ts is None:  # no samples (yet): its ledger is its progress's, if any
            _progress_ledger(conn, job_pk, [gpus[p][0] for p in sorted(gpus)], now, s)
            return
        events = _events(conn, {p: i for i, p in enumerate(st.gpu_pks)}, st.first_ts, st.last_ts or st.first_ts)
        fabric = load_fabric(conn, job_pk)  # NCCL collectives and NICs (docs/nccl.md)
        progress = load_windows(conn, job_pk)  # the job's own progress, folded into its ledger
        span = [x for x in (job["start_ts"], st.first_ts, job["end_ts"], st.last_ts) if x is not None]
        serving = job_serving_cells(conn, job_pk, min(span), max(span) + 60)  # a replica's requests, likewise
        res = analyze(meta, st.feats, st.hist(), th=th, events=events, first_ts=st.first_ts, last_ts=st.last_ts,
                      fabric=fabric, progress=progress or None, serving=serving or None)
        s.jobs_analyzed += 1
        analyzed_until = float(st.last_ts or 0.0)
        if not running and job["end_ts"] is not None:
            analyzed_until = max(analyzed_until, float(job["end_ts"]))
        changed = _write_report(conn, job_pk, res, analyzed_until, now)
        if changed and res.ledger is not None:  # the ledger per job-minute, beside its report
            write_job_ledger(conn, job_pk, res.ledger.grid.b0, res.ledger.per_minute())
        changed |= _sync_flags(conn, job_pk, res, now, s)
        if changed:  # the progress and serving flags' waste is their share of this ledger and these flags
            changed |= 2 if store_progress_shares(conn, job_pk) + store_serving_shares(conn, job_pk) else 0
        if changed:
            s.reports_written += 1 if changed & 1 else 0
            s.job_pks_changed.append(job_pk)


def _progress_ledger(conn: Connection, job_pk: int, allocated: list[str], now: float, s: AnalysisSummary) -> None:
    """A job with progress and no GPU telemetry: its ledger folded from its progress alone
    (``ledger.fold_progress_only``; docs/goodput.md), then its progress flags' shares of it."""
    ws = load_windows(conn, job_pk)
    if not ws:
        return
    alloc = job_allocation(conn, job_pk, now)
    led = fold_progress_only(ws, progress_only_gpus(ws, allocated), *((alloc.start, alloc.end) if alloc else ()))
    changed = write_job_ledger(conn, job_pk, led.grid.b0, led.per_minute())
    changed += store_progress_shares(conn, job_pk)
    if changed and job_pk not in s.job_pks_changed:
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
    waste: dict[tuple[str, str], float] = {}  # one row per (kind, scope): its findings' shares summed
    for fd in res.findings:
        waste[(fd.kind, fd.scope)] = round(waste.get((fd.kind, fd.scope), 0.0) + fd.wasted_gpu_hours, 4)
    for fd in res.findings:
        k = (fd.kind, fd.scope)
        if k in seen:
            continue
        seen.add(k)
        values = {"severity": fd.severity, "start_ts": fd.start_ts, "end_ts": fd.end_ts,
                  "wasted_gpu_hours": waste[k], "evidence": fd.evidence, "suggestion": fd.suggestion,
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
        if k in seen or str(old["scope"]).startswith("progress") or is_serving_scope(str(old["scope"])):
            continue
        # No longer supported by the data: resolve, keep the row; no finding, no claim, so the
        # ledger gives it no second and neither does the flag (an old resolved one included).
        if old["open"]:
            conn.execute(f.update().where(f.c.id == old["id"]).values(open=False, resolved_at=now,
                                                                      wasted_gpu_hours=0.0))
            s.flags_resolved += 1
            changed |= 2
        elif old["wasted_gpu_hours"]:
            conn.execute(f.update().where(f.c.id == old["id"]).values(wasted_gpu_hours=0.0))
            changed |= 2
    return changed


__all__ = ["AnalysisSummary", "due_jobs", "run_analysis"]
