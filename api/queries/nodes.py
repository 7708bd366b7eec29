"""Nodes and GPUs: current state (newest rollup), what runs there, health events, throttling."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.storage.models import Allocation, Cluster, Event, Flag, Gpu, Job, Node, gpu_samples_1m

from .common import clean, live_values, now
from .node_history import node_jobs
from .paginate import Keyset

# nvmlClocksEventReasons bits that mean the GPU was slowed down (not idle/app-clock settings).
THROTTLE_BITS = {
    0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
}
OTHER_BITS = {0x1: "gpu_idle", 0x2: "app_clocks", 0x10: "sync_boost", 0x100: "display_clocks"}
THROTTLE_MASK = sum(THROTTLE_BITS)
EVENT_LIMIT = 200


def decode_reasons(mask: Any) -> list[str]:
    if mask is None:
        return []
    m = int(mask)
    return [name for bit, name in {**THROTTLE_BITS, **OTHER_BITS}.items() if m & bit]


SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


def named_gpus(scope: str, evidence: dict[str, Any]) -> set[str]:
    """The GPU UUIDs a flag singles out: its scope when that is a GPU, the evidence's ``gpu_uuid``
    and the items of its ``gpus`` list (UUIDs, or hw_fault's objects with a ``gpu_uuid``). A node
    fault names only the GPUs that faulted, so only those are marked, not the node's other seven."""
    out = {scope} if scope.startswith(("GPU-", "MIG-")) else set()
    if isinstance(evidence.get("gpu_uuid"), str):
        out.add(evidence["gpu_uuid"])
    items = evidence.get("gpus")
    for it in items if isinstance(items, list) else ():
        u = it.get("gpu_uuid") if isinstance(it, dict) else it
        if isinstance(u, str):
            out.add(u)
    return out


def open_flag_marks(session: Session, cluster: str | None = None, node: str | None = None) -> dict[str, Any]:
    """Open flags by the GPU (UUID) and the node ((cluster, name)) they point at. A flag points at
    a node when its scope or its evidence's ``node`` names it, or when it names one of its GPUs."""
    q = (select(Flag.id, Flag.kind, Flag.severity, Flag.scope, Flag.evidence, Flag.suggestion, Flag.start_ts,
                Flag.wasted_gpu_hours, Job.job_id, Job.user, Cluster.name.label("cluster"))
         .join(Job, Job.id == Flag.job_pk).join(Cluster, Cluster.id == Job.cluster_id).where(Flag.open.is_(True)))
    if cluster:
        q = q.where(Cluster.name == cluster)
    rows = list(session.execute(q))
    uuids = {u for r in rows for u in named_gpus(r.scope or "", r.evidence or {})}
    where: dict[str, tuple[str, str, int]] = {}  # uuid -> (cluster, node, index)
    for i in range(0, len(uuids), 900):
        chunk = sorted(uuids)[i:i + 900]
        gq = select(Gpu.uuid, Gpu.index.label("gpu_index"), Node.name, Cluster.name.label("cluster"))
        for g in session.execute(gq.join(Node, Node.id == Gpu.node_id).join(Cluster, Cluster.id == Node.cluster_id)
                                 .where(Gpu.uuid.in_(chunk))):
            where[g.uuid] = (g.cluster, g.name, g.gpu_index)
    by_gpu: dict[str, list[dict[str, Any]]] = {}
    by_node: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        ev = r.evidence or {}
        gpus = sorted((where[u] for u in named_gpus(r.scope or "", ev) if u in where), key=lambda w: w[2])
        nodes: set[tuple[str, str]] = {(c, n) for c, n, _ in gpus}
        for name in (r.scope, ev.get("node")):
            if isinstance(name, str) and name and not name.startswith(("GPU-", "MIG-", "progress")):
                nodes.add((r.cluster, name))
        d = {"id": r.id, "kind": r.kind, "severity": r.severity, "job_id": r.job_id, "user": r.user,
             "cluster": r.cluster, "start_ts": r.start_ts, "wasted_gpu_hours": clean(r.wasted_gpu_hours),
             "suggestion": r.suggestion, "scope": r.scope}
        for c, n in sorted(nodes):
            if node is not None and n != node:
                continue
            here = sorted((w[2], u) for u in named_gpus(r.scope or "", ev) if (w := where.get(u)) and w[:2] == (c, n))
            by_node.setdefault((c, n), []).append({**d, "gpus": [{"uuid": u, "index": i} for i, u in here]})
            for _, u in here:
                by_gpu.setdefault(u, []).append(d)
    order = lambda f: (SEVERITY_RANK.get(f["severity"], 9), -(f["wasted_gpu_hours"] or 0.0), f["id"])  # noqa: E731
    for lst in (*by_gpu.values(), *by_node.values()):
        lst.sort(key=order)
    return {"gpu": by_gpu, "node": by_node}


def drain_advice(cluster: str, name: str, flags: list[dict[str, Any]]) -> dict[str, Any] | None:
    """When an open flag on the node says to drain it (the registry's suggestion does), the most
    severe such flag, the GPUs it names and the command with this node's name filled in."""
    hit = next((f for f in flags if "drain" in (f.get("suggestion") or "")), None)
    if hit is None:
        return None
    gpus = ", ".join(f"GPU {g['index']}" for g in hit["gpus"])
    reason = f"gpufleet {hit['kind']}" + (f" {gpus}" if gpus else "") + f" job {hit['job_id']}"
    return {"kind": hit["kind"], "severity": hit["severity"], "job_id": hit["job_id"], "gpus": hit["gpus"],
            "suggestion": hit["suggestion"],
            "command": f'scontrol update nodename={name} state=drain reason="{reason}"'}


def _current_jobs(session: Session, gpu_pks: list[int]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for i in range(0, len(gpu_pks), 900):
        q = (select(Allocation.gpu_pk, Job.job_id, Job.user, Job.name, Cluster.name.label("cluster"))
             .join(Job, Job.id == Allocation.job_pk).join(Cluster, Cluster.id == Job.cluster_id)
             .where(Allocation.gpu_pk.in_(gpu_pks[i:i + 900]), Allocation.end_ts.is_(None), Job.state != "ended"))
        for r in session.execute(q):
            out[r.gpu_pk] = {"job_id": r.job_id, "user": r.user, "name": r.name, "cluster": r.cluster}
    return out


def _gpu_dict(g: Gpu, node: str, live: dict[int, dict[str, Any]], jobs: dict[int, dict[str, Any]],
              marks: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    cur = live.get(g.id)
    if cur is not None:
        cur = {**cur, "clock_event_reasons": decode_reasons(cur.get("clock_event_reasons"))}
    return {"uuid": g.uuid, "index": g.index, "node": node, "model": g.model, "mig_profile": g.mig_profile,
            "memory_total_bytes": g.memory_total_bytes, "last_seen": g.last_seen,
            "current": cur, "job": jobs.get(g.id),
            "flags": [{k: f[k] for k in ("kind", "severity", "job_id", "cluster")}
                      for f in (marks or {}).get(g.uuid, [])]}


def list_nodes(session: Session, *, cluster: str | None, limit: int, cursor: str | None) -> dict[str, Any]:
    conds: list[Any] = []
    if cluster:
        conds.append(Cluster.name == cluster)
    total = session.execute(select(func.count(Node.id)).join(Cluster, Cluster.id == Node.cluster_id)
                            .where(*conds)).scalar_one()
    q = select(Node, Cluster.name.label("cluster")).join(Cluster, Cluster.id == Node.cluster_id).where(*conds)
    ks = Keyset(Cluster.name, Node.name, str, str)
    rows, nxt = ks.page(session.execute(ks.apply(q, cursor).limit(limit + 1)).all(), limit,
                        lambda r: [r.cluster, r.Node.name])
    node_ids = [r.Node.id for r in rows]
    gpus: dict[int, list[Gpu]] = {i: [] for i in node_ids}
    for i in range(0, len(node_ids), 900):
        for g in session.execute(select(Gpu).where(Gpu.node_id.in_(node_ids[i:i + 900]))
                                 .order_by(Gpu.index)).scalars():
            gpus[g.node_id].append(g)
    pks = [g.id for gs in gpus.values() for g in gs]
    live = live_values(session, pks)
    jobs = _current_jobs(session, pks)
    marks = open_flag_marks(session, cluster)
    t = now()
    data = []
    for r in rows:
        n: Node = r.Node
        data.append({"cluster": r.cluster, "name": n.name, "agent_version": n.agent_version, "last_seen": n.last_seen,
                     "stale": n.last_seen is None or t - n.last_seen > 300, "labels": n.labels or {},
                     "gpus": [_gpu_dict(g, n.name, live, jobs, marks["gpu"]) for g in gpus[n.id]],
                     "flags": [{k: f[k] for k in ("kind", "severity", "job_id", "gpus")}
                               for f in marks["node"].get((r.cluster, n.name), [])]})
    return {"data": data, "count": total, "next_cursor": nxt}


def _events(session: Session, *conds: Any) -> list[dict[str, Any]]:
    q = (select(Event, Gpu.uuid, Gpu.index).outerjoin(Gpu, Gpu.id == Event.gpu_pk).where(*conds)
         .order_by(Event.ts.desc()).limit(EVENT_LIMIT))
    return [{"ts": r.Event.ts, "kind": r.Event.kind, "code": r.Event.code, "message": r.Event.message,
             "gpu_uuid": r.uuid, "gpu_index": r.index} for r in session.execute(q)]


def node_detail(session: Session, cluster: str, name: str, *, window_s: float = 86400) -> dict[str, Any] | None:
    row = session.execute(select(Node).join(Cluster, Cluster.id == Node.cluster_id)
                          .where(Cluster.name == cluster, Node.name == name)).scalar()
    if row is None:
        return None
    gpus = list(session.execute(select(Gpu).where(Gpu.node_id == row.id).order_by(Gpu.index)).scalars())
    pks = [g.id for g in gpus]
    live = live_values(session, pks)
    jobs = _current_jobs(session, pks)
    since = now() - window_s
    thr = throttle_stats(session, pks, since)
    marks = open_flag_marks(session, cluster, row.name)
    flags = marks["node"].get((cluster, row.name), [])
    return {"cluster": cluster, "name": row.name, "agent_version": row.agent_version, "last_seen": row.last_seen,
            "labels": row.labels or {}, "flags": flags, "drain": drain_advice(cluster, row.name, flags),
            "gpus": [{**_gpu_dict(g, row.name, live, jobs, marks["gpu"]), "throttle": thr.get(g.id)} for g in gpus],
            "events": _events(session, Event.node_id == row.id, Event.ts >= now() - 7 * 86400),
            "jobs": node_jobs(session, row.id, now() - 7 * 86400), "window_s": window_s}


def throttle_stats(session: Session, gpu_pks: list[int], since: float) -> dict[int, dict[str, Any]]:
    """Per GPU over the window: minutes with data, minutes slowed by power/thermal/HW reasons."""
    if not gpu_pks:
        return {}
    t = gpu_samples_1m
    slowed = func.coalesce(t.c.clock_event_reasons, 0).bitwise_and(THROTTLE_MASK)
    q = (select(t.c.gpu_pk, func.count().label("minutes"), func.count(func.nullif(slowed, 0)).label("throttled"),
                func.avg(t.c.sm_clock_mhz).label("sm_clock_mhz_mean"), func.max(t.c.temp_c).label("temp_c_max"),
                func.avg(t.c.power_w).label("power_w_mean"))
         .where(t.c.gpu_pk.in_(gpu_pks), t.c.bucket >= since).group_by(t.c.gpu_pk))
    return {r.gpu_pk: {"minutes": int(r.minutes), "throttled_minutes": int(r.throttled),
                       "throttled_fraction": clean(r.throttled / r.minutes if r.minutes else None),
                       "sm_clock_mhz_mean": clean(r.sm_clock_mhz_mean), "temp_c_max": clean(r.temp_c_max),
                       "power_w_mean": clean(r.power_w_mean)}
            for r in session.execute(q)}


def gpu_detail(session: Session, uuid: str, *, window_s: float = 86400) -> dict[str, Any] | None:
    row = session.execute(select(Gpu, Node.name.label("node"), Cluster.name.label("cluster"))
                          .join(Node, Node.id == Gpu.node_id).join(Cluster, Cluster.id == Node.cluster_id)
                          .where(Gpu.uuid == uuid)).first()
    if row is None:
        return None
    g: Gpu = row.Gpu
    live = live_values(session, [g.id])
    jobs = _current_jobs(session, [g.id])
    hist = session.execute(select(Allocation.start_ts, Allocation.end_ts, Job.job_id, Job.user, Job.name,
                                  Cluster.name.label("cluster"))
                           .join(Job, Job.id == Allocation.job_pk).join(Cluster, Cluster.id == Job.cluster_id)
                           .where(Allocation.gpu_pk == g.id).order_by(Allocation.start_ts.desc()).limit(20)).all()
    return {**_gpu_dict(g, row.node, live, jobs), "cluster": row.cluster, "parent_uuid": g.parent_uuid,
            "throttle": throttle_stats(session, [g.id], now() - window_s).get(g.id),
            "events": _events(session, Event.gpu_pk == g.id),
            "jobs": [{"job_id": h.job_id, "user": h.user, "name": h.name, "cluster": h.cluster,
                      "start_ts": h.start_ts, "end_ts": h.end_ts} for h in hist]}
