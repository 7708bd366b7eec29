"""Writes and reads of the serving tables (storage/serving_models.py); no judgement here."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, func, insert, or_, select
from sqlalchemy.engine import Connection

from gpufleet.storage.feature_models import gpu_minute_features as features
from gpufleet.storage.models import Allocation, Cluster, Gpu, Job, Node
from gpufleet.storage.serving_models import ServingDeploymentRow, ServingMinuteRow


@dataclass(frozen=True, slots=True)
class StoredMinute:
    cluster: str
    deployment: str
    replica: str
    minute: int
    engine: str
    node: str | None
    job_id: str | None
    gpus: int
    gpu_uuids: list[str] | None
    measures: dict[str, Any]


def write_minutes(conn: Connection, cluster: str, rows: Sequence[Mapping[str, Any]]) -> int:
    """Store replica-minutes (a minute written again replaces the stored one); returns the count."""
    if not rows:
        return 0
    keys = [(r["deployment"], r["replica"], int(r["minute"])) for r in rows]
    for i in range(0, len(keys), 200):
        part = keys[i:i + 200]
        conn.execute(delete(ServingMinuteRow).where(ServingMinuteRow.cluster == cluster, or_(*(
            and_(ServingMinuteRow.deployment == d, ServingMinuteRow.replica == r, ServingMinuteRow.minute == m)
            for d, r, m in part))))
    conn.execute(insert(ServingMinuteRow), [
        {"cluster": cluster, "deployment": r["deployment"], "replica": r["replica"], "minute": int(r["minute"]),
         "engine": r["engine"], "node": r.get("node"), "job_id": r.get("job_id"), "gpus": int(r["gpus"]),
         "gpu_uuids": r.get("gpu_uuids"), "measures": r["measures"]} for r in rows])
    return len(rows)


def job_gpus(conn: Connection, cluster: str, job_ids: Iterable[str], start: float,
             end: float) -> dict[str, list[tuple[str, str, float, float | None]]]:
    """The GPUs each job held at some time in [start, end): job id -> [(GPU uuid, node, allocation
    start, allocation end or None while open)], from the GPU -> job attribution (``allocations``)."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    j, a, g, n, c = Job.__table__, Allocation.__table__, Gpu.__table__, Node.__table__, Cluster.__table__
    out: dict[str, list[tuple[str, str, float, float | None]]] = {}
    for i in range(0, len(ids), 500):
        q = (select(j.c.job_id, g.c.uuid, n.c.name, a.c.start_ts, a.c.end_ts)
             .select_from(j.join(c, c.c.id == j.c.cluster_id).join(a, a.c.job_pk == j.c.id)
                          .join(g, g.c.id == a.c.gpu_pk).join(n, n.c.id == g.c.node_id))
             .where(c.c.name == cluster, j.c.job_id.in_(ids[i:i + 500]), a.c.start_ts < end,
                    or_(a.c.end_ts.is_(None), a.c.end_ts > start)))
        for job, uuid, node, t0, t1 in conn.execute(q):
            out.setdefault(job, []).append((uuid, node, float(t0), None if t1 is None else float(t1)))
    return out


def write_deployment_labels(conn: Connection, cluster: str, labels: Mapping[str, Mapping[str, str]],
                            now: float | None = None) -> None:
    """The SLO labels each deployment was last seen with."""
    ts = time.time() if now is None else now
    for name, lab in labels.items():
        conn.execute(delete(ServingDeploymentRow).where(ServingDeploymentRow.cluster == cluster,
                                                        ServingDeploymentRow.name == name))
        conn.execute(insert(ServingDeploymentRow).values(cluster=cluster, name=name, labels=dict(lab), updated_ts=ts))


def read_minutes(conn: Connection, start: int, end: int, cluster: str | None = None,
                 deployment: str | None = None) -> list[StoredMinute]:
    t = ServingMinuteRow.__table__
    q = select(t.c.cluster, t.c.deployment, t.c.replica, t.c.minute, t.c.engine, t.c.node, t.c.job_id, t.c.gpus,
               t.c.gpu_uuids, t.c.measures).where(t.c.minute >= start, t.c.minute < end)
    if cluster is not None:
        q = q.where(ServingMinuteRow.cluster == cluster)
    if deployment is not None:
        q = q.where(ServingMinuteRow.deployment == deployment)
    q = q.order_by(ServingMinuteRow.deployment, ServingMinuteRow.replica, ServingMinuteRow.minute)
    return [StoredMinute(c, d, r, int(m), e, n, j, int(g), u, ms)
            for c, d, r, m, e, n, j, g, u, ms in conn.execute(q).all()]


def deployment_names(conn: Connection, start: int, end: int, cluster: str | None = None) -> list[tuple[str, str]]:
    """(cluster, deployment) with any minute in [start, end)."""
    q = select(ServingMinuteRow.cluster, ServingMinuteRow.deployment).where(
        ServingMinuteRow.minute >= start, ServingMinuteRow.minute < end).group_by(
        ServingMinuteRow.cluster, ServingMinuteRow.deployment).order_by(ServingMinuteRow.deployment)
    if cluster is not None:
        q = q.where(ServingMinuteRow.cluster == cluster)
    return [(c, d) for c, d in conn.execute(q).all()]


def deployment_labels(conn: Connection, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    wanted = list(pairs)
    if not wanted:
        return {}
    t = ServingDeploymentRow.__table__
    rows = conn.execute(select(t.c.cluster, t.c.name, t.c.labels).where(or_(*(
        and_(t.c.cluster == c, t.c.name == n) for c, n in wanted)))).all()
    return {(c, n): dict(lab) for c, n, lab in rows}


def latest_minute(conn: Connection) -> int | None:
    v = conn.execute(select(func.max(ServingMinuteRow.minute))).scalar()
    return None if v is None else int(v)


def replica_activity(conn: Connection, cluster: str, job_ids: Iterable[str], start: int,
                     end: int) -> dict[tuple[str, int], dict[str, tuple[float | None, float | None]]]:
    """(job id, minute) -> {GPU uuid: (mean SM activity, mean NVML utilisation)} of the job's GPUs
    in that minute, from the minute features folded at ingest (storage/minute_features.py). A
    minute no GPU of the job reported is absent, and a signal a GPU did not report is None: the
    serving detectors read a replica's hardware side from this (unknown is not zero)."""
    wanted = sorted({j for j in job_ids if j})
    if not wanted:
        return {}
    sm = features.c.sm_sum / func.nullif(features.c.sm_n, 0)
    util = features.c.gpu_util_sum / func.nullif(features.c.gpu_util_n, 0)
    out: dict[tuple[str, int], dict[str, tuple[float | None, float | None]]] = {}
    for i in range(0, len(wanted), 500):
        q = (select(Job.job_id, features.c.bucket, Gpu.uuid, sm, util).select_from(features)
             .join(Job, Job.id == features.c.job_pk).join(Cluster, Cluster.id == Job.cluster_id)
             .join(Gpu, Gpu.id == features.c.gpu_pk)
             .where(Cluster.name == cluster, Job.job_id.in_(wanted[i:i + 500]),
                    features.c.bucket >= start, features.c.bucket < end))
        for job, bucket, uuid, s, u in conn.execute(q).all():
            out.setdefault((str(job), int(bucket)), {})[str(uuid)] = (
                None if s is None else float(s), None if u is None else float(u))
    return out
