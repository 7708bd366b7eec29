"""Writes and reads of the serving tables (storage/serving_models.py); no judgement here."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, func, insert, or_, select
from sqlalchemy.engine import Connection

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
