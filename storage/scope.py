"""What one writer may write about the fleet, decided from the database's view of it:

* a GPU uuid belongs to the cluster whose node first reported it, until an admin moves it
  (``move_gpu``); another cluster's node reporting it is refused (``other_cluster``) without
  naming the owner's node, so a token of one cluster learns nothing about another;
* a node-scoped agent token writes only for jobs on its own GPUs (``NodeJobs``).

Pure decisions where possible; the few queries they need are here too, so the write path and
the collector ask one module."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, select, update

from gpufleet.storage.models import Allocation, Cluster, Gpu, Node

MOVE_HINT = "an admin moves a GPU between clusters with `gpufleet gpu move UUID --cluster C --node N`"


def other_cluster(uuid: str) -> str:
    """The refusal of a GPU another cluster owns. Names neither that cluster nor its node."""
    return f"GPU {uuid!r} belongs to another cluster; {MOVE_HINT}"


@dataclass(frozen=True)
class GpuMove:
    uuid: str
    from_cluster: str
    from_node: str
    to_cluster: str
    to_node: str


def move_gpu(engine: Engine, uuid: str, cluster: str, node: str, now: float | None = None) -> GpuMove | None:
    """Give GPU ``uuid`` to node ``node`` of ``cluster`` (both created when new); None when no
    GPU has that uuid. Its open allocation ends now: whatever ran on it ran on the old node."""
    now = time.time() if now is None else now
    g, n, c = Gpu.__table__, Node.__table__, Cluster.__table__
    with engine.begin() as conn:
        old = conn.execute(select(g.c.id, n.c.name, c.c.name.label("cluster"))
                           .join(n, n.c.id == g.c.node_id).join(c, c.c.id == n.c.cluster_id)
                           .where(g.c.uuid == uuid)).first()
        if old is None:
            return None
        node_id = _node_id(conn, cluster, node)
        conn.execute(update(g).where(g.c.id == old.id).values(node_id=node_id, last_seen=now))
        a = Allocation.__table__
        conn.execute(update(a).where(a.c.gpu_pk == old.id, a.c.end_ts.is_(None)).values(end_ts=now))
    return GpuMove(uuid, old.cluster, old.name, cluster, node)


def _node_id(conn: Connection, cluster: str, node: str) -> int:
    from gpufleet.storage.dimensions import insert_for  # dimensions imports this module

    c, n = Cluster.__table__, Node.__table__
    conn.execute(insert_for(conn, c).on_conflict_do_nothing(index_elements=["name"]), [{"name": cluster}])
    cid = conn.execute(select(c.c.id).where(c.c.name == cluster)).scalar_one()
    conn.execute(insert_for(conn, n).on_conflict_do_nothing(index_elements=["cluster_id", "name"]),
                 [{"cluster_id": cid, "name": node}])
    return int(conn.execute(select(n.c.id).where(n.c.cluster_id == cid, n.c.name == node)).scalar_one())
