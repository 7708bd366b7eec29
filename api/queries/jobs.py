"""Jobs: the filtered/sorted/paginated list and one job's detail (metadata, GPUs, report,
flags). A job without a report yet still gets live numbers computed from the rollups."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from sqlalchemy import distinct, exists, func, or_, select
from sqlalchemy.orm import Session

from gpufleet.storage.models import Allocation, Cluster, Flag, Gpu, Job, JobReport, Node, gpu_samples_1m, job_samples_1m

from .common import DEFAULT_CLUSTER, clean, live_values, now, rollup_mean
from .paginate import Keyset

JobSort = Literal["waste", "start", "gpus"]
SUMMARY_FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "power_w", "sm_clock_mhz")


def _gpu_counts() -> Any:
    return (select(Allocation.job_pk, func.count(distinct(Allocation.gpu_pk)).label("n_gpus"))
            .group_by(Allocation.job_pk).subquery("gpu_counts"))


def _stat(report: dict[str, Any] | None, field: str) -> float | None:
    try:
        return clean(float(report["stats"][field]["mean"]))  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None


def list_jobs(conn: Session, *, cluster: str | None = None, user: str | None = None, state: str | None = None,
              flag: str | None = None, since: float | None = None, until: float | None = None,
              sort: JobSort = "start", order: Literal["asc", "desc"] = "desc", limit: int = 50,
              cursor: str | None = None) -> dict[str, Any]:
    counts = _gpu_counts()
    waste = func.coalesce(JobReport.wasted_gpu_hours, 0.0)
    n_gpus = func.coalesce(counts.c.n_gpus, 0)
    start = func.coalesce(Job.start_ts, 0.0)
    key = {"waste": waste, "start": start, "gpus": n_gpus}[sort]

    conds: list[Any] = []
    if cluster:
        conds.append(Cluster.name == cluster)
    if user:
        conds.append(Job.user == user)
    if state:
        conds.append(Job.state == state)
    if flag:
        conds.append(exists().where(Flag.job_pk == Job.id, Flag.kind == flag))
    if since is not None:
        conds.append(or_(Job.end_ts.is_(None), Job.end_ts >= since))
    if until is not None:
        conds.append(or_(Job.start_ts.is_(None), Job.start_ts <= until))

    base = (select(Job.id).join(Cluster, Cluster.id == Job.cluster_id)
            .outerjoin(JobReport, JobReport.job_pk == Job.id).outerjoin(counts, counts.c.job_pk == Job.id)
            .where(*conds))
    total = conn.execute(select(func.count()).select_from(base.subquery())).scalar_one()

    q = (select(Job, Cluster.name.label("cluster"), key.label("sort_key"), n_gpus.label("n_gpus"),
                JobReport.wasted_gpu_hours, JobReport.goodput_score, JobReport.allocated_gpu_hours, JobReport.report)
         .join(Cluster, Cluster.id == Job.cluster_id)
         .outerjoin(JobReport, JobReport.job_pk == Job.id).outerjoin(counts, counts.c.job_pk == Job.id)
         .where(*conds))
    ks = Keyset(key, Job.id, (int, float), int, descending=order == "desc")
    rows, next_cursor = ks.page(conn.execute(ks.apply(q, cursor).limit(limit + 1)).all(), limit,
                                lambda r: [r.sort_key, r.Job.id])

    pks = [r.Job.id for r in rows]
    flags: dict[int, list[dict[str, Any]]] = {pk: [] for pk in pks}
    if pks:
        for f in conn.execute(select(Flag.job_pk, Flag.kind, Flag.severity, Flag.open, Flag.wasted_gpu_hours)
                              .where(Flag.job_pk.in_(pks)).order_by(Flag.wasted_gpu_hours.desc())):
            flags[f.job_pk].append({"kind": f.kind, "severity": f.severity, "open": bool(f.open),
                                    "wasted_gpu_hours": clean(f.wasted_gpu_hours)})
    data = []
    for r in rows:
        j: Job = r.Job
        data.append({
            **_job_meta(j, r.cluster),
            "n_gpus": int(r.n_gpus or 0),
            "allocated_gpu_hours": clean(r.allocated_gpu_hours),
            "wasted_gpu_hours": clean(r.wasted_gpu_hours),
            "goodput_score": clean(r.goodput_score),
            "sm_active_mean": _stat(r.report, "sm_active"),
            "tensor_active_mean": _stat(r.report, "tensor_active"),
            "flags": flags[j.id],
        })
    return {"data": data, "count": total, "next_cursor": next_cursor}


def _job_meta(j: Job, cluster: str) -> dict[str, Any]:
    return {
        "cluster": cluster, "job_id": j.job_id, "name": j.name, "user": j.user, "account": j.account,
        "partition": j.partition, "namespace": j.namespace, "source": j.source, "state": j.state,
        "start_ts": j.start_ts, "end_ts": j.end_ts, "last_sample_ts": j.last_sample_ts,
        "num_nodes": j.num_nodes,
    }


def find_job(conn: Session, cluster: str, job_id: str) -> tuple[Job, str] | None:
    row = conn.execute(select(Job).join(Cluster, Cluster.id == Job.cluster_id)
                       .where(Cluster.name == (cluster or DEFAULT_CLUSTER), Job.job_id == job_id)).first()
    return (row[0], cluster or DEFAULT_CLUSTER) if row else None


def job_gpus(conn: Session, job: Job) -> list[dict[str, Any]]:
    """One entry per GPU the job held (earliest start, latest end over its allocations)."""
    q = (select(Gpu.id, Gpu.uuid, Gpu.index, Gpu.model, Gpu.memory_total_bytes, Node.name.label("node"),
                func.min(Allocation.start_ts).label("start_ts"),
                func.max(func.coalesce(Allocation.end_ts, 1e18)).label("end_ts"))
         .join(Gpu, Gpu.id == Allocation.gpu_pk).join(Node, Node.id == Gpu.node_id)
         .where(Allocation.job_pk == job.id)
         .group_by(Gpu.id, Gpu.uuid, Gpu.index, Gpu.model, Gpu.memory_total_bytes, Node.name)
         .order_by(Node.name, Gpu.index))
    out = []
    for r in conn.execute(q):
        end = None if r.end_ts >= 1e17 else r.end_ts
        out.append({"gpu_pk": r.id, "uuid": r.uuid, "index": r.index, "model": r.model, "node": r.node,
                    "memory_total_bytes": r.memory_total_bytes, "start_ts": r.start_ts, "end_ts": end})
    return out


def _live_summary(conn: Session, job: Job) -> dict[str, Any]:
    t = job_samples_1m
    row = conn.execute(select(*(rollup_mean(t.c[f], t.c.n).label(f) for f in SUMMARY_FIELDS),
                              func.max(t.c.bucket).label("last"))
                       .where(t.c.job_pk == job.id)).mappings().one()
    return {f"{f}_mean": clean(row[f]) for f in SUMMARY_FIELDS}


def _per_gpu_live(conn: Session, job: Job, gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    t = gpu_samples_1m
    q = (select(t.c.gpu_pk, *(rollup_mean(t.c[f], t.c.n).label(f"{f}_mean") for f in
                              ("sm_active", "tensor_active", "dram_active", "power_w", "sm_clock_mhz")),
                func.max(t.c.fb_used_bytes).label("fb_used_bytes_max"))
         .where(t.c.job_pk == job.id).group_by(t.c.gpu_pk))
    stats = {r["gpu_pk"]: r for r in conn.execute(q).mappings()}
    out = []
    for g in gpus:
        s: Mapping[Any, Any] = stats.get(g["gpu_pk"], {})  # a RowMapping (str or Column keys), or none
        out.append({"gpu_uuid": g["uuid"], "node": g["node"], "index": g["index"],
                    **{k: clean(s.get(k)) for k in ("sm_active_mean", "tensor_active_mean", "dram_active_mean",
                                                    "power_w_mean", "sm_clock_mhz_mean", "fb_used_bytes_max")}})
    return out


def flag_dict(f: Flag) -> dict[str, Any]:
    return {"id": f.id, "kind": f.kind, "scope": f.scope, "severity": f.severity, "open": bool(f.open),
            "start_ts": f.start_ts, "end_ts": f.end_ts, "wasted_gpu_hours": clean(f.wasted_gpu_hours),
            "evidence": f.evidence or {}, "suggestion": f.suggestion, "opened_at": f.opened_at,
            "resolved_at": f.resolved_at}


def job_detail(conn: Session, job: Job, cluster: str) -> dict[str, Any]:
    gpus = job_gpus(conn, job)
    rep = conn.execute(select(JobReport).where(JobReport.job_pk == job.id)).scalar()
    report: dict[str, Any] | None = rep.report if rep is not None else None
    t_now = now()
    alloc_hours = sum(((g["end_ts"] or job.end_ts or t_now) - g["start_ts"]) / 3600.0 for g in gpus if g["start_ts"])
    live = _live_summary(conn, job)
    summary: dict[str, Any] = {
        "source": "report" if report else "live",
        "allocated_gpu_hours": clean(rep.allocated_gpu_hours if rep else alloc_hours),
        "wasted_gpu_hours": clean(rep.wasted_gpu_hours) if rep else None,
        "goodput_score": clean(rep.goodput_score) if rep else None,
        "active_gpu_hours": clean(report.get("active_gpu_hours")) if report else None,
        "mfu_estimate": clean((report.get("mfu") or {}).get("estimate")) if report else None,
        "analyzed_until": rep.analyzed_until if rep else None,
        **live,
    }
    if report:
        for f in ("sm_active", "sm_occupancy", "tensor_active", "dram_active"):
            v = _stat(report, f)
            if v is not None:
                summary[f"{f}_mean"] = v
    per_gpu: list[dict[str, Any]] = (report["per_gpu"] if report and report.get("per_gpu")
                                     else _per_gpu_live(conn, job, gpus))
    per_gpu = sorted(per_gpu, key=lambda g: (str(g.get("node") or ""), g.get("index") if isinstance(g.get("index"), int)
                                             else 1 << 30, str(g.get("gpu_uuid"))))
    current = live_values(conn, [g["gpu_pk"] for g in gpus]) if job.state != "ended" else {}
    flags = [flag_dict(f) for f in conn.execute(select(Flag).where(Flag.job_pk == job.id)
                                                  .order_by(Flag.open.desc(), Flag.wasted_gpu_hours.desc())).scalars()]
    return {
        **_job_meta(job, cluster),
        "labels": job.labels or {},
        "n_gpus": len(gpus),
        "nodes": sorted({g["node"] for g in gpus}),
        "gpus": [{**{k: v for k, v in g.items() if k != "gpu_pk"}, "current": current.get(g["gpu_pk"])} for g in gpus],
        "summary": summary,
        "report": report,
        "per_gpu": per_gpu,
        "flags": flags,
    }
