"""The GPU-time ledger's reads: one job's ledger, and the fleet's over a time range grouped by
cause, user, account, team or cluster. Both only sum the stored rows (``gpu_ledger``, folded
per job-minute at analysis time), so every group adds up to the fleet total (docs/goodput.md,
"The ledger"; response shapes in docs/api.md, "Ledger")."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.analysis.flag_shares import progress_flag_shares, serving_flag_shares
from gpufleet.analysis.ledger import PRODUCTIVE, UNOBSERVED, add_totals, categories, summary
from gpufleet.analysis.serving.flags import serving_jobs
from gpufleet.settings import CostSettings
from gpufleet.storage.gpu_ledger import GpuLedgerMinute
from gpufleet.storage.models import Cluster, Flag, Job, JobReport

from .common import BadRequest

GROUPS = ("cause", "job", "user", "account", "team", "cluster")
MAX_RANGE_S = 366 * 86400


def _priced(secs_by_cluster: dict[str, float], cost: CostSettings) -> float | None:
    """GPU-seconds at each cluster's own GPU-hour price; None when a cluster has no price."""
    total = 0.0
    for cl, secs in secs_by_cluster.items():
        price = cost.price(cl)
        if price is None:
            return None
        total += secs / 3600 * price
    return round(total, 2)


def _cost(totals_by_cluster: dict[str, dict[str, float]], cost: CostSettings) -> tuple[float | None, float | None]:
    """(wasted cost, allocated cost)."""
    wasted = {cl: sum(v for k, v in t.items() if k not in (PRODUCTIVE, UNOBSERVED))
              for cl, t in totals_by_cluster.items()}
    return (_priced(wasted, cost),
            _priced({cl: sum(t.values()) for cl, t in totals_by_cluster.items()}, cost))


def _summary(by_cluster: dict[str, dict[str, float]], cost: CostSettings, **kw: Any) -> dict[str, Any]:
    out = summary(add_totals(by_cluster.values()), **kw)
    out["cost"], out["allocated_cost"] = _cost(by_cluster, cost) if by_cluster else (None, None)
    return out


def job_ledger(session: Session, job: Job, cluster: str, cost: CostSettings, step_s: int = 60) -> dict[str, Any]:
    """``GET /api/v1/jobs/{id}/ledger``; the series in buckets of ``step_s`` (a multiple of 60:
    each bucket the sum of its minutes' GPU-seconds)."""
    if step_s < 60 or step_s % 60:
        raise BadRequest(f"step={step_s}: a multiple of 60 seconds")
    per = step_s // 60
    t = GpuLedgerMinute.__table__
    rows = session.execute(select(t.c.minute, t.c.category, t.c.gpu_s).where(t.c.job_pk == job.id)
                           .order_by(t.c.minute)).all()
    rep = session.execute(select(JobReport.report).where(JobReport.job_pk == job.id)).scalar_one_or_none() or {}
    led = rep.get("ledger") or {}
    totals: dict[str, float] = defaultdict(float)
    minutes: list[int] = []
    series: dict[str, list[float]] = {}
    for m, cat, secs in rows:
        totals[cat] += secs
        b = int(m) // per * per
        if not minutes or minutes[-1] != b:
            minutes.append(b)
            for v in series.values():
                v.append(0.0)
        col = series.setdefault(cat, [0.0] * len(minutes))
        col[-1] = round(col[-1] + float(secs), 3)
    out = _summary({cluster: dict(totals)}, cost, failures=int(led.get("failures") or 0),
                   wall_s=float(led.get("wall_hours") or 0.0) * 3600)
    rows_f = list(session.execute(select(Flag).where(Flag.job_pk == job.id).order_by(Flag.id)).scalars())
    # A progress or serving flag's share (analysis/flag_shares.py): what the runner and the progress
    # and serving passes store in flags.wasted_gpu_hours, derived here from the same rows; a
    # hardware flag's is the fold's.
    shares = progress_flag_shares(totals, ((f.kind, f.scope, f.wasted_gpu_hours) for f in rows_f))
    # A serving flag's: its kind's seconds in its episode's minutes (what the runner and the serving pass store).
    shares.update(serving_flag_shares(((int(m), str(c), float(v)) for m, c, v in rows),
                                      ((f.kind, f.scope, float(f.start_ts or 0.0), float(f.end_ts or 0.0))
                                       for f in rows_f)))
    flags = [{"kind": f.kind, "scope": f.scope, "severity": f.severity, "open": bool(f.open),
              "wasted_gpu_hours": round(shares.get((f.kind, f.scope), float(f.wasted_gpu_hours or 0.0)), 4)}
             for f in rows_f]
    win = rep.get("window") or {}
    return {"job_id": job.job_id, "cluster": cluster, "analyzed": bool(rep),
            "window": {"start": win.get("start", job.start_ts), "end": win.get("end", job.end_ts)},
            "currency": cost.currency, "price_per_gpu_hour": cost.price(cluster), **out,
            "progress": bool(led.get("progress")), "flags": flags, "by_gpu": led.get("by_gpu") or [],
            "minutes": {"t": [m * 60 for m in minutes], "step": step_s, "gpu_s": series}}


def _fleet_rows(session: Session, start: float, end: float, cluster: str | None) -> tuple[
        dict[int, dict[str, float]], dict[int, tuple[str | None, str | None, str | None, str]], dict[int, str],
        dict[str, dict[str, float]]]:
    """The stored rows of minutes in [start, end) summed per job (in pk order), each job's
    (user, account, team, cluster) and id, and the fleet's totals per cluster."""
    m0, m1 = math.floor(start / 60), math.ceil(end / 60)
    t = GpuLedgerMinute.__table__
    q = (select(t.c.job_pk, t.c.category, func.sum(t.c.gpu_s))
         .where(t.c.minute >= m0, t.c.minute < m1).group_by(t.c.job_pk, t.c.category)
         .order_by(t.c.job_pk, t.c.category))
    if cluster:
        q = q.join(Job, Job.id == t.c.job_pk).join(Cluster, Cluster.id == Job.cluster_id).where(
            Cluster.name == cluster)
    per_job: dict[int, dict[str, float]] = defaultdict(dict)
    for pk, cat, secs in session.execute(q):
        per_job[int(pk)][str(cat)] = float(secs or 0.0)
    info: dict[int, tuple[str | None, str | None, str | None, str]] = {}
    job_ids: dict[int, str] = {}
    pks = sorted(per_job)
    for i in range(0, len(pks), 1000):
        for pk, job_id, user, account, labels, cl in session.execute(
                select(Job.id, Job.job_id, Job.user, Job.account, Job.labels, Cluster.name)
                .join(Cluster, Cluster.id == Job.cluster_id).where(Job.id.in_(pks[i:i + 1000]))):
            team = labels.get("team") if isinstance(labels, dict) else None
            info[int(pk)] = (user, account, str(team) if team is not None else None, str(cl))
            job_ids[int(pk)] = str(job_id)
    fleet: dict[str, dict[str, float]] = defaultdict(dict)  # cluster -> totals
    for pk, tot in per_job.items():
        _merge(fleet[info.get(pk, (None, None, None, "?"))[3]], tot)
    return per_job, info, job_ids, dict(fleet)


def _waste(totals: dict[str, float]) -> tuple[dict[str, Any], dict[str, float]]:
    out = summary(totals)
    return out, {k: v for k, v in out["categories"].items() if k not in (PRODUCTIVE, UNOBSERVED)}


def fleet_waste(session: Session, *, start: float, end: float, cluster: str | None
                ) -> tuple[dict[str, float], float, list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Wasted GPU-hours over [start, end) by cause, in total, per user (most wasted first) and
    per workload: the numbers of ``GET /api/v1/fleet/ledger`` for the same range (its
    ``total.categories`` less productive and unobserved, ``total.wasted_gpu_hours``, and
    ``group_by=user``'s groups), for the fleet summary, so its users add up to its total.
    Workloads: ``serving`` (the jobs with a serving replica-minute in the range) and
    ``training`` (every other job); each with its jobs, allocated and wasted GPU-hours by cause,
    adding up to the total."""
    per_job, info, _, fleet = _fleet_rows(session, start, end, cluster)
    out, by_cause = _waste(add_totals(fleet.values()))
    per_user: dict[str | None, list[dict[str, float]]] = defaultdict(list)
    for pk, tot in per_job.items():
        per_user[info.get(pk, (None, None, None, "?"))[0]].append(tot)
    users = []
    for user, tots in per_user.items():
        u = summary(add_totals(tots))
        users.append({"user": user, "wasted_gpu_hours": u["wasted_gpu_hours"],
                      "allocated_gpu_hours": u["allocated_gpu_hours"], "jobs": len(tots)})
    users.sort(key=lambda u: (-float(u["wasted_gpu_hours"] or 0.0), str(u["user"])))
    replicas = set(serving_jobs(session, start, end, cluster)) & set(per_job)
    workloads: dict[str, dict[str, Any]] = {}
    for name, pks in (("training", [pk for pk in per_job if pk not in replicas]), ("serving", sorted(replicas))):
        w, causes = _waste(add_totals(per_job[pk] for pk in pks))
        workloads[name] = {"jobs": len(pks), "allocated_gpu_hours": w["allocated_gpu_hours"],
                           "productive_gpu_hours": w["productive_gpu_hours"],
                           "wasted_gpu_hours_total": w["wasted_gpu_hours"], "wasted_gpu_hours": causes}
    return by_cause, float(out["wasted_gpu_hours"]), users, workloads


def fleet_ledger(session: Session, *, group_by: str, start: float, end: float, cluster: str | None,
                 cost: CostSettings, limit: int | None = None) -> dict[str, Any]:
    """``GET /api/v1/fleet/ledger``: the stored ledger rows of minutes in [start, end), by job,
    then summed per group (the job itself, its user, account, label ``team``, cluster; or per
    category). ``limit``: the most wasteful groups only, the rest summed in ``omitted``."""
    if group_by not in GROUPS:
        raise BadRequest(f"group_by={group_by!r}: one of {', '.join(GROUPS)}")
    if not end > start or end - start > MAX_RANGE_S:
        raise BadRequest(f"start..end: end must be after start, at most {MAX_RANGE_S // 86400} days")
    m0, m1 = math.floor(start / 60), math.ceil(end / 60)
    per_job, info, job_ids, fleet = _fleet_rows(session, start, end, cluster)
    groups: dict[Any, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    jobs_in: dict[Any, int] = defaultdict(int)
    for pk, tot in per_job.items():
        user, account, team, cl = info.get(pk, (None, None, None, "?"))
        if group_by == "cause":
            continue
        key = pk if group_by == "job" else {"user": user, "account": account, "team": team, "cluster": cl}[group_by]
        _merge(groups[key][cl], tot)
        jobs_in[key] += 1
    total = _summary(dict(fleet), cost)
    total["jobs"] = len(per_job)
    if group_by == "cause":
        allocated = total["allocated_gpu_hours"]
        observed = total["observed_gpu_hours"]
        kinds = {c["name"]: c["kind"] for c in categories().as_json()}
        rows = []
        for cat, hours in total["categories"].items():
            kind = kinds.get(cat, "badput")
            rows.append({"key": cat, "kind": kind, "gpu_hours": hours,
                         "share_of_allocated": round(hours / allocated, 4) if allocated else None,
                         "share_of_observed": (round(hours / observed, 4) if observed and kind != "unobserved"
                                               else None),
                         "cost": _priced({cl: v.get(cat, 0.0) for cl, v in fleet.items()}, cost)})
        out_groups: list[dict[str, Any]] = rows
    else:
        ranked = []
        for key, per_cl in groups.items():
            g: dict[str, Any] = {"key": key, "jobs": jobs_in[key], **_summary(dict(per_cl), cost)}
            if group_by == "job":
                user, account, team, cl = info.get(key, (None, None, None, "?"))
                g.update(key=job_ids.get(key, str(key)), cluster=cl, user=user, account=account, team=team)
            ranked.append((g, key))
        ranked.sort(key=lambda gk: (-gk[0]["wasted_gpu_hours"], str(gk[0]["key"])))
        out_groups = [g for g, _ in ranked]
    omitted = None
    if limit is not None and group_by != "cause" and len(out_groups) > limit:
        # The rest, summed: the groups shown plus omitted still add up to total.
        rest: dict[str, dict[str, float]] = defaultdict(dict)
        for _, key in ranked[limit:]:
            for cl, tot in groups[key].items():
                _merge(rest[cl], tot)
        omitted = {"groups": len(ranked) - limit, "jobs": sum(jobs_in[k] for _, k in ranked[limit:]),
                   **_summary(dict(rest), cost)}
        out_groups = out_groups[:limit]
    return {"start": start, "end": end, "minutes": [m0 * 60, m1 * 60], "group_by": group_by, "cluster": cluster,
            "currency": cost.currency, "price_per_gpu_hour": cost.price(cluster) if cluster else cost.gpu_hour_price,
            "total": total, "groups": out_groups, "omitted": omitted, "categories": categories().as_json()}


def _merge(into: dict[str, float], add: dict[str, float]) -> None:
    for k, v in add.items():
        into[k] = into.get(k, 0.0) + v
