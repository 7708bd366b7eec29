"""What the job page draws beside its series (docs/web.md): the health events of the job's GPUs
while the job held them (markers on the shared timeline), the capacities its charts draw as
lines (NVLink and InfiniBand per direction, the model's top SM clock, from the analysis'
per-model limits), the clock-event-reason bits it decodes, and the previous runs of the job's
name that the page can compare it with."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, null, select
from sqlalchemy.orm import Session

from gpufleet.analysis.config import load_thresholds
from gpufleet.storage.models import Allocation, Event, Gpu, Job, JobReport, Node

from .jobs import job_gpus
from .nodes import OTHER_BITS, THROTTLE_BITS

EVENT_LIMIT = 500  # markers on one timeline; more would be a solid bar, the node page lists them all


def job_events(session: Session, job: Job) -> list[dict[str, Any]]:
    """Events on the job's GPUs inside each GPU's allocation, oldest first. An event with no GPU
    (node-wide) counts when it falls inside the job's span on one of its nodes."""
    a, g, n, e = Allocation.__table__, Gpu.__table__, Node.__table__, Event.__table__
    open_end = func.coalesce(a.c.end_ts, 1e18)
    per_gpu = (select(e.c.ts, e.c.kind, e.c.code, e.c.message, g.c.uuid, g.c.index, n.c.name)
               .select_from(e.join(a, a.c.gpu_pk == e.c.gpu_pk).join(g, g.c.id == e.c.gpu_pk)
                            .join(n, n.c.id == e.c.node_id))
               .where(a.c.job_pk == job.id, e.c.ts >= a.c.start_ts, e.c.ts < open_end))
    nodes = select(g.c.node_id).select_from(a.join(g, g.c.id == a.c.gpu_pk)).where(a.c.job_pk == job.id)
    end = job.end_ts if job.end_ts is not None else 1e18
    node_wide = (select(e.c.ts, e.c.kind, e.c.code, e.c.message, null(), null(), n.c.name)
                 .select_from(e.join(n, n.c.id == e.c.node_id))
                 .where(e.c.gpu_pk.is_(None), e.c.node_id.in_(nodes), e.c.ts >= (job.start_ts or 0.0), e.c.ts < end))
    rows = session.execute(per_gpu.union_all(node_wide).order_by("ts").limit(EVENT_LIMIT)).all()
    return [{"ts": r[0], "kind": r[1], "code": r[2], "message": r[3], "gpu_uuid": r[4], "gpu_index": r[5],
             "node": r[6]} for r in rows]


def chart_limits(session: Session, job: Job) -> dict[str, Any]:
    """Per-direction link capacities and the top SM clock of the job's GPU model, as the
    detectors assume them (analysis/thresholds.toml ``[models]``); 0 = the model has no such link."""
    models = sorted({g["model"] for g in job_gpus(session, job) if g["model"]})
    lim = load_thresholds().model(models[0] if models else None)
    return {"model": models[0] if models else None, "nvlink_bytes_s": lim.nvlink_bytes_s or None,
            "ib_bytes_s": lim.ib_bytes_s or None, "max_sm_clock_mhz": lim.max_sm_clock_mhz}


def reason_bits() -> dict[str, dict[str, str]]:
    """nvmlClocksEventReasons bits by value: the ones that slow a GPU down, and the others."""
    return {"throttle": {str(b): name for b, name in THROTTLE_BITS.items()},
            "other": {str(b): name for b, name in OTHER_BITS.items()}}


def job_timeline(session: Session, job: Job) -> dict[str, Any]:
    return {"events": job_events(session, job), "limits": chart_limits(session, job), "reason_bits": reason_bits()}


def previous_runs(session: Session, job: Job, cluster: str, *, limit: int) -> list[dict[str, Any]]:
    """Jobs of the same name and cluster that started before this one, newest first, with their
    report's score and waste (None when not analysed: unknown, not zero)."""
    if not job.name:
        return []
    n_gpus = (select(func.count(func.distinct(Allocation.gpu_pk))).where(Allocation.job_pk == Job.id)
              .correlate(Job).scalar_subquery())
    q = (select(Job.job_id, Job.user, Job.state, Job.start_ts, Job.end_ts, n_gpus.label("n_gpus"),
                JobReport.goodput_score, JobReport.wasted_gpu_hours, JobReport.allocated_gpu_hours)
         .outerjoin(JobReport, JobReport.job_pk == Job.id)
         .where(Job.cluster_id == job.cluster_id, Job.name == job.name, Job.id != job.id)
         .order_by(Job.start_ts.desc()).limit(limit))
    if job.start_ts is not None:
        q = q.where(Job.start_ts < job.start_ts)
    return [{"job_id": r.job_id, "cluster": cluster, "user": r.user, "state": r.state, "start_ts": r.start_ts,
             "end_ts": r.end_ts, "n_gpus": r.n_gpus, "goodput_score": r.goodput_score,
             "wasted_gpu_hours": r.wasted_gpu_hours, "allocated_gpu_hours": r.allocated_gpu_hours}
            for r in session.execute(q)]
