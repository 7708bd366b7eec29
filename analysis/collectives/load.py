"""Read one job's collectives, its nodes' NIC samples and rails from storage into a FabricView
(the only database code of the package; the decisions stay pure).

Bounded: the last ``LOOKBACK_S`` of the job (the baseline is what the job sustained in that
time) and at most ``MAX_ROWS`` collective rows, newest first.
"""

from __future__ import annotations

from sqlalchemy import Connection, func, select

from gpufleet.storage.collectives_models import CollectiveWindow, GpuNicRow, NicSampleRow
from gpufleet.storage.models import Gpu, Node

from .features import CollRow, FabricView, NicRow

LOOKBACK_S = 2 * 3600.0
MAX_ROWS = 500_000


def load_fabric(conn: Connection, job_pk: int, until: float | None = None) -> FabricView | None:
    cw, nd = CollectiveWindow.__table__, Node.__table__
    last = conn.execute(select(func.max(cw.c.ts)).where(cw.c.job_pk == job_pk)).scalar()
    if last is None:
        return None
    hi = float(last) if until is None else min(float(last), until)
    lo = hi - LOOKBACK_S
    g = Gpu.__table__
    rows = conn.execute(
        select(cw.c.ts, nd.c.name, cw.c.comm, cw.c.rank, cw.c.coll, cw.c.size_bucket, cw.c.count, cw.c.exec_us_p50,
               cw.c.busbw_gbs_p50, g.c.uuid, cw.c.n_ranks, cw.c.n_nodes, cw.c.node_id)
        .select_from(cw.join(nd, nd.c.id == cw.c.node_id).outerjoin(g, g.c.id == cw.c.gpu_pk))
        .where(cw.c.job_pk == job_pk, cw.c.ts >= lo, cw.c.ts <= hi)
        .order_by(cw.c.ts.desc()).limit(MAX_ROWS)).all()
    colls = [CollRow(float(r[0]), r[1], r[2], int(r[3]), r[4], int(r[5]), int(r[6]), float(r[7]),
                     None if r[8] is None else float(r[8]), r[9], r[10], r[11]) for r in reversed(rows)]
    node_ids = sorted({int(r[12]) for r in rows})
    ns = NicSampleRow.__table__
    nic_rows = conn.execute(
        select(ns.c.ts, nd.c.name, ns.c.nic, ns.c.interval_s, ns.c.rate_gbps, ns.c.state, ns.c.xmit_wait, ns.c.errors,
               ns.c.counters)
        .select_from(ns.join(nd, nd.c.id == ns.c.node_id))
        .where(ns.c.node_id.in_(node_ids), ns.c.ts >= lo, ns.c.ts <= hi + 60).order_by(ns.c.ts)).all() \
        if node_ids else []
    nics = [NicRow(float(r[0]), r[1], r[2], float(r[3]), r[4], r[5], r[6], r[7], dict(r[8] or {})) for r in nic_rows]
    gn = GpuNicRow.__table__
    rails: dict[str, list[str]] = {}
    modes: dict[str, str] = {}
    if node_ids:
        for uuid, nic, mode in conn.execute(
                select(g.c.uuid, gn.c.nic, gn.c.mode).select_from(gn.join(g, g.c.id == gn.c.gpu_pk))
                .where(gn.c.node_id.in_(node_ids)).order_by(g.c.uuid, gn.c.nic)):
            rails.setdefault(uuid, []).append(nic)
            modes[uuid] = mode
    ts = [c.ts for c in colls]
    return FabricView(colls, nics, rails, min(ts), max(ts) + 10.0, modes)
