"""Progress findings into ``flags`` (the thin database side of ``detect``): one row per (job,
kind, scope) with scopes ``progress`` / ``progress:rank<N>``, opened, updated and resolved like
the hardware flags, so the alert rules (Slack) and the web read them the same way: ``hung``
and every kind whose registry entry (gpufleet/flagkinds.toml) says ``source = "progress"``.
A finding of a kind the registry does not know (a newer detector against an older registry)
stays in the job's ``goodput.findings``. The hardware runner leaves ``progress`` scopes alone,
except their ``wasted_gpu_hours``: every flag's waste is its share of the job's stored ledger
(``store_progress_shares``), never the detector's own estimate, so two flags never claim one
second and the flags add up to no more than the ledger's waste (docs/goodput.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.engine import Connection, Engine

from gpufleet.flagkinds import FLAG_KINDS, flag_kinds
from gpufleet.storage.gpu_ledger import GpuLedgerMinute
from gpufleet.storage.models import Flag
from gpufleet.storage.progress_models import JobProgress

from ..flag_shares import is_progress_scope, progress_flag_shares
from .detect import ProgressThresholds, detect_all
from .load import goodput_for_job, hardware_clock, hardware_now

log = logging.getLogger(__name__)
SCOPE = "progress"
RECENT_S = 3600.0  # jobs whose progress moved in the last hour (and those with open progress flags)


@dataclass
class ProgressPass:
    jobs: int = 0
    opened: int = 0
    resolved: int = 0
    changed: list[int] = field(default_factory=list)  # jobs whose progress flags changed
    errors: list[str] = field(default_factory=list)


def store_progress_shares(conn: Connection, job_pk: int) -> int:
    """Set each progress flag's ``wasted_gpu_hours`` to its share of the job's stored ledger
    (``analysis.flag_shares``: the job-wide kinds their categories, a rank's flag 0); 0 for a
    job with no ledger yet (no telemetry analysed). Called by the progress pass and by the
    runner after it rewrites a job's ledger or hardware flags, so the two never disagree.
    Returns the flags changed."""
    t, lt = Flag.__table__, GpuLedgerMinute.__table__
    rows = list(conn.execute(select(t.c.id, t.c.kind, t.c.scope, t.c.wasted_gpu_hours).where(t.c.job_pk == job_pk)))
    if not any(is_progress_scope(r.scope) for r in rows):
        return 0
    totals = {str(c): float(v or 0.0) for c, v in conn.execute(
        select(lt.c.category, func.sum(lt.c.gpu_s)).where(lt.c.job_pk == job_pk).group_by(lt.c.category))}
    shares = progress_flag_shares(totals, ((r.kind, r.scope, r.wasted_gpu_hours) for r in rows))
    n = 0
    for r in rows:
        share = shares.get((r.kind, r.scope))
        if share is not None and (r.wasted_gpu_hours is None or abs(float(r.wasted_gpu_hours) - share) > 1e-9):
            conn.execute(t.update().where(t.c.id == r.id).values(wasted_gpu_hours=share))
            n += 1
    return n


def sync_job(conn: Connection, job_pk: int, now: float, th: ProgressThresholds | None = None) -> tuple[int, int]:
    """Open/update/resolve the job's progress flags; returns (opened, resolved)."""
    g, ws = goodput_for_job(conn, job_pk, now)
    found = (detect_all(ws, g, now, th, gpu_busy=hardware_now(conn, job_pk, ws),
                        clock_at=hardware_clock(conn, job_pk, ws)) if g is not None else [])
    reg = flag_kinds()
    t = Flag.__table__
    existing = {(r["kind"], r["scope"]): r for r in conn.execute(
        select(t).where(t.c.job_pk == job_pk, t.c.scope.like(f"{SCOPE}%"))).mappings()}
    opened = resolved = 0
    seen = set()
    for f in found:
        if f.kind not in FLAG_KINDS:
            continue
        key = (f.kind, f.scope)
        seen.add(key)
        values = {"severity": f.severity, "start_ts": f.start_ts, "end_ts": f.end_ts,
                  "evidence": f.evidence,
                  "suggestion": reg.get(f.kind).suggestion_with(f.evidence), "open": f.ongoing}
        old = existing.get(key)
        if old is None:
            conn.execute(t.insert().values(job_pk=job_pk, kind=f.kind, scope=f.scope, opened_at=now,
                                           resolved_at=None if f.ongoing else now, wasted_gpu_hours=0.0,
                                           **values))
            opened += 1
        else:
            upd = dict(values)
            if old["open"] and not f.ongoing:
                upd["resolved_at"] = now
                resolved += 1
            elif not old["open"] and f.ongoing:
                upd["opened_at"], upd["resolved_at"] = now, None
                opened += 1
            conn.execute(t.update().where(t.c.id == old["id"]).values(**upd))
    for key, old in existing.items():
        if key not in seen and old["open"]:
            conn.execute(t.update().where(t.c.id == old["id"]).values(open=False, resolved_at=now))
            resolved += 1
    store_progress_shares(conn, job_pk)  # the waste is the ledger's, not the detector's estimate
    return opened, resolved


def progress_jobs(conn: Connection, now: float) -> list[int]:
    """The jobs a progress pass looks at: progress in the last ``RECENT_S`` or an open progress
    flag (one to resolve), in pk order."""
    p, f = JobProgress.__table__, Flag.__table__
    recent = set(conn.execute(select(p.c.job_pk).where(p.c.end_ts >= now - RECENT_S).group_by(p.c.job_pk)).scalars())
    flagged = set(conn.execute(select(f.c.job_pk).where(f.c.open.is_(True), f.c.scope.like(f"{SCOPE}%"))
                               .group_by(f.c.job_pk)).scalars())
    return sorted(recent | flagged)


def run_progress_pass(engine: Engine, now: float, th: ProgressThresholds | None = None, *,
                      job_pks: Iterable[int] | None = None,
                      on_job_done: Callable[[int], None] | None = None) -> ProgressPass:
    """``job_pks`` (default: every job of ``progress_jobs``), one transaction per job;
    ``on_job_done(pk)`` after each job's commit (the sharded task refreshes its lock there)."""
    s = ProgressPass()
    if job_pks is None:
        with engine.connect() as conn:
            job_pks = progress_jobs(conn, now)
    for pk in job_pks:
        try:
            with engine.begin() as conn:
                o, r = sync_job(conn, pk, now, th)
            s.jobs += 1
            s.opened += o
            s.resolved += r
            if o or r:
                s.changed.append(pk)
        except Exception as e:  # one job's bad data must not stop the others' flags
            log.exception("progress analysis of job %s failed", pk)
            s.errors.append(f"job {pk}: {type(e).__name__}: {e}")
            continue
        if on_job_done is not None:
            on_job_done(pk)
    return s
