"""The job lifecycle and GPU allocations: jobs' first/last sample times from the rows
(``touch_jobs``, which also reopens a job sampled after it ended), allocations opened and
closed as each GPU's job changes (``allocations``), and running jobs nobody reports any more
ended (``close_stale_jobs``, called by the collector's maintenance and the import)."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np
from sqlalchemy import BindParameter, Connection, and_, bindparam, case, literal_column, select, update

from gpufleet.storage.dialect import is_postgres
from gpufleet.storage.dimensions import insert_for
from gpufleet.storage.models import Allocation, Job
from gpufleet.storage.prepared import Prepared
from gpufleet.storage.write_cache import ALLOC_TRUST_S, JOB_TOUCH_EVERY_S, STALE_JOB_S, WriteCache


def touch_jobs(conn: Connection, job_pk: np.ndarray, ts: np.ndarray, cache: WriteCache,
               job_keys: dict[tuple[int, str], int] | None = None) -> None:
    """start_ts / last_sample_ts from samples; a job sampled after it was marked ended runs again.
    ``job_keys`` ((cluster, job id) -> pk, what job_ids returned) updates the rows in job_ids'
    lock order, so two writers lock job rows in the same order."""
    m = job_pk >= 0
    if not m.any():
        return
    jp, t = job_pk[m], ts[m]
    order = np.argsort(jp, kind="stable")
    jp, t = jp[order], t[order]
    starts = np.flatnonzero(np.r_[True, jp[1:] != jp[:-1]])
    lo, hi = np.minimum.reduceat(t, starts), np.maximum.reduceat(t, starts)
    todo = []
    for p, a, b in zip(jp[starts].tolist(), lo.tolist(), hi.tolist(), strict=True):
        seen = cache.job_times.get(p)
        if seen is None or a < seen[0] or b > seen[1] + JOB_TOUCH_EVERY_S:
            todo.append({"pk": p, "lo": a, "hi": b})
            cache.job_times[p] = (min(a, seen[0]) if seen else a, max(b, seen[1]) if seen else b)
    if not todo:
        return
    if job_keys is not None:  # usually nothing to touch (the cache): invert only when there is
        key_of = {pk: key for key, pk in job_keys.items()}
        todo.sort(key=lambda r: key_of.get(r["pk"], (r["pk"], "")))
    jt = Job.__table__
    lo_p: BindParameter[float] = bindparam("lo")
    hi_p: BindParameter[float] = bindparam("hi")
    reopen = and_(jt.c.end_ts.is_not(None), hi_p > jt.c.end_ts)
    conn.execute(
        update(jt).where(jt.c.id == bindparam("pk")).values(
            start_ts=case((or_null_or_gt(jt.c.start_ts, lo_p), lo_p), else_=jt.c.start_ts),
            last_sample_ts=case((or_null_or_lt(jt.c.last_sample_ts, hi_p), hi_p), else_=jt.c.last_sample_ts),
            state=case((reopen, literal_column("'running'")), else_=jt.c.state),
            end_ts=case((reopen, None), else_=jt.c.end_ts),
        ),
        todo,
    )


def or_null_or_gt(col: Any, v: Any) -> Any:
    return col.is_(None) | (col > v)


def or_null_or_lt(col: Any, v: Any) -> Any:
    return col.is_(None) | (col < v)


def allocations(conn: Connection, preps: list[Prepared], active: list[int], cids: dict[str, int],
                 gids: dict[str, int], jpks: dict[tuple[int, str], int], ts: np.ndarray, gpu_pk: np.ndarray,
                 job_pk: np.ndarray, order: np.ndarray | None = None, cache: WriteCache | None = None,
                 now: float = 0.0) -> None:
    """Open/close allocations as each GPU's job changes (from samples, ordered by time).
    ``order``: ``np.lexsort((ts, gpu_pk))`` when the caller already has it. With ``cache``,
    GPUs whose rows all continue the open allocation read recently are not read again (the
    steady state: a GPU keeps its job for hours, and this query was a group commit's largest
    remaining Python cost)."""
    since: dict[tuple[int, int], float] = {}
    for i in active:
        cid = cids[preps[i].batch.agent.cluster]
        for a in preps[i].batch.allocations:
            if a.gpu_uuid in gids and math.isfinite(a.since):
                since[(gids[a.gpu_uuid], jpks[(cid, a.job_id)])] = a.since
    if not len(ts):
        return
    # Runs of constant (GPU, job) in time order: only the change points are visited in Python.
    if order is None:
        order = np.lexsort((ts, gpu_pk))
    g, j, t = gpu_pk[order], job_pk[order], ts[order]
    change = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (j[1:] != j[:-1])])
    runs: dict[int, list[tuple[float, int | None]]] = {}
    for gg, jj, tt in zip(g[change].tolist(), j[change].tolist(), t[change].tolist(), strict=True):
        runs.setdefault(gg, []).append((tt, None if jj < 0 else jj))
    if cache is not None:
        known = cache.allocs
        for gpu in [gpu for gpu, rs in runs.items() if len(rs) == 1 and gpu in known]:
            jp0, start0, read_at = known[gpu]
            if rs_continue(runs[gpu][0], jp0, start0) and now - read_at < ALLOC_TRUST_S:
                del runs[gpu]
        if not runs:
            return
    at = Allocation.__table__
    gpus = sorted(runs)
    # Raw SQL with one array parameter: an IN list of thousands of GPUs is slow to compile.
    if is_postgres(conn):
        q = ("SELECT id, gpu_pk, job_pk, start_ts FROM allocations WHERE end_ts IS NULL "
             "AND gpu_pk = ANY(%s::int4[]) ORDER BY gpu_pk, start_ts")
        rows = conn.exec_driver_sql(q, (gpus,)).all()
    else:
        q = ("SELECT id, gpu_pk, job_pk, start_ts FROM allocations WHERE end_ts IS NULL "
             "AND gpu_pk IN (SELECT value FROM json_each(?)) ORDER BY gpu_pk, start_ts")
        rows = conn.exec_driver_sql(q, (msgspec.json.encode(gpus).decode(),)).all()
    open_rows = {g: (aid, jp, st) for aid, g, jp, st in rows}
    closes: list[dict[str, Any]] = []
    opens: list[dict[str, Any]] = []
    for gpu in sorted(runs):
        cur = open_rows.get(gpu)  # (alloc id or None for a new one, job_pk, start)
        writes = len(closes) + len(opens)
        for t0, jp in runs[gpu]:
            if cur is not None and t0 < cur[2]:
                continue  # an old batch arriving late: it cannot rewrite the GPU's history
            if cur is not None and cur[1] == jp:
                continue
            if cur is not None:
                if cur[0] is not None:
                    closes.append({"aid": cur[0], "end": t0})
                else:
                    opens[-1]["end_ts"] = t0
                cur = None
            if jp is not None:
                start = min(since.get((gpu, jp), t0), t0)
                opens.append({"job_pk": jp, "gpu_pk": gpu, "start_ts": start, "end_ts": None})
                cur = (None, jp, start)
        if cache is not None:
            if writes == len(closes) + len(opens):  # the database's state, confirmed unchanged
                cache.allocs[gpu] = (cur[1], cur[2], now) if cur is not None else (None, -math.inf, now)
            else:  # what we wrote may lose to a concurrent collector: read it next time
                cache.allocs.pop(gpu, None)
    if closes:
        conn.execute(update(at).where(at.c.id == bindparam("aid")).values(end_ts=bindparam("end")), closes)
    if opens:
        # A concurrent collector that opened the same GPU's allocation first wins; the
        # partial unique index makes this one a no-op instead of a second open row.
        ins = insert_for(conn, at).on_conflict_do_nothing(index_elements=["gpu_pk"], index_where=at.c.end_ts.is_(None))
        closed = [o for o in opens if o["end_ts"] is not None]
        still_open = [o for o in opens if o["end_ts"] is None]
        if closed:
            conn.execute(at.insert(), closed)
        if still_open:
            conn.execute(ins, still_open)


def rs_continue(run: tuple[float, int | None], job_pk: int | None, start: float) -> bool:
    """A GPU's only run in a group (starting at ``run[0]``, of job ``run[1]``) continues its
    open allocation (``job_pk`` since ``start``; None = no open allocation): nothing to write."""
    return run[1] == job_pk and run[0] >= start



def close_stale_jobs(conn: Connection, now: float, stale_after: float = STALE_JOB_S) -> int:
    """Mark running jobs that no node has reported for ``stale_after`` seconds as ended (at
    their last sample) and close their open allocations. Returns how many jobs ended."""
    jt, at = Job.__table__, Allocation.__table__
    cutoff = now - stale_after
    last = jt.c.last_sample_ts
    stale = select(jt.c.id).where(jt.c.state == "running",
                                  ((last.is_not(None)) & (last < cutoff))
                                  | (last.is_(None) & jt.c.start_ts.is_not(None) & (jt.c.start_ts < cutoff)))
    ids = sorted(conn.execute(stale).scalars().all())
    if not ids:
        return 0
    for chunk in (ids[i:i + 1000] for i in range(0, len(ids), 1000)):
        conn.execute(update(jt).where(jt.c.id.in_(chunk), jt.c.state == "running")
                     .values(state="ended", end_ts=case((last.is_(None), jt.c.start_ts), else_=last)))
        end = select(jt.c.end_ts).where(jt.c.id == at.c.job_pk).scalar_subquery()
        conn.execute(update(at).where(at.c.job_pk.in_(chunk), at.c.end_ts.is_(None)).values(end_ts=end))
    return len(ids)
