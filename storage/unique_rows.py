"""One sample per (GPU, ts): which rows of a write are new. The ledger makes a *batch* stored
once; this makes a *sample* stored once when the same rows arrive under different batch keys
(an agent's spool replayed after its identity was reset, an import overlapping live data, two
senders for one GPU). The first stored wins; later copies are skipped and not counted.

Cost model: the common case (rows later than everything stored for their GPU-minute) is
decided from the GPU-minute rollup rows alone (their ``last_ts`` bounds every stored sample of
that minute), one indexed read per group commit. Only a GPU-minute where new rows do not all
come after ``last_ts`` (late or repeated data) reads raw timestamps, for those GPUs and that
time span only.

Limits (docs/protocol.md): two transactions writing the same GPU-minute concurrently do not
see each other's rows, and rows older than raw retention are not compared (their rollups are
kept longer than their raw rows)."""

from __future__ import annotations

import msgspec
import numpy as np
from sqlalchemy import Connection

from gpufleet.storage.rollups import BUCKET_S


def first_copies(ts: np.ndarray, gpu_pk: np.ndarray) -> np.ndarray:
    """Mask of the rows that are the first of their (gpu_pk, ts) in input order."""
    keep = np.ones(len(ts), bool)
    if len(ts) < 2:
        return keep
    order = np.lexsort((ts, gpu_pk))  # stable: equal keys stay in input order
    g, t = gpu_pk[order], ts[order]
    again = np.flatnonzero((g[1:] == g[:-1]) & (t[1:] == t[:-1])) + 1
    keep[order[again]] = False
    return keep


def new_rows(conn: Connection, ts: np.ndarray, gpu_pk: np.ndarray) -> np.ndarray:
    """Mask of the rows to store: first copies within the write, and not already stored."""
    keep = first_copies(ts, gpu_pk)
    if not len(ts):
        return keep
    bucket = np.floor(ts / BUCKET_S) * BUCKET_S
    gpus = np.unique(gpu_pk).tolist()
    lo, hi = float(bucket.min()), float(bucket.max())
    stored = _rollup_last_ts(conn, gpus, lo, hi)
    if not stored:
        return keep
    # The earliest new row of each GPU-minute against the stored rows' newest.
    order = np.lexsort((ts, bucket, gpu_pk))
    g, b, t = gpu_pk[order], bucket[order], ts[order]
    starts = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (b[1:] != b[:-1])])
    overlap = [(gg, bb) for gg, bb, tt in zip(g[starts].tolist(), b[starts].tolist(), t[starts].tolist(), strict=True)
               if (last := stored.get((gg, bb))) is not None and tt <= last]
    if not overlap:
        return keep
    og = sorted({gg for gg, _ in overlap})
    seen = _raw_keys(conn, og, min(bb for _, bb in overlap), max(bb for _, bb in overlap) + BUCKET_S)
    if seen:
        rows = np.flatnonzero(keep & np.isin(gpu_pk, og))
        for r, gg, tt in zip(rows.tolist(), gpu_pk[rows].tolist(), ts[rows].tolist(), strict=True):
            if (gg, tt) in seen:
                keep[r] = False
    return keep


def _rollup_last_ts(conn: Connection, gpus: list[int], lo: float, hi: float) -> dict[tuple[int, float], float]:
    if conn.dialect.name == "postgresql":
        q = ("SELECT gpu_pk, bucket, last_ts FROM gpu_samples_1m WHERE gpu_pk = ANY(%s::int4[]) "
             "AND bucket >= %s AND bucket <= %s")
        rows = conn.exec_driver_sql(q, (gpus, lo, hi)).all()
    else:
        q = ("SELECT gpu_pk, bucket, last_ts FROM gpu_samples_1m WHERE gpu_pk IN (SELECT value FROM json_each(?)) "
             "AND bucket >= ? AND bucket <= ?")
        rows = conn.exec_driver_sql(q, (msgspec.json.encode(gpus).decode(), lo, hi)).all()
    return {(g, b): lt for g, b, lt in rows}


def _raw_keys(conn: Connection, gpus: list[int], lo: float, hi: float) -> set[tuple[int, float]]:
    if conn.dialect.name == "postgresql":
        q = "SELECT gpu_pk, ts FROM gpu_samples WHERE ts >= %s AND ts < %s AND gpu_pk = ANY(%s::int4[])"
        rows = conn.exec_driver_sql(q, (lo, hi, gpus)).all()
    else:
        q = "SELECT gpu_pk, ts FROM gpu_samples WHERE ts >= ? AND ts < ? AND gpu_pk IN (SELECT value FROM json_each(?))"
        rows = conn.exec_driver_sql(q, (lo, hi, msgspec.json.encode(gpus).decode())).all()
    return {(g, t) for g, t in rows}
