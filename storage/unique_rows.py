"""One sample per (GPU, ts): which rows of a write are new. The ledger makes a *batch* stored
once; this makes a *sample* stored once when the same rows arrive under different batch keys
(an agent's spool replayed after its identity was reset, an import overlapping live data, two
senders for one GPU). The first stored wins; later copies are skipped and not counted.

Cost model: the common case (rows later than everything stored for their GPU-minute) is
decided from the GPU-minute rollup rows alone (their ``last_ts`` bounds every stored sample of
that minute): one indexed join per group commit, which returns nothing in the steady state.
Only a GPU-minute where new rows do not all come after ``last_ts`` (late or repeated data)
reads raw timestamps, for those GPUs and that time span only: the blocks overlapping it,
found by the (gpu_pk, t0) index, with only their timestamps decoded (``raw_read.stored_keys``).

Limits (docs/protocol.md): two transactions writing the same GPU-minute concurrently do not
see each other's rows, and rows older than raw retention are not compared (their rollups are
kept longer than their raw rows)."""

from __future__ import annotations

import msgspec
import numpy as np
from sqlalchemy import Connection

from gpufleet.storage.dialect import is_postgres
from gpufleet.storage.pg_arrays import pg_array, query_prepared
from gpufleet.storage.raw_read import stored_keys
from gpufleet.storage.rollups import BUCKET_S


def new_rows(conn: Connection, ts: np.ndarray, gpu_pk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mask of the rows to store (first copies within the write, and not already stored), and
    ``np.lexsort((ts, gpu_pk))`` of the input rows (callers reuse it when nothing was dropped)."""
    keep = np.ones(len(ts), bool)
    order = np.lexsort((ts, gpu_pk))  # stable: equal keys stay in input order
    if not len(ts):
        return keep, order
    g, t = gpu_pk[order], ts[order]
    if len(ts) > 1:
        again = np.flatnonzero((g[1:] == g[:-1]) & (t[1:] == t[:-1])) + 1
        keep[order[again]] = False
    # The earliest new row of each GPU-minute (sorted by GPU then time, the minute follows ts),
    # asked against the stored rows' newest: only overlapping GPU-minutes come back.
    b = np.floor(t / BUCKET_S) * BUCKET_S
    starts = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (b[1:] != b[:-1])])
    overlap = _overlapping(conn, g[starts], b[starts], t[starts])
    if not overlap:
        return keep, order
    og = sorted({gg for gg, _ in overlap})
    seen = stored_keys(conn, og, min(bb for _, bb in overlap), max(bb for _, bb in overlap) + BUCKET_S)
    if seen:
        rows = np.flatnonzero(keep & np.isin(gpu_pk, og))
        for r, gg, tt in zip(rows.tolist(), gpu_pk[rows].tolist(), ts[rows].tolist(), strict=True):
            if (gg, tt) in seen:
                keep[r] = False
    return keep, order


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
