"""Raw samples into ``gpu_sample_blocks``: the rows of one write grouped by (GPU, job,
``BLOCK_S`` window), each group one compressed block (``sample_codec``), the blocks written
with binary COPY on PostgreSQL and one ``executemany`` on SQLite. The raw layout's one write
seam; ``raw_read`` is its one read seam.

Why group by job too: a block carries one ``job_pk`` so a job's raw samples are found by
the (job_pk, t0) index without decoding other jobs' blocks. Why a fixed window: a block never
crosses a window (nor so a UTC day, the partition), so a lookup for [lo, hi) only needs blocks
with ``lo - BLOCK_S < t0 < hi``, an index range.

Supplement rows (fields of a (GPU, ts) row stored earlier, which a later write brought:
``unique_rows``) go in blocks of their own whose ``n`` column is 0: ``n`` counts the samples
a block adds, so ``count_raw_samples`` stays a sum of ``n``; the block's header still has
its row count, and compaction coalesces it into its window's block (``n`` then counts
each row once)."""

from __future__ import annotations

import numpy as np
from sqlalchemy import Connection

from gpufleet.storage.dialect import is_postgres
from gpufleet.storage.sample_codec import LZ4, encode_blocks

BLOCK_S = 600.0  # divides a day: blocks stay inside their daily partition
BLOCK_COLUMNS = ("gpu_pk", "job_pk", "t0", "t1", "n", "data")
COPY_SQL = f"COPY gpu_sample_blocks ({', '.join(BLOCK_COLUMNS)}) FROM STDIN WITH (FORMAT binary)"
_COPY_TYPES = ("int4", "int4", "float8", "float8", "int4", "bytea")
_INSERT_SQL = f"INSERT INTO gpu_sample_blocks ({', '.join(BLOCK_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?)"

BlockRow = tuple[int, int | None, float, float, int, bytes]


def block_rows(ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray, vals: np.ndarray, *,
               codec: int = LZ4) -> list[BlockRow]:
    """(gpu_pk, job_pk or None, t0, t1, n, data) of the blocks holding these samples
    (``job_pk`` < 0 = no job; (gpu, ts) unique, as the write path guarantees). ``codec``:
    LZ4 on the write path, ZSTD where compaction rewrites a closed window."""
    if not len(ts):
        return []
    win = np.floor(ts / BLOCK_S)
    order = np.lexsort((ts, win, job_pk, gpu_pk))
    g, j, w, t = gpu_pk[order], job_pk[order], win[order], ts[order]
    cut = (g[1:] != g[:-1]) | (j[1:] != j[:-1]) | (w[1:] != w[:-1])
    starts = np.flatnonzero(np.r_[True, cut])
    ends = np.r_[starts[1:], len(t)] - 1
    data = encode_blocks(t, vals[:, order], starts, codec=codec)
    jobs = j[starts].tolist()
    return [(gg, None if jj < 0 else jj, t0, t1, int(e - s + 1), d)
            for gg, jj, t0, t1, s, e, d in zip(g[starts].tolist(), jobs, t[starts].tolist(), t[ends].tolist(),
                                               starts.tolist(), ends.tolist(), data, strict=True)]


def supplement_block_rows(ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray, vals: np.ndarray
                          ) -> list[BlockRow]:
    """Blocks of supplement rows (each completing a row stored in another block): n = 0."""
    return [(g, j, t0, t1, 0, d) for g, j, t0, t1, _, d in block_rows(ts, gpu_pk, job_pk, vals)]


def write_block_rows(conn: Connection, rows: list[BlockRow]) -> None:
    if not rows:
        return
    if is_postgres(conn):
        raw = conn.connection.driver_connection
        # the DBAPI connection is Optional in SQLAlchemy's types; set on a checked-out connection
        with raw.cursor() as cur, cur.copy(COPY_SQL) as cp:  # type: ignore[union-attr]
            cp.set_types(list(_COPY_TYPES))
            for r in rows:
                cp.write_row(r)
        return
    conn.exec_driver_sql(_INSERT_SQL, rows)


def insert_samples(conn: Connection, ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray, vals: np.ndarray,
                   supplements: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
    """Store these samples (``vals`` (NF, n), NaN = absent) inside the caller's transaction,
    and ``supplements`` (ts, gpu_pk, job_pk, vals: fields of stored rows) in one write."""
    rows = block_rows(ts, gpu_pk, job_pk, vals)
    if supplements is not None and len(supplements[0]):
        rows += supplement_block_rows(*supplements)
    write_block_rows(conn, rows)
