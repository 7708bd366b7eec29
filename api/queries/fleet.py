"""Fleet summary (activity, wasted GPU-hours by cause, top wasting jobs and users) and flags."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from sqlalchemy import case, func, or_, select, tuple_
from sqlalchemy.orm import Session

from gpufleet.storage.models import Allocation, Cluster, Flag, Gpu, Job, JobReport, Node, gpu_samples_1m

from .common import BadRequest, clean, decode_cursor, encode_cursor, live_values, now
from .jobs import flag_dict
from .ledger import fleet_waste

TOP_N = 10


class TTLCache:
    """A tiny per-app cache of expensive aggregates (kept on ``app.state``, never global)."""

    def __init__(self, ttl_s: float = 60.0, max_entries: int = 64) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._data: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: Any, compute: Callable[[], Any]) -> Any:
        t = time.monotonic()
        with self._lock:
            hit = self._data.get(key)
            if hit is not None and t - hit[0] < self.ttl_s:
                return hit[1]
        value = compute()  # outside the lock: a slow query must not block other keys
        with self._lock:
            if len(self._data) >= self.max_entries:
                self._data.clear()
            self._data[key] = (t, value)
        return value


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def fleet_summary(session: Session, *, window_s: float, cluster: str | None = None,
                  cache: TTLCache | None = None) -> dict[str, Any]:
    t_end = now()
    since = t_end - window_s
    node_conds = [Cluster.name == cluster] if cluster else []
    gpu_q = (select(Gpu.id).join(Node, Node.id == Gpu.node_id).join(Cluster, Cluster.id == Node.cluster_id)
             .where(*node_conds))
    gpu_pks = list(session.execute(gpu_q).scalars())
    n_nodes = session.execute(select(func.count(Node.id)).join(Cluster, Cluster.id == Node.cluster_id)
                              .where(*node_conds)).scalar_one()
    live = live_values(session, gpu_pks, t_end)
    busy = session.execute(select(func.count(func.distinct(Allocation.gpu_pk)))
                           .where(Allocation.end_ts.is_(None), Allocation.gpu_pk.in_(gpu_q.scalar_subquery()))
                           ).scalar_one()

    def mean(key: str) -> float | None:
        vals = [v[key] for v in live.values() if v.get(key) is not None]
        return clean(sum(vals) / len(vals)) if vals else None

    # Window activity: one pass over the window's GPU-minutes (the rollup, never raw samples).
    # That pass reads every GPU-minute of the window (1.44 M rows for 1,000 GPUs x 24 h, ~0.3 s
    # on PostgreSQL), so it is shared through ``cache`` for a minute: a 24 h mean moves little
    # in a minute, while the live numbers and waste below are always fresh.
    def window_activity() -> tuple[Any, ...]:
        t = gpu_samples_1m
        wq = select(func.avg(t.c.sm_active), func.avg(t.c.tensor_active), func.count()).where(t.c.bucket >= since)
        if cluster:
            wq = wq.where(t.c.gpu_pk.in_(gpu_q.scalar_subquery()))
        return tuple(session.execute(wq).one())

    key = ("window", cluster, round(window_s))
    w_sm, w_tensor, w_minutes = cache.get(key, window_activity) if cache else window_activity()

    # Waste by cause: the stored ledger's minutes inside the window, the numbers of
    # GET /api/v1/fleet/ledger for the same range (a flag's span says nothing of its minutes).
    by_cause, wasted_total, ledger_users, by_workload = fleet_waste(session, start=since, end=t_end, cluster=cluster)
    fq = (select(Flag.severity).join(Job, Job.id == Flag.job_pk).join(Cluster, Cluster.id == Job.cluster_id)
          .where(Flag.open.is_(True)))
    if cluster:
        fq = fq.where(Cluster.name == cluster)
    open_by_sev: dict[str, int] = defaultdict(int)
    for sev in session.execute(fq).scalars():
        open_by_sev[sev] += 1

    jq = (select(Job.job_id, Job.user, Job.name, Job.state, Cluster.name.label("cluster"), JobReport.wasted_gpu_hours,
                 JobReport.allocated_gpu_hours, JobReport.goodput_score)
          .join(JobReport, JobReport.job_pk == Job.id).join(Cluster, Cluster.id == Job.cluster_id)
          .where(or_(Job.end_ts.is_(None), Job.end_ts >= since)))
    if cluster:
        jq = jq.where(Cluster.name == cluster)
    top_jobs = [{"cluster": r.cluster, "job_id": r.job_id, "user": r.user, "name": r.name, "state": r.state,
                 "wasted_gpu_hours": clean(r.wasted_gpu_hours), "allocated_gpu_hours": clean(r.allocated_gpu_hours),
                 "goodput_score": clean(r.goodput_score)}
                for r in session.execute(jq.order_by(JobReport.wasted_gpu_hours.desc()).limit(TOP_N))]
    uq = (select(Job.user, func.sum(JobReport.wasted_gpu_hours).label("wasted"),
                 func.sum(JobReport.allocated_gpu_hours).label("allocated"), func.count().label("jobs"))
          .join(JobReport, JobReport.job_pk == Job.id).join(Cluster, Cluster.id == Job.cluster_id)
          .where(or_(Job.end_ts.is_(None), Job.end_ts >= since)).group_by(Job.user))
    if cluster:
        uq = uq.where(Cluster.name == cluster)
    # Users from the ledger's minutes in the window, so they add up to wasted_gpu_hours_total;
    # the reports' lifetime totals only where no ledger holds time yet (jobs analysed before 0015).
    top_users = ledger_users[:TOP_N] if ledger_users else [
        {"user": r.user, "wasted_gpu_hours": clean(r.wasted), "allocated_gpu_hours": clean(r.allocated),
         "jobs": int(r.jobs)}
        for r in session.execute(uq.order_by(func.sum(JobReport.wasted_gpu_hours).desc()).limit(TOP_N))]
    # The denominator of the waste: GPU-hours allocated to jobs inside the window (an open
    # allocation runs to now), so "7.0 wasted" reads "7.0 of 102.4 allocated GPU-h".
    aq = (select(Allocation.start_ts, Allocation.end_ts)
          .where(or_(Allocation.end_ts.is_(None), Allocation.end_ts >= since), Allocation.start_ts <= t_end))
    if cluster:
        aq = aq.where(Allocation.gpu_pk.in_(gpu_q.scalar_subquery()))
    allocated_s = sum(_overlap(a.start_ts, t_end if a.end_ts is None else a.end_ts, since, t_end)
                      for a in session.execute(aq))
    return {
        "window_s": window_s, "start": since, "end": t_end,
        "allocated_gpu_hours": clean(allocated_s / 3600),
        "nodes": int(n_nodes), "gpus": len(gpu_pks), "gpus_reporting": len(live), "gpus_allocated": int(busy),
        "current": {"sm_active": mean("sm_active"), "tensor_active": mean("tensor_active"),
                    "dram_active": mean("dram_active"), "power_w": mean("power_w")},
        "window": {"sm_active": clean(w_sm), "tensor_active": clean(w_tensor),
                   "gpu_hours": clean((w_minutes or 0) / 60)},
        "wasted_gpu_hours": {k: clean(v) for k, v in sorted(by_cause.items(), key=lambda kv: -kv[1])},
        "wasted_gpu_hours_total": clean(wasted_total),
        "wasted_by_workload": by_workload,
        "open_flags": dict(open_by_sev),
        "top_jobs": top_jobs,
        "top_users": top_users,
    }


# Severity is not waste: a critical fault that claims no GPU-hours still comes first.
SEVERITY_ORDER = case({"critical": 2, "warning": 1, "info": 0}, value=Flag.severity, else_=-1)


def list_flags(session: Session, *, open_: bool | None, kind: str | None, severity: str | None,
               cluster: str | None, limit: int, cursor: str | None, sort: str = "severity") -> dict[str, Any]:
    """Flags, most severe first and most wasteful within a severity (``sort="waste"``: by waste
    alone). Keyset-paginated on (severity, waste, id), all descending."""
    conds: list[Any] = []
    if open_ is not None:
        conds.append(Flag.open.is_(open_))
    if kind:
        conds.append(Flag.kind == kind)
    if severity:
        conds.append(Flag.severity == severity)
    if cluster:
        conds.append(Cluster.name == cluster)
    base = (select(Flag, Job.job_id, Job.user, Job.name.label("job_name"), Cluster.name.label("cluster"),
                   SEVERITY_ORDER.label("sev"))
            .join(Job, Job.id == Flag.job_pk).join(Cluster, Cluster.id == Job.cluster_id).where(*conds))
    total = session.execute(select(func.count()).select_from(base.with_only_columns(Flag.id).subquery())).scalar_one()
    keys = [SEVERITY_ORDER, Flag.wasted_gpu_hours, Flag.id] if sort == "severity" else [Flag.wasted_gpu_hours, Flag.id]
    after = decode_cursor(cursor, len(keys))
    q = base
    if after is not None:
        if not all(isinstance(v, int | float) for v in after):
            raise BadRequest("cursor is not one this API issued")
        q = q.where(tuple_(*keys) < tuple_(*after))
    rows = session.execute(q.order_by(*(k.desc() for k in keys)).limit(limit + 1)).all()
    page = rows[:limit]
    last = page[-1] if page else None
    nxt = None
    if len(rows) > limit and last is not None:
        vals = [last.sev, last.Flag.wasted_gpu_hours, last.Flag.id]
        nxt = encode_cursor(vals if sort == "severity" else vals[1:])
    data = [{**flag_dict(r.Flag), "cluster": r.cluster, "job_id": r.job_id, "user": r.user, "job_name": r.job_name}
            for r in page]
    return {"data": data, "count": total, "next_cursor": nxt}


__all__ = ["fleet_summary", "list_flags", "live_values"]
