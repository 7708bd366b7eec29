"""The write path's one entry: ``write_batches(conn, preps, now)`` stores checked batches
(``Prepared``, from ``collector.columns``) inside the caller's transaction, so a caller gets
all-or-nothing across everything it passes (the collector's group commit, an NDJSON import).
It is the only code that writes telemetry; ingest, import and tests all go through it.

The order of one write, and the module doing each step:
1. dimensions every batch needs, even a duplicate (``dimensions``: clusters, nodes);
2. the idempotency ledger decides which batches are new (``ledger``), then, on PostgreSQL, a
   transaction-scoped advisory lock per (node, day) the new batches cover, in sorted order
   (``row_locks``): a concurrent writer of the same rows (a remote-write sender's shards) waits
   here for this one's commit, so step 4 reads what it stored;
3. nodes seen, GPUs, jobs (``dimensions``), with the checks that need the database's view, and
   the jobs' sample times (``jobs.touch_jobs``: every job row a write locks, it locks here);
4. the rows of all new batches as one set of arrays, less the (GPU, ts) samples already
   stored under another batch key, and the fields they bring to stored rows as supplements
   (``unique_rows``): raw samples as compressed blocks (``raw_samples`` + ``sample_codec``),
   1-minute rollups (``rollups``), minute features, the supplements' fields folded once
   (``field_merge``), job times and allocations (``jobs``);
5. every section writer in ``SECTION_WRITERS`` (events, and whatever new protocol sections
   add), each given the same ``WriteContext``.

Deadlocks between concurrent writers (several collector processes) are avoided by touching
shared rows in sorted key order; the caller retries the rare one that remains. Refusals
(``storage.errors.WriteRefused``) carry the batch's ``index``; the caller rolls back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection

from gpufleet.storage import retention
from gpufleet.storage.collectives import write_fabric
from gpufleet.storage.dialect import is_postgres
from gpufleet.storage.dimensions import cluster_ids, gpu_ids, job_ids, mark_nodes_seen, node_ids, referenced_jobs
from gpufleet.storage.events import write_events
from gpufleet.storage.field_merge import fold_supplements
from gpufleet.storage.fields import NF
from gpufleet.storage.jobs import allocations, close_stale_jobs, touch_jobs
from gpufleet.storage.ledger import ledger_insert
from gpufleet.storage.minute_features import fold_rows
from gpufleet.storage.models import gpu_samples_1m, job_samples_1m
from gpufleet.storage.prepared import BatchResult, Prepared, WriteResult
from gpufleet.storage.progress_writes import write_progress_section
from gpufleet.storage.raw_samples import insert_samples
from gpufleet.storage.rollups import rollup, upsert_rollup
from gpufleet.storage.row_locks import lock_node_days
from gpufleet.storage.unique_rows import new_rows
from gpufleet.storage.write_cache import WriteCache

__all__ = ["SECTION_WRITERS", "BatchResult", "Prepared", "SectionWriter", "WriteCache", "WriteContext",
           "WriteResult", "close_stale_jobs", "write_batches"]


@dataclass(slots=True)
class WriteContext:
    """What a section writer gets: the new (non-duplicate) batches and the ids resolved for
    them, inside the write transaction. ``preps[i]`` for ``i`` in ``active``; the per-batch
    lists are indexed by that same ``i``. ``ts``/``gpu_pk``/``job_pk``/``vals`` are the rows of
    every active batch concatenated (``job_pk`` -1 = no job)."""

    conn: Connection
    now: float
    cache: WriteCache
    preps: Sequence[Prepared]
    active: list[int]
    cluster_pks: list[int]
    node_pks: list[int]
    gpu_pks: dict[str, int]
    job_pks: dict[tuple[int, str], int]
    ts: np.ndarray
    gpu_pk: np.ndarray
    job_pk: np.ndarray
    vals: np.ndarray

    def job_pk_of(self, i: int, job_id: str) -> int | None:
        """jobs.id of ``job_id`` in batch ``i``'s cluster, when the batch's jobs, samples or
        allocations name it (a section naming any other job must list it in ``jobs``)."""
        return self.job_pks.get((self.cluster_pks[i], job_id))


# Writes one protocol section of the new batches (raise storage.errors.WriteRefused with the
# batch's index to refuse one). To store a new section: a storage module with such a
# function and its entry here; nothing else in the write path changes.
SectionWriter = Callable[[WriteContext], None]
SECTION_WRITERS: tuple[SectionWriter, ...] = (write_events, write_progress_section, write_fabric)


def write_batches(conn: Connection, batches: Sequence[Prepared], now: float, cache: WriteCache | None = None,
                  sections: Sequence[SectionWriter] = SECTION_WRITERS) -> WriteResult:
    """Store ``batches`` inside the caller's transaction. A batch whose (boot_id, seq) was
    stored before is acknowledged as a duplicate and not stored again. Raises WriteRefused
    (with ``index``) for a batch that can never be stored; the caller rolls back."""
    cache = cache if cache is not None else WriteCache()
    preps = list(batches)
    if any(not isinstance(p, Prepared) for p in preps):
        raise TypeError("write_batches takes Prepared batches: check them with collector.columns.prepare first")
    results: list[BatchResult | None] = [None] * len(preps)

    # Dimensions every batch needs, even a duplicate (the ledger row references its node).
    cids = cluster_ids(conn, (p.batch.agent.cluster for p in preps), cache)
    cluster_pks = [cids[p.batch.agent.cluster] for p in preps]
    node_key = [(c, p.batch.agent.node) for c, p in zip(cluster_pks, preps, strict=True)]
    nids = node_ids(conn, node_key, cache)
    node_pks = [nids[k] for k in node_key]

    active = _new_batches(conn, preps, node_pks, now, results)
    if not active:
        return WriteResult([r for r in results if r is not None])
    # Before any read of stored rows (unique_rows) and any dimension row lock: a writer of the
    # same node-day waits here, holding only its ledger keys, until this transaction commits.
    lock_node_days(conn, preps, active, node_pks)

    mark_nodes_seen(conn, preps, active, node_pks, now, cache)
    gids = gpu_ids(conn, preps, active, node_pks, now, cache)
    jpks = job_ids(conn, referenced_jobs(preps, active, cluster_pks), cache)

    ts, gpu_pk, job_pk, vals = _rows(preps, active, cluster_pks, gids, jpks)
    # Job times now, while this transaction holds no rollup row: job_ids may have locked job
    # rows (a cache miss upserts them), and touching jobs after the rollups let two collector
    # processes deadlock, one holding a job_samples_1m row and waiting on a job row, the other
    # the reverse (PostgreSQL's log, 1,000-connection ingest bench). In job_ids' order too.
    # Copies of stored samples change nothing here: min/max over rows already counted.
    touch_jobs(conn, job_pk, ts, cache, job_keys=jpks)
    # Every field of a (GPU, ts) row once: a row whose fields were all stored under another
    # batch key is skipped, not counted; one bringing fields a stored row lacks stores those
    # fields as a supplement of that row (unique_rows, field_merge).
    nr = new_rows(conn, ts, gpu_pk, vals)
    keep, gpu_order, vals = nr.keep, nr.order, nr.vals
    stored = [preps[i].n for i in active]
    new_of: list[np.ndarray | None] = [None] * len(active)
    if not nr.counted.all():
        ends = np.cumsum(stored)
        masks = [nr.counted[e - n:e] for e, n in zip(ends.tolist(), stored, strict=True)]
        stored = [int(m.sum()) for m in masks]
        new_of = [None if m.all() else m for m in masks]
    supp = None
    if len(nr.supp):
        supp = (ts[nr.supp], gpu_pk[nr.supp], nr.supp_job, nr.supp_vals)
    if not keep.all():
        ts, gpu_pk, job_pk, vals = ts[keep], gpu_pk[keep], job_pk[keep], vals[:, keep]
        gpu_order = np.lexsort((ts, gpu_pk))
    if len(ts) or supp is not None:
        if is_postgres(conn):
            retention.ensure_partitions_in(conn, retention.days_of(ts if supp is None else np.r_[ts, supp[0]]))
        insert_samples(conn, ts, gpu_pk, job_pk, vals, supplements=supp)
    # Rows by (GPU, time) (gpu_order): the GPU rollup and the allocation runs both walk it.
    if len(ts):
        _rollups(conn, ts, gpu_pk, job_pk, vals, gpu_order)
        fold_rows(conn, ts, gpu_pk, job_pk, vals)  # minute features the analysis reads
    if supp is not None:  # after the new rows: a rollup row they create is one a supplement can meet
        fold_supplements(conn, *supp, nr.stored_vals)
    allocations(conn, preps, active, cids, gids, jpks, ts, gpu_pk, job_pk, order=gpu_order, cache=cache, now=now)

    ctx = WriteContext(conn, now, cache, preps, active, cluster_pks, node_pks, gids, jpks, ts, gpu_pk, job_pk, vals)
    for section in sections:
        section(ctx)

    for i, n, m in zip(active, stored, new_of, strict=True):
        results[i] = BatchResult(n, False, m)
    return WriteResult([r for r in results if r is not None])


def _new_batches(conn: Connection, preps: list[Prepared], node_pks: list[int], now: float,
                 results: list[BatchResult | None]) -> list[int]:
    """Positions of the batches not stored before (ledger keys inserted now); the others
    get a duplicate result. A key repeated within the call counts once."""
    seen: set[tuple[str, int]] = set()
    ledger: list[dict[str, Any]] = []
    for i, p in enumerate(preps):
        if p.key in seen:
            results[i] = BatchResult(0, True)
            continue
        seen.add(p.key)
        ledger.append({"boot_id": p.key[0], "seq": p.key[1], "node_id": node_pks[i], "received_at": now, "rows": p.n})
    ledger.sort(key=lambda r: (r["boot_id"], r["seq"]))
    new_keys = ledger_insert(conn, ledger) if ledger else set()
    active: list[int] = []
    for i, p in enumerate(preps):
        if results[i] is None:
            if p.key in new_keys:
                active.append(i)
            else:
                results[i] = BatchResult(0, True)
    return active


def _rows(preps: list[Prepared], active: list[int], cluster_pks: list[int], gids: dict[str, int],
          jpks: dict[tuple[int, str], int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """ts, gpu_pk, job_pk (-1 = none) and the value matrix of every active batch's rows."""
    ts = np.concatenate([preps[i].ts for i in active])
    gpu_parts, job_parts = [], []
    for i in active:
        p = preps[i]
        cid = cluster_pks[i]
        # Map the few distinct values, then the rows with a C-level map (no per-row bytecode).
        gmap = {u: gids[u] for u in set(p.gpu)}
        jmap = {j: (-1 if j is None else jpks[(cid, j)]) for j in set(p.job)}
        gpu_parts.append(np.fromiter(map(gmap.__getitem__, p.gpu), dtype=np.int64, count=p.n))
        job_parts.append(np.fromiter(map(jmap.__getitem__, p.job), dtype=np.int64, count=p.n))
    gpu_pk = np.concatenate(gpu_parts) if gpu_parts else np.empty(0, np.int64)
    job_pk = np.concatenate(job_parts) if job_parts else np.empty(0, np.int64)
    vals = np.concatenate([preps[i].vals for i in active], axis=1) if active else np.empty((NF, 0))
    return ts, gpu_pk, job_pk, vals


def _rollups(conn: Connection, ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray, vals: np.ndarray,
             gpu_order: np.ndarray | None) -> None:
    k, b, n, lt, agg, carry = rollup(gpu_pk, ts, vals, job_pk, order=gpu_order)
    upsert_rollup(conn, gpu_samples_1m, "gpu_pk", k, b, n, lt, agg, carry)
    has_job = job_pk >= 0
    if has_job.any():
        # Sorting the job rows' numbers (not masked copies of the arrays) lets rollup
        # gather the sample matrix once.
        rows = np.flatnonzero(has_job)
        k, b, n, lt, agg, _ = rollup(job_pk, ts, vals, None, order=rows[np.lexsort((ts[rows], job_pk[rows]))])
        upsert_rollup(conn, job_samples_1m, "job_pk", k, b, n, lt, agg, None)
