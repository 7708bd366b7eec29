"""/api/v1/jobs/{id}/collectives: a job's NCCL collectives and the fabric it ran on (docs/nccl.md).
Mounted ahead of the jobs router, whose ``{job_id:path}`` would otherwise take the suffix.

* ``series``: per (communicator, collective, message-size bucket), per minute: calls, bytes,
  bus bandwidth p50/p95 over ranks and exec time p50, with the baseline the analysis uses;
* ``ranks``: per rank of the busiest multi-node series, exec time per minute (the rank x time
  heatmap) with its node, GPU and NIC (rail); the rank a fabric flag names is marked;
* ``nics``: per NIC of the job's nodes: link rate, state, traffic, port_xmit_wait and errors per
  sample, and which of the job's GPUs use it;
* ``flags``: the job's flags whose kind is documented in docs/nccl.md (from the registry);
* ``comm_share_p50`` and each rank's ``comm_share``: share of wall time inside collectives.
Unknown values are null, never zero."""

from __future__ import annotations

import math
import statistics
from typing import Any

from fastapi import APIRouter, HTTPException, Query
from sqlalchemy import func, select

from gpufleet.analysis.collectives.detect import SlowParams, slow_episodes
from gpufleet.analysis.collectives.features import Series, build_series, comm_share
from gpufleet.analysis.collectives.load import load_fabric
from gpufleet.flagkinds import flag_kinds
from gpufleet.storage.collectives_models import GpuNicRow, NicSampleRow
from gpufleet.storage.models import Cluster, Flag, Gpu, Node

from .metrics import TimedRoute
from .queries.common import DEFAULT_CLUSTER, now
from .queries.jobs import find_job
from .routes_common import ClusterQ, JobIdPath, SessionDep
from .schemas import Message

router = APIRouter(prefix="/api/v1", route_class=TimedRoute,
                   responses={400: {"model": Message, "description": "an argument is invalid (detail says which)"}})

BIN_S = 60.0
MAX_RANKS = 1024


def _num(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


def _p95(vals: list[float]) -> float | None:
    if not vals:
        return None
    s = sorted(vals)
    return s[max(0, math.ceil(0.95 * len(s)) - 1)]


def _series_json(s: Series, baseline: float | None) -> dict[str, Any]:
    comm, coll, size = s.key
    p95 = [_p95([r.busbw_gbs_p50 for r in rows if r.busbw_gbs_p50 is not None]) for rows in s.rows]
    exec_p50 = [statistics.median(ex.values()) if ex else None for ex in s.exec_us]
    n_ranks = max((r.n_ranks or 0 for rows in s.rows for r in rows), default=0) or None
    return {"comm": comm, "collective": coll, "size_bucket": size, "n_nodes": s.n_nodes, "n_ranks": n_ranks,
            "count": sum(s.calls), "t": s.bins, "calls": s.calls,
            "bytes": [sum(r.count * r.size_bucket for r in rows) for rows in s.rows],
            "busbw_gbs_p50": [_num(b) for b in s.busbw], "busbw_gbs_p95": [_num(b) for b in p95],
            "exec_us_p50": [_num(x, 1) for x in exec_p50], "baseline_gbs": _num(baseline)}


@router.get("/jobs/{job_id:path}/collectives", tags=["jobs"],
            summary="A job's NCCL collectives, per-rank exec times and its NICs",
            responses={404: {"model": Message, "description": "no such job"}})
def read_job_collectives(job_id: JobIdPath, session: SessionDep, cluster: ClusterQ = DEFAULT_CLUSTER) -> Any:
    found = find_job(session, cluster, job_id)
    if found is None:
        raise HTTPException(404, f"no job {job_id!r} in cluster {cluster!r}")
    job = found[0]
    ft = Flag.__table__
    fabric_kinds = {k.name for k in flag_kinds().kinds if k.docs.startswith("docs/nccl.md")}
    flags = [dict(f) for f in session.execute(
        select(ft.c.kind, ft.c.scope, ft.c.severity, ft.c.start_ts, ft.c.end_ts, ft.c.open, ft.c.evidence)
        .where(ft.c.job_pk == job.id, ft.c.kind.in_(sorted(fabric_kinds)))).mappings()]
    out: dict[str, Any] = {"job_id": job.job_id, "cluster": found[1], "bin_s": BIN_S, "series": [], "ranks": [],
                           "nics": [], "flags": flags}
    view = load_fabric(session.connection(), job.id)
    if view is None:
        return out
    series = build_series(view, BIN_S)
    params = SlowParams(bin_s=BIN_S)
    slow_episodes(series, params)  # fills lost_us; baselines below
    baselines: dict[tuple[str, str, int], float] = {}
    for s in series:
        ok = sorted(b for b in s.busbw if not math.isnan(b))
        if len(ok) >= params.min_baseline_bins:
            baselines[s.key] = ok[max(0, math.ceil(params.baseline_quantile * len(ok)) - 1)]
    out["series"] = [_series_json(s, baselines.get(s.key)) for s in
                     sorted(series, key=lambda s: (-s.n_nodes, -sum(s.calls)))]
    marked = {(f["scope"], (f["evidence"] or {}).get("rank")) for f in flags}
    shares = comm_share(view)
    out["comm_share_p50"] = _num(statistics.median(shares.values())) if shares else None
    multi = [s for s in series if s.n_nodes > 1] or series
    if multi:
        main = max(multi, key=lambda s: sum(s.calls))
        keys = sorted({k for ex in main.exec_us for k in ex}, key=lambda k: (k[0], k[1]))[:MAX_RANKS]
        out["ranks_of"] = {"comm": main.key[0], "collective": main.key[1], "size_bucket": main.key[2],
                           "t": main.bins}
        for node, rank in keys:
            gpu = main.gpu_of.get((node, rank))
            rail = next(iter(view.rails.get(gpu or "", [])), None)
            out["ranks"].append({"rank": rank, "node": node, "gpu": gpu, "nic": rail,
                                 "exec_us": [_num(ex.get((node, rank)), 1) for ex in main.exec_us],
                                 "degraded": (node, rank) in marked,
                                 "comm_share": _num(shares.get((node, gpu))) if gpu else None})
    job_gpus = {(c.node, c.gpu_uuid) for c in view.colls if c.gpu_uuid}
    gpus_of_nic: dict[tuple[str, str], list[str]] = {}
    for node, gpu in sorted(job_gpus):
        for nic_name in view.rails.get(gpu or "", []):
            gpus_of_nic.setdefault((node, nic_name), []).append(gpu or "")
    by: dict[tuple[str, str], dict[str, Any]] = {}
    for n in view.nics:
        e = by.setdefault((n.node, n.nic), {"node": n.node, "nic": n.nic, "t": [], "rate_gbps": [], "state": [],
                                            "xmit_wait_per_s": [], "errors": [],
                                            "gpus": gpus_of_nic.get((n.node, n.nic), [])})
        e["t"].append(n.ts)
        e["rate_gbps"].append(n.rate_gbps)
        e["state"].append(n.state)
        e["xmit_wait_per_s"].append(_num(n.xmit_wait / n.interval_s, 1) if n.xmit_wait is not None else None)
        e["errors"].append(n.errors)
    out["nics"] = [by[k] for k in sorted(by)]
    return out


@router.get("/nodes/{name}/nics", tags=["nodes"],
            summary="A node's InfiniBand/RoCE ports: rate, state, congestion, errors, rails",
            responses={404: {"model": Message, "description": "no such node"}})
def read_node_nics(name: str, session: SessionDep, cluster: ClusterQ = DEFAULT_CLUSTER,
                   hours: float = Query(6.0, gt=0, le=168, description="how far back from its newest sample"),
                   ) -> Any:
    nd, cl = Node.__table__, Cluster.__table__
    node_id = session.execute(select(nd.c.id).select_from(nd.join(cl, cl.c.id == nd.c.cluster_id))
                              .where(cl.c.name == cluster, nd.c.name == name)).scalar()
    if node_id is None:
        raise HTTPException(404, f"no node {name!r} in cluster {cluster!r}")
    ns, gn, g = NicSampleRow.__table__, GpuNicRow.__table__, Gpu.__table__
    rails: dict[str, list[dict[str, Any]]] = {}
    for nic, uuid, index, mode in session.execute(
            select(gn.c.nic, g.c.uuid, g.c.index, gn.c.mode).select_from(gn.join(g, g.c.id == gn.c.gpu_pk))
            .where(gn.c.node_id == node_id).order_by(gn.c.nic, g.c.index)):
        rails.setdefault(nic, []).append({"gpu_uuid": uuid, "index": index, "mode": mode})
    newest = session.execute(select(func.max(ns.c.ts)).where(ns.c.node_id == node_id)).scalar() or now()
    by: dict[str, dict[str, Any]] = {}
    for r in session.execute(select(ns).where(ns.c.node_id == node_id, ns.c.ts >= newest - hours * 3600)
                             .order_by(ns.c.ts)).mappings():
        e = by.setdefault(r["nic"], {"nic": r["nic"], "link_layer": r["link_layer"], "gpus": rails.get(r["nic"], []),
                                     "t": [], "rate_gbps": [], "state": [], "tx_bytes_s": [], "rx_bytes_s": [],
                                     "xmit_wait_per_s": [], "errors": [], "counters_total": {}})
        e["t"].append(r["ts"])
        for k in ("rate_gbps", "state", "tx_bytes_s", "rx_bytes_s", "errors"):
            e[k].append(r[k])
        e["xmit_wait_per_s"].append(_num(r["xmit_wait"] / r["interval_s"], 1) if r["xmit_wait"] is not None else None)
        for k, v in (r["counters"] or {}).items():
            e["counters_total"][k] = e["counters_total"].get(k, 0.0) + v
    nics = [by[k] for k in sorted(by)] + [{"nic": k, "gpus": v, "t": []} for k, v in sorted(rails.items())
                                          if k not in by]
    return {"node": name, "cluster": cluster, "hours": hours, "nics": nics}
