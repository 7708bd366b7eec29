"""Every field of a (GPU, ts) row stored once: which rows of a write are new, and which fields
of rows stored before they bring. The ledger makes a *batch* stored once; this makes a *field
sample* stored once when the same row arrives under different batch keys (an agent's spool
replayed after its identity was reset, an import overlapping live data, two senders for one
GPU) or in pieces (a Prometheus remote-write sender's shards each carry some of a GPU's
series, so one row's fields come in several requests). Per field the first stored value
wins: a row whose fields were all stored is skipped (not counted as stored); a row that
brings fields the stored row lacks becomes a *supplement* row, those fields only (the stored
ones masked to absent), which the raw store keeps beside the first (``raw_samples``: its
block adds no sample to ``n``) and every raw read coalesces (``sample_codec.coalesce``). The
rollups and minute features fold a supplement's fields without counting its row again
(``field_merge``). Copies within one write are coalesced the same way before anything is
stored.

Cost model: the common case (rows later than everything stored for their GPU-minute) is
decided from the GPU-minute rollup rows alone (their ``last_ts`` bounds every stored sample of
that minute): one indexed join per group commit, which returns nothing in the steady state.
Only a GPU-minute where new rows do not all come after ``last_ts`` (late, repeated or split
data) reads raw rows, for those GPUs and that time span only: the blocks overlapping it,
found by the (gpu_pk, t0) index, their timestamps decoded first; only the GPUs where a row of
the write meets a stored (GPU, ts) are decoded with their values (which fields a stored row
has). A late row at a time nobody stored (a scrape delivered after the next one) decodes no
field.

Concurrent writers: what is read here must include every row a concurrent transaction is
writing for the same GPU-minute, so on PostgreSQL the write takes its (node, day) advisory
locks before this runs (``row_locks``): a second writer of the same rows waits for the first's
commit, and these reads (each statement a new READ COMMITTED snapshot) then see its rows.
Limit (docs/protocol.md): rows older than raw retention are not compared (their rollups are
kept longer than their raw rows)."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
from sqlalchemy import Connection

from gpufleet.storage.dialect import is_postgres
from gpufleet.storage.pg_arrays import pg_array, query_prepared
from gpufleet.storage.raw_read import fetch_blocks, samples_of, stored_times
from gpufleet.storage.rollups import BUCKET_S
from gpufleet.storage.sample_codec import first_present


@dataclass(slots=True)
class NewRows:
    """What a write stores. ``keep``: the input rows to store as new rows; ``vals``: the input
    values with each kept row's copies within the write coalesced into it (the input array
    itself when the write has no such copies); ``order``: ``np.lexsort((ts, gpu_pk))`` of the
    input rows; ``counted``: the input rows that brought at least one field (what a batch
    reports as stored). ``supp``: input rows completing a stored row, ``supp_vals`` their new
    fields only (NaN elsewhere), ``supp_job`` the stored row's job_pk (-1 = none), and
    ``stored_vals`` the stored row's values (what the minute features folded for it)."""

    keep: np.ndarray
    order: np.ndarray
    vals: np.ndarray
    counted: np.ndarray
    supp: np.ndarray
    supp_vals: np.ndarray
    supp_job: np.ndarray
    stored_vals: np.ndarray


def new_rows(conn: Connection, ts: np.ndarray, gpu_pk: np.ndarray, vals: np.ndarray) -> NewRows:
    """Which rows (and fields) of the write ``ts``/``gpu_pk``/``vals`` (NF, n) to store."""
    n = len(ts)
    keep = np.ones(n, bool)
    order = np.lexsort((ts, gpu_pk))  # stable: equal keys stay in input order
    nf = vals.shape[0]
    none = np.empty(0, np.int64)
    out = NewRows(keep, order, vals, keep, none, np.empty((nf, 0)), none, np.empty((nf, 0)))
    if not n:
        return out
    g, t = gpu_pk[order], ts[order]
    # brought[:, r]: the fields row r is the first to bring (None while no row repeats).
    brought: np.ndarray | None = None
    if n > 1:
        again = (g[1:] == g[:-1]) & (t[1:] == t[:-1])
        if again.any():
            brought = _coalesce_copies(out, again)
    # The earliest new row of each GPU-minute (sorted by GPU then time, the minute follows ts),
    # asked against the stored rows' newest: only overlapping GPU-minutes come back.
    b = np.floor(t / BUCKET_S) * BUCKET_S
    starts = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (b[1:] != b[:-1])])
    overlap = _overlapping(conn, g[starts], b[starts], t[starts])
    if overlap:
        brought = _against_stored(conn, out, ts, gpu_pk, overlap, brought)
    if brought is not None:
        out.counted = np.asarray(brought.any(axis=0))
    return out


def _coalesce_copies(out: NewRows, again: np.ndarray) -> np.ndarray:
    """Fold the write's copies of a (GPU, ts) row into its first copy (per field the first
    value wins), drop the others from ``keep``; returns which fields each row brought."""
    n = len(out.order)
    sorted_vals = out.vals[:, out.order]
    starts = np.flatnonzero(np.r_[True, ~again])
    first, merged = first_present(sorted_vals, starts)  # first: (NF, keys), the sorted row bringing each field
    brought = np.zeros(out.vals.shape, bool)
    fi, ki = np.nonzero(first < n)
    brought[fi, out.order[first[fi, ki]]] = True
    heads = out.order[starts]
    vals = out.vals.copy()
    vals[:, heads] = merged
    out.vals = vals
    out.keep = np.zeros(n, bool)
    out.keep[heads] = True
    return brought


def _against_stored(conn: Connection, out: NewRows, ts: np.ndarray, gpu_pk: np.ndarray,
                    overlap: list[tuple[int, float]], brought: np.ndarray | None) -> np.ndarray | None:
    """Rows (of ``keep``) that a stored row of an overlapping GPU-minute already holds: all
    their fields stored -> dropped; some new -> a supplement of those fields."""
    og = sorted({gg for gg, _ in overlap})
    lo, hi = min(bb for _, bb in overlap), max(bb for _, bb in overlap) + BUCKET_S
    blocks = fetch_blocks(conn, gpu_pks=og, t0=lo, t1=hi)
    # Timestamps first: a late row (a scrape delivered after the next one) lands in a stored
    # GPU-minute at a time nobody stored, and then no field needs decoding. Only the GPUs
    # holding a stored (GPU, ts) of this write are decoded with their values.
    sg, sts = stored_times(blocks, t0=lo, t1=hi)
    cand = np.flatnonzero(out.keep & np.isin(gpu_pk, og))
    stored = np.isin(_keys(gpu_pk[cand], ts[cand]), _keys(sg, sts))
    if not stored.any():
        return brought
    rows = cand[stored]
    hit_gpus = set(gpu_pk[rows].tolist())
    st = samples_of([b for b in blocks if b[0] in hit_gpus], t0=lo, t1=hi)  # one row per stored (GPU, ts)
    where = {k: i for i, k in enumerate(zip(st.gpu_pk.tolist(), st.ts.tolist(), strict=True))}
    hit = [(r, where.get(k)) for r, k in zip(rows.tolist(), zip(gpu_pk[rows].tolist(), ts[rows].tolist(),
                                                                  strict=True), strict=True)]
    pairs = [(r, i) for r, i in hit if i is not None]
    if not pairs:
        return brought
    r = np.array([p[0] for p in pairs], np.int64)
    i = np.array([p[1] for p in pairs], np.int64)
    sv = st.vals[:, i]
    new_fields = ~np.isnan(out.vals[:, r]) & np.isnan(sv)
    if brought is None:
        brought = ~np.isnan(out.vals)
    # A field the stored row has is brought by nobody; a kept row's copies keep their share.
    stale = np.zeros(out.vals.shape, bool)
    stale[:, r] = ~np.isnan(sv)
    if len(r) and not out.keep.all():  # copies within the write: mask their fields too
        stale |= _spread_to_copies(out, stale)
    brought &= ~stale
    out.keep = out.keep.copy()
    out.keep[r] = False
    has_new = new_fields.any(axis=0)
    out.supp = r[has_new]
    out.supp_vals = np.where(new_fields[:, has_new], out.vals[:, out.supp], np.nan)
    out.supp_job = st.job_pk[i[has_new]]
    out.stored_vals = sv[:, has_new]
    return brought


def _keys(gpu_pk: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """(GPU, ts) pairs as one comparable value each (16 bytes: the pk, the float's bits), so
    ``np.isin`` matches pairs exactly as the tuples (int, float) compare."""
    k = np.empty(len(ts), dtype=[("g", "<i8"), ("t", "<u8")])
    k["g"] = gpu_pk
    # +0.0 for -0.0: the tuples compare equal, their bits do not (a timestamp is never -0.0,
    # but the rule is the tuples')
    k["t"] = (np.asarray(ts, np.float64) + 0.0).view(np.uint64)
    return k.view("V16").reshape(-1)


def _spread_to_copies(out: NewRows, head_mask: np.ndarray) -> np.ndarray:
    """``head_mask`` (set on kept rows) copied to every row of the same (GPU, ts) key."""
    o = out.order
    s = head_mask[:, o]
    key_start = out.keep[o]  # the first sorted row of each key is its kept one
    grp = np.cumsum(key_start) - 1
    spread = np.zeros(head_mask.shape, bool)
    spread[:, o] = s[:, key_start][:, grp]
    return spread


def _overlapping(conn: Connection, gpus: np.ndarray, buckets: np.ndarray, first_ts: np.ndarray
                 ) -> list[tuple[int, float]]:
    """(gpu_pk, bucket) of the GPU-minutes whose stored rollup row's last_ts is not before the
    new rows' first ts there: the only ones that can hold a copy."""
    if is_postgres(conn):
        # Binary array parameters and a prepared plan: this runs in every group commit, and
        # dumping three Python lists as text arrays cost more than the query itself.
        q = ("SELECT r.gpu_pk, r.bucket FROM unnest(%s::int4[], %s::float8[], %s::float8[]) AS k(g, b, t) "
             "JOIN gpu_samples_1m r ON r.gpu_pk = k.g AND r.bucket = k.b WHERE k.t <= r.last_ts")
        rows = query_prepared(conn, q, [pg_array(gpus, integer=True), pg_array(buckets, integer=False),
                                        pg_array(first_ts, integer=False)])
        return [(int(g), float(b)) for g, b in rows]
    q = ("SELECT r.gpu_pk, r.bucket FROM (SELECT json_extract(value, '$[0]') AS g, json_extract(value, '$[1]') AS b, "
         "json_extract(value, '$[2]') AS t FROM json_each(?)) AS k "
         "JOIN gpu_samples_1m r ON r.gpu_pk = k.g AND r.bucket = k.b WHERE k.t <= r.last_ts")
    arg = msgspec.json.encode(list(zip(gpus.tolist(), buckets.tolist(), first_ts.tolist(), strict=True))).decode()
    return [(g, b) for g, b in conn.exec_driver_sql(q, (arg,)).all()]
