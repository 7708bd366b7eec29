"""Dimension rows (clusters, nodes, GPUs, jobs): upserted in sorted key order (so concurrent
writers never deadlock on them) and remembered in the ``WriteCache`` so a steady stream of
batches does not rewrite unchanged rows. The checks that need the database's view of the
fleet live here too: a GPU uuid another live node reports, a sample of a GPU nobody listed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, and_, bindparam, case, func, select, update
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

from gpufleet.storage.dialect import is_postgres
from gpufleet.storage.errors import WriteRefused
from gpufleet.storage.models import Cluster, Gpu, Job, Node
from gpufleet.storage.prepared import Prepared
from gpufleet.storage.scope import other_cluster
from gpufleet.storage.write_cache import GPU_MOVE_AFTER_S, GPU_SEEN_EVERY_S, NODE_SEEN_EVERY_S, WriteCache


def insert_for(conn: Connection, table: Any) -> Any:
    """The dialect's INSERT (with ``on_conflict_do_*``) for ``table``."""
    mod = pg_dialect if is_postgres(conn) else sqlite_dialect
    return mod.insert(table)


def cluster_ids(conn: Connection, names: Iterable[str], cache: WriteCache) -> dict[str, int]:
    todo = sorted({n for n in names if n not in cache.clusters})
    if todo:
        t = Cluster.__table__
        conn.execute(insert_for(conn, t).on_conflict_do_nothing(index_elements=["name"]), [{"name": n} for n in todo])
        for cid, name in conn.execute(select(t.c.id, t.c.name).where(t.c.name.in_(todo))):
            cache.clusters[name] = cid
    return cache.clusters


def node_ids(conn: Connection, keys: Iterable[tuple[int, str]], cache: WriteCache) -> dict[tuple[int, str], int]:
    todo = sorted({k for k in keys if k not in cache.nodes})
    if todo:
        t = Node.__table__
        conn.execute(insert_for(conn, t).on_conflict_do_nothing(index_elements=["cluster_id", "name"]),
                     [{"cluster_id": c, "name": n} for c, n in todo])
        for cid in {c for c, _ in todo}:
            names = [n for c, n in todo if c == cid]
            for nid, name in conn.execute(select(t.c.id, t.c.name).where(t.c.cluster_id == cid, t.c.name.in_(names))):
                cache.nodes[(cid, name)] = nid
    return cache.nodes


def _upsert_gpus(conn: Connection, per_node: dict[int, dict[str, Any]], now: float, cache: WriteCache,
             batch_of_node: dict[int, int]) -> dict[str, int]:
    """Upsert the GPUs each node reported (new, changed, or not marked seen for a while)."""
    t = Gpu.__table__
    out: dict[str, int] = {}
    todo: list[dict[str, Any]] = []
    for node_id, gpus in per_node.items():
        for uuid, g in gpus.items():
            attrs = (g.index, g.model, g.mig_profile, g.parent_uuid, g.memory_total_bytes)
            hit = cache.gpus.get(uuid)
            if hit and hit[1] == node_id and hit[2] == attrs and now - hit[3] < GPU_SEEN_EVERY_S:
                out[uuid] = hit[0]
                continue
            todo.append({"uuid": uuid, "node_id": node_id, "index": g.index, "model": g.model,
                         "mig_profile": g.mig_profile, "parent_uuid": g.parent_uuid,
                         "memory_total_bytes": g.memory_total_bytes, "last_seen": now})
    if not todo:
        return out
    todo.sort(key=lambda r: r["uuid"])
    uuids = [r["uuid"] for r in todo]
    existing = {r.uuid: r for r in conn.execute(
        select(t.c.uuid, t.c.node_id, Node.last_seen, Node.name, Node.cluster_id).join(Node, Node.id == t.c.node_id)
        .where(t.c.uuid.in_(uuids)))}
    moving = {r["node_id"] for r in todo if (e := existing.get(r["uuid"])) is not None and e.node_id != r["node_id"]}
    cluster_of = dict(conn.execute(select(Node.id, Node.cluster_id).where(Node.id.in_(sorted(moving))))
                      .tuples().all()) if moving else {}
    for r in todo:
        e = existing.get(r["uuid"])
        moved = e is not None and e.node_id != r["node_id"]
        if e is not None and moved and cluster_of.get(r["node_id"]) != e.cluster_id:
            # Never by silence: only an admin moves a GPU to another cluster (storage.scope.move_gpu).
            raise WriteRefused("not_permitted", other_cluster(r["uuid"]), index=batch_of_node.get(r["node_id"]),
                               part="gpus")
        if e is not None and moved and e.last_seen is not None and now - e.last_seen < GPU_MOVE_AFTER_S:
            raise WriteRefused("conflict", f"uuid {r['uuid']!r} is being reported by node {e.name!r}",
                               index=batch_of_node.get(r["node_id"]), part="gpus")
    ins = insert_for(conn, t)
    conn.execute(ins.on_conflict_do_update(index_elements=["uuid"], set_={
        c: ins.excluded[c] for c in ("node_id", "index", "model", "mig_profile", "parent_uuid",
                                     "memory_total_bytes", "last_seen")}), todo)
    ids = dict(conn.execute(select(t.c.uuid, t.c.id).where(t.c.uuid.in_(uuids))).all())
    for r in todo:
        pk = ids[r["uuid"]]
        out[r["uuid"]] = pk
        cache.gpus[r["uuid"]] = (pk, r["node_id"], (r["index"], r["model"], r["mig_profile"], r["parent_uuid"],
                                                    r["memory_total_bytes"]), now)
    return out


_JOB_ATTRS = ("source", "user", "name", "account", "partition", "namespace", "num_nodes", "ntasks", "labels")


def _merged_attr(t: Any, ins: Any, col: str) -> Any:
    """A described job's attribute over the stored one. Unknown is not a value: an attribute
    the describer does not know (None) never erases a known one. An import only fills gaps
    (history never overrides what the live agents and the scheduler say) and never turns a
    live job's source into ``import``; a bare reference's ``unknown`` source gives way."""
    new, old = ins.excluded[col], t.c[col]
    from_import = ins.excluded.source == "import"
    if col == "source":
        return case((and_(from_import, old != "unknown"), old), else_=new)
    return case((from_import, func.coalesce(old, new)), else_=func.coalesce(new, old))


def job_ids(conn: Connection, jobs: dict[tuple[int, str], Any], cache: WriteCache) -> dict[tuple[int, str], int]:
    """Upsert jobs (described by JobInfo, or bare when only referenced by samples)."""
    t = Job.__table__
    out: dict[tuple[int, str], int] = {}
    todo: list[tuple[dict[str, Any], tuple[Any, ...]]] = []  # (row, the JobInfo's attributes; () when bare)
    for key, info in jobs.items():
        if info is None:
            attrs: tuple[Any, ...] = ()
        else:
            attrs = (info.source, info.user, info.name, info.account, info.partition, info.namespace,
                     info.num_nodes, info.ntasks, tuple(sorted(info.labels.items())))
        hit = cache.jobs.get(key)
        if hit and (not attrs or hit[1] == attrs):
            out[key] = hit[0]
            continue
        row: dict[str, Any] = {"cluster_id": key[0], "job_id": key[1], "state": "running",
                               "start_ts": info.start_ts if info is not None else None, "end_ts": None,
                               "last_sample_ts": None}
        if info is None:
            row.update(dict.fromkeys(_JOB_ATTRS), source="unknown")
        else:
            row.update(zip(_JOB_ATTRS, (*attrs[:-1], dict(info.labels) or None), strict=True))
        todo.append((row, attrs))
    if not todo:
        return out
    todo.sort(key=lambda ra: (ra[0]["cluster_id"], ra[0]["job_id"]))
    ins = insert_for(conn, t)
    # A described job overwrites a bare one's attributes; a bare reference changes nothing.
    described = [r for r, a in todo if a]
    bare = [r for r, a in todo if not a]
    if described:
        start = case((and_(t.c.start_ts.is_not(None), t.c.start_ts < ins.excluded.start_ts), t.c.start_ts),
                     else_=ins.excluded.start_ts)
        conn.execute(ins.on_conflict_do_update(
            index_elements=["cluster_id", "job_id"],
            set_={**{c: _merged_attr(t, ins, c) for c in _JOB_ATTRS},
                  "start_ts": case((ins.excluded.start_ts.is_(None), t.c.start_ts), else_=start)}), described)
    if bare:
        conn.execute(ins.on_conflict_do_nothing(index_elements=["cluster_id", "job_id"]), bare)
    for cid in sorted({r["cluster_id"] for r, _ in todo}):
        names = [r["job_id"] for r, _ in todo if r["cluster_id"] == cid]
        for pk, jid in conn.execute(select(t.c.id, t.c.job_id).where(t.c.cluster_id == cid, t.c.job_id.in_(names))):
            out[(cid, jid)] = pk
    for r, a in todo:
        key = (r["cluster_id"], r["job_id"])
        if a or key not in cache.jobs:
            cache.jobs[key] = (out[key], a)
    return out


def mark_nodes_seen(conn: Connection, preps: Sequence[Prepared], active: list[int], node_pks: list[int],
                    now: float, cache: WriteCache) -> None:
    """nodes.last_seen / agent_version: one update per node, in id order; at most every
    NODE_SEEN_EVERY_S per process unless the agent version changed."""
    node_seen: dict[int, tuple[float, str]] = {}
    for i in active:
        nid = node_pks[i]
        ver = preps[i].batch.agent.version
        last = cache.node_seen.get(nid)
        if last is None or now - last[0] >= NODE_SEEN_EVERY_S or last[1] != ver:
            node_seen[nid] = (now, ver)
    if node_seen:
        conn.execute(update(Node.__table__).where(Node.__table__.c.id == bindparam("nid"))
                     .values(last_seen=bindparam("seen"), agent_version=bindparam("ver")),
                     [{"nid": k, "seen": v[0], "ver": v[1] or None} for k, v in sorted(node_seen.items())])
        cache.node_seen.update(node_seen)


def gpu_ids(conn: Connection, preps: Sequence[Prepared], active: list[int], node_pks: list[int], now: float,
            cache: WriteCache) -> dict[str, int]:
    """uuid -> gpus.id for every GPU the active batches list or sample. The listed ones are
    upserted (new, changed, or not marked seen for a while); a sample's GPU must be listed or
    already known for the batch's node (WriteRefused otherwise)."""
    per_node: dict[int, dict[str, Any]] = {}
    batch_of_node: dict[int, int] = {}
    for i in active:
        nid = node_pks[i]
        batch_of_node[nid] = i
        d = per_node.setdefault(nid, {})
        for g in preps[i].batch.gpus:
            d[g.uuid] = g
    gids = _upsert_gpus(conn, per_node, now, cache, batch_of_node)
    unknown = sorted({u for i in active for u in set(preps[i].gpu) if u not in gids})
    if unknown:
        t = Gpu.__table__
        for uuid, pk, node_id in conn.execute(select(t.c.uuid, t.c.id, t.c.node_id).where(t.c.uuid.in_(unknown))):
            gids[uuid] = pk
            cache.gpus.setdefault(uuid, (pk, node_id, (), 0.0))
    for i in active:
        p = preps[i]
        nid = node_pks[i]
        # Distinct GPUs only (a batch has a handful over 80+ rows); the row is looked up for
        # the message when one is wrong.
        bad = [u for u in set(p.gpu) if u not in gids or cache.gpus.get(u, (0, nid))[1] != nid]
        if bad:
            r = min(p.gpu.index(u) for u in bad)
            raise WriteRefused("unknown_reference", f"GPU {p.gpu[r]!r} is not listed in this batch's gpus "
                               f"and not known for node {p.batch.agent.node!r}", index=i, part="samples",
                               field="gpu", row=r)
    return gids


def referenced_jobs(preps: Sequence[Prepared], active: list[int], cluster_pks: list[int]) -> dict[tuple[int, str], Any]:
    """(cluster pk, job id) -> JobInfo for described jobs, None for the ones samples and
    allocations merely reference."""
    jobs: dict[tuple[int, str], Any] = {}
    for i in active:
        cid = cluster_pks[i]
        for jid in set(preps[i].job):
            if jid is not None:
                jobs.setdefault((cid, jid), None)
        for a in preps[i].batch.allocations:
            jobs.setdefault((cid, a.job_id), None)
        for info in preps[i].batch.jobs:
            jobs[(cid, info.job_id)] = info
    return jobs
