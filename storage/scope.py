"""What one writer may write about the fleet, decided from the database's view of it:

* a GPU uuid belongs to the cluster whose node first reported it, until an admin moves it
  (``move_gpu``); another cluster's node reporting it is refused (``other_cluster``) without
  naming the owner's node, so a token of one cluster learns nothing about another;
* a node-scoped agent token writes only for jobs on its own GPUs (``NodeJobs``).

Pure decisions where possible; the few queries they need are here too, so the write path and
the collector ask one module."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, exists, or_, select, true, update

from gpufleet.protocol import Batch
from gpufleet.storage.models import Allocation, Cluster, Gpu, Job, Node

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


# --- a node-scoped token writes only for jobs on its own GPUs ---------------------------------

# Who a job is blamed on: once the job has run on another node's GPUs, a node-scoped token may
# fill these when unknown but not change them (only a cluster-wide token or an import can).
BLAME = ("user", "name", "account")
# A job whose allocation on the node's GPUs ended this recently is still the node's own: its
# last progress windows and collectives arrive after its last sample.
RECENT_S = 3600.0
FACTS_TTL_S = 30.0  # how long a collector process trusts what it read (jobs are re-sent every batch)


@dataclass(frozen=True)
class Refusal:
    """One record a node-scoped token may not write: ``part``[``row``].``field``."""

    part: str
    row: int
    field: str
    message: str


@dataclass(frozen=True)
class NodeFacts:
    """The database's view of one node: its GPUs, the jobs on them (open or ended within
    RECENT_S), and for the jobs asked about, the stored blame attributes of those that also
    ran on another node's GPUs."""

    gpus: frozenset[str]
    jobs: frozenset[str]
    shared: dict[str, tuple[str | None, ...]]
    asked: frozenset[str]


def node_facts(conn: Connection, cluster: str, node: str, described: Iterable[str], now: float) -> NodeFacts:
    asked = frozenset(described)
    g, a, j, n, c = Gpu.__table__, Allocation.__table__, Job.__table__, Node.__table__, Cluster.__table__
    row = conn.execute(select(n.c.id, c.c.id).join(c, c.c.id == n.c.cluster_id)
                       .where(c.c.name == cluster, n.c.name == node)).first()
    cid = row[1] if row is not None else conn.execute(select(c.c.id).where(c.c.name == cluster)).scalar()
    if cid is None:  # a cluster nobody wrote yet: no job of it exists
        return NodeFacts(frozenset(), frozenset(), {}, asked)
    node_pk = row[0] if row is not None else None
    gpus: frozenset[str] = frozenset()
    jobs: frozenset[str] = frozenset()
    if node_pk is not None:
        gpus = frozenset(conn.execute(select(g.c.uuid).where(g.c.node_id == node_pk)).scalars())
        jobs = frozenset(conn.execute(
            select(j.c.job_id).distinct().join(a, a.c.job_pk == j.c.id).join(g, g.c.id == a.c.gpu_pk)
            .where(g.c.node_id == node_pk, or_(a.c.end_ts.is_(None), a.c.end_ts > now - RECENT_S))).scalars())
    shared: dict[str, tuple[str | None, ...]] = {}
    if asked:
        elsewhere = exists().where(a.c.job_pk == j.c.id, g.c.id == a.c.gpu_pk,
                                   g.c.node_id != node_pk if node_pk is not None else true())
        for r in conn.execute(select(j.c.job_id, *(j.c[k] for k in BLAME))
                              .where(j.c.cluster_id == cid, j.c.job_id.in_(sorted(asked)), elsewhere)):
            shared[r[0]] = tuple(r[1:])
    return NodeFacts(gpus, jobs, shared, asked)


def screen_node_records(batch: Batch, row_jobs: Iterable[str | None], facts: NodeFacts) -> tuple[dict[str, list[Any]],
                                                                                                   list[Refusal]]:
    """For a batch sent with a node-scoped token: the sections to replace (without the records
    it may not write) and a Refusal for each of those. Its own jobs are those its rows put on
    its GPUs, its allocations of its own GPUs, and the database's jobs on its GPUs."""
    own_gpus = {gi.uuid for gi in batch.gpus} | facts.gpus
    own = ({jid for jid in row_jobs if jid is not None} | facts.jobs
           | {al.job_id for al in batch.allocations if al.gpu_uuid in own_gpus})
    changes: dict[str, list[Any]] = {}
    refused: list[Refusal] = []

    def keep(part: str, records: list[Any], why: Any) -> None:
        kept = []
        for i, rec in enumerate(records):
            msg = why(rec)
            if msg is None:
                kept.append(rec)
            else:
                refused.append(Refusal(part, i, "job_id", msg))
        if len(kept) != len(records):
            changes[part] = kept

    def foreign(jid: str | None) -> str | None:
        if jid is None or jid in own:
            return None
        return (f"job {jid!r} runs on none of this node's GPUs: a node-scoped token writes only for its own "
                "jobs")

    def described(info: Any) -> str | None:
        msg = foreign(info.job_id)
        stored = facts.shared.get(info.job_id)
        if msg is None and stored is not None:
            changed = [k for k, old in zip(BLAME, stored, strict=True)
                       if old is not None and getattr(info, k) is not None and getattr(info, k) != old]
            if changed:
                msg = (f"job {info.job_id!r} also runs on other nodes: a node-scoped token may fill its unknown "
                       f"{', '.join(BLAME)} but not change its {', '.join(changed)}")
        return msg

    if batch.jobs:
        keep("jobs", batch.jobs, described)
    if batch.progress:
        keep("progress", batch.progress, lambda w: foreign(w.job_id))
    if batch.collectives:
        keep("collectives", batch.collectives, lambda co: foreign(co.job_id))
    return changes, refused


def needs_facts(batch: Batch, row_jobs: Iterable[str | None]) -> bool:
    """Whether screening this batch needs the database: it describes jobs (their blame may be
    shared), or names in a side record a job its own rows do not carry."""
    if batch.jobs:
        return True
    mine = set(row_jobs) | {al.job_id for al in batch.allocations}
    return (any(w.job_id not in mine for w in batch.progress)
            or any(co.job_id is not None and co.job_id not in mine for co in batch.collectives))


class NodeFactsCache:
    """Per collector process: ``node_facts`` per (cluster, node), read again after FACTS_TTL_S
    or when a batch asks about a job the cached read did not."""

    def __init__(self, ttl_s: float = FACTS_TTL_S, max_nodes: int = 100_000) -> None:
        self.ttl_s = ttl_s
        self.max_nodes = max_nodes
        self._facts: dict[tuple[str, str], tuple[float, NodeFacts]] = {}
        self._lock = threading.Lock()

    def cached(self, cluster: str, node: str, described: Iterable[str], now: float) -> NodeFacts | None:
        """The remembered facts when they are recent and cover the jobs asked about (no I/O:
        the event loop asks this first and leaves the database to a thread on a miss)."""
        with self._lock:
            hit = self._facts.get((cluster, node))
        if hit is not None and now - hit[0] < self.ttl_s and frozenset(described) <= hit[1].asked:
            return hit[1]
        return None

    def get(self, engine: Engine, cluster: str, node: str, described: Iterable[str], now: float,
            fresh: bool = False) -> NodeFacts:
        """``fresh``: read again whatever is cached (before refusing anything: a job the node
        started since the cached read is on its GPUs now)."""
        asked = frozenset(described)
        hit = None if fresh else self.cached(cluster, node, asked, now)
        if hit is not None:
            return hit
        with engine.connect() as conn:
            facts = node_facts(conn, cluster, node, asked, now)
        with self._lock:
            if len(self._facts) >= self.max_nodes:
                self._facts.clear()
            self._facts[(cluster, node)] = (now, facts)
        return facts
