"""Writers of the same rows take turns (PostgreSQL): ``lock_node_days`` takes a
transaction-scoped advisory lock per (node, UTC day) that a write's new batches cover, in
sorted order, before anything reads the stored rows to decide what is new.

Why: the write path stores every field of a (GPU, ts) row once by reading what is stored
(``unique_rows``) and folding only what is new into the rollups and minute features. Two
transactions writing pieces of the same rows at once (a remote-write sender's shards on two
collector processes) would each read before the other committed, and both fold the row. With
the lock the second waits until the first commits; under READ COMMITTED its reads, each a new
snapshot, then see the first's rows, so it stores and folds only the fields they lack.

The key is the node, not the GPU: a GPU's samples only come under the node that owns it (the
write refuses a GPU claimed by another node), and a node's batch names it before any GPU is
resolved, so the lock is taken straight after the ledger, while the write holds no dimension
row (nodes, GPUs, jobs) that a waiting writer could need. The day, not the minute: every
advisory lock is an entry of PostgreSQL's shared lock table (about max_locks_per_transaction x
max_connections entries), so the count has to stay bounded: one per node a group commit
carries (a 50,000-row group of 80-row batches: at most 625), and one per node-day an import
covers (a month of a 125-node file: 3,750), where per GPU-minute keys would take 1.4 M for a
day of 1,000 GPUs. What it serialises: writers of one node's same day, which with one sender
per node (the native agent) never overlap in time; the shards of one Prometheus, which must;
and an import covering today for a live node, whose live writes then wait for the import's
commit.

Cost: one round trip per transaction (``bench/ingest/row_lock_cost.py``, 80-row native-agent
batches, locked and unlocked transactions alternating): 1.6 us/row client CPU when each batch
commits alone (an idle collector), 0.17 us/row in 50-batch group commits (docs/prometheus.md).

Deadlocks: every writer takes its keys in one statement, in (node, day) order, before any other
row lock but its ledger keys and new cluster/node rows, so no cycle runs through them; the
collector retries a lost deadlock anyway (``storage.errors.is_transient``). SQLite needs no
lock: one writer at a time, and the write's first statement that writes (the ledger insert)
comes before the stored rows are read, so a second writer reads what the first committed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sqlalchemy import Connection

from gpufleet.storage.dialect import is_postgres
from gpufleet.storage.pg_arrays import pg_array, query_prepared
from gpufleet.storage.prepared import Prepared

DAY_S = 86400.0

# The two-int4 advisory key space (PostgreSQL keeps it apart from the bigint one, which
# retention's partition locks use): (nodes.id, UTC day number). unnest yields the keys in
# array order and the aggregate locks them in that order.
_LOCK_SQL = "SELECT count(pg_advisory_xact_lock(k.n, k.d)) FROM unnest(%s::int4[], %s::int4[]) AS k(n, d)"
# A few keys (a lone batch, an idle collector's commit: one, two across midnight) as plain
# parameters, padded with the last key (locking a held key again only counts it): a round trip
# like any statement's, where building the two arrays cost more than the statement itself
# (35 vs 76 us client CPU per call, bench/ingest/row_lock_cost.py's box). The select list is
# evaluated left to right, so the order holds here too.
SMALL = 4
_SMALL_SQL = "SELECT " + ", ".join("pg_advisory_xact_lock(%s::int4, %s::int4)" for _ in range(SMALL))


def node_days(preps: Sequence[Prepared], active: Sequence[int], node_pks: Sequence[int]) -> list[tuple[int, int]]:
    """The sorted (node pk, UTC day) keys of the active batches' rows (pure)."""
    keys: set[tuple[int, int]] = set()
    for i in active:
        ts = preps[i].ts
        if not len(ts):
            continue
        lo, hi = int(ts.min() // DAY_S), int(ts.max() // DAY_S)
        nid = node_pks[i]
        if hi - lo <= 1:  # a live batch: one day, or two across midnight
            keys.update((nid, d) for d in range(lo, hi + 1))
        else:  # an import chunk can span months: only the days it has rows on
            keys.update((nid, int(d)) for d in np.unique(ts // DAY_S).tolist())
    return sorted(keys)


def lock_node_days(conn: Connection, preps: Sequence[Prepared], active: Sequence[int],
                   node_pks: Sequence[int]) -> int:
    """Take the write's (node, day) locks inside the caller's transaction (held until it ends);
    returns how many keys it asked for (0 on SQLite)."""
    if not is_postgres(conn):
        return 0
    keys = node_days(preps, active, node_pks)
    if not keys:
        return 0
    if len(keys) <= SMALL:
        padded = keys + [keys[-1]] * (SMALL - len(keys))
        raw = conn.connection.driver_connection
        with raw.cursor() as cur:  # type: ignore[union-attr]  # DBAPI connection: Optional in SQLAlchemy's types
            cur.execute(_SMALL_SQL, [v for k in padded for v in k], prepare=True)
    else:
        k = np.array(keys, dtype=np.int64)
        query_prepared(conn, _LOCK_SQL, [pg_array(k[:, 0], integer=True), pg_array(k[:, 1], integer=True)])
    return len(keys)
