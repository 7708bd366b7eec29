"""A node's history for its page: per-GPU series over a time range (downsampled in the database
from the 1-minute rollups, as the job series are) and the jobs that held its GPUs in that range."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.catalog import CATALOG
from gpufleet.storage.models import Allocation, Cluster, Gpu, Job, Node, gpu_samples_1m

from .common import BadRequest, now
from .timeseries import _agg, _bucket, _round, choose_step

NODE_FIELDS = ("sm_active", "power_w", "temp_c", "fb_used_bytes")
JOB_LIMIT = 100


def find_node(session: Session, cluster: str, name: str) -> Node | None:
    return session.execute(select(Node).join(Cluster, Cluster.id == Node.cluster_id)
                           .where(Cluster.name == cluster, Node.name == name)).scalar()


def node_timeseries(session: Session, node: Node, *, fields: list[str], step: str, start: float | None,
                    end: float | None) -> dict[str, Any]:
    """One array per GPU of the node per field, NaN (null in JSON) where nothing was measured;
    the range defaults to the last 24 hours up to the node's last sample (a start alone ends
    now), and starts at the node's first minute of data inside it."""
    gpus = list(session.execute(select(Gpu).where(Gpu.node_id == node.id).order_by(Gpu.index)).scalars())
    # A caller that names the start (the page's "-24h") means a range ending now; with no range
    # at all, the day up to the node's last sample (a node that went quiet still shows its end).
    t_end = end if end is not None else now() if start is not None else (node.last_seen or now())
    t_start = start if start is not None else t_end - 86400
    if gpus and t_end > t_start:
        # the axis starts at the node's first minute of data in the range, not hours of nothing
        # before a new node's agent started (the job series do the same)
        first = session.execute(select(func.min(gpu_samples_1m.c.bucket))
                                .where(gpu_samples_1m.c.gpu_pk.in_([g.id for g in gpus]),
                                       gpu_samples_1m.c.bucket >= t_start, gpu_samples_1m.c.bucket < t_end)).scalar()
        t_start = max(t_start, float(first)) if first is not None else t_start
    if t_end <= t_start:
        raise BadRequest("end must be after start")
    if t_end - t_start > 90 * 86400:
        raise BadRequest("at most 90 days per request")
    s = choose_step(t_end - t_start, step, max(1, len(gpus)) * len(fields))
    t0 = math.floor(t_start / s) * s
    n = max(1, math.ceil((t_end - t0) / s))
    pos = {g.id: i for i, g in enumerate(gpus)}
    series = {f: np.full((len(gpus), n), np.nan) for f in fields}
    if gpus:
        t = gpu_samples_1m
        b = _bucket(session, s, t.c.bucket).label("b")
        q = (select(t.c.gpu_pk, b, *(_agg(f, t.c[f], t.c.n).label(f) for f in fields))
             .where(t.c.gpu_pk.in_(list(pos)), t.c.bucket >= t0, t.c.bucket < t_end).group_by(t.c.gpu_pk, b))
        for r in session.execute(q):
            i = min(n - 1, max(0, int((float(r.b) - t0) // s)))
            for f in fields:
                v = r._mapping[f]
                if v is not None:
                    series[f][pos[r.gpu_pk], i] = float(v)
    return {"start": t0, "end": t_end, "step": s, "points": n,
            "fields": [{"name": f, "unit": CATALOG[f].unit, "description": CATALOG[f].description} for f in fields],
            "t": (t0 + s * np.arange(n, dtype=np.float64)).tolist(),
            "gpus": [{"uuid": g.uuid, "node": node.name, "index": g.index} for g in gpus],
            "series": {f: _round(f, a).tolist() for f, a in series.items()}}


def node_jobs(session: Session, node_id: int, since: float, *, limit: int = JOB_LIMIT) -> list[dict[str, Any]]:
    """Jobs that held one of the node's GPUs after ``since``, newest first, with the GPU indexes
    they held here."""
    a = Allocation
    q = (select(Job.job_id, Job.user, Job.name, Job.state, Cluster.name.label("cluster"),
                func.min(a.start_ts).label("start_ts"), func.max(func.coalesce(a.end_ts, 1e18)).label("end_ts"),
                func.count(func.distinct(a.gpu_pk)).label("gpus"))
         .join(Job, Job.id == a.job_pk).join(Cluster, Cluster.id == Job.cluster_id).join(Gpu, Gpu.id == a.gpu_pk)
         .where(Gpu.node_id == node_id, func.coalesce(a.end_ts, 1e18) >= since)
         .group_by(Job.id, Job.job_id, Job.user, Job.name, Job.state, Cluster.name)
         .order_by(func.min(a.start_ts).desc()).limit(limit))
    return [{"job_id": r.job_id, "cluster": r.cluster, "user": r.user, "name": r.name, "state": r.state,
             "start_ts": r.start_ts, "end_ts": None if r.end_ts >= 1e18 else r.end_ts, "gpus": int(r.gpus)}
            for r in session.execute(q)]
