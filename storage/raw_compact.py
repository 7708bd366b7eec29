"""Merge the raw blocks of a closed window into one: ``compact_windows(engine, now)``, run by
the maintenance loop.

Why: the write path stores one block per GPU per group commit, a few seconds of samples, and
a block's fixed costs (tuple header, columns, two index entries, zstd frame) are then paid
every few samples: bench/ingest/raw_layouts.py measured 92 B per GPU-sample for 10-second
blocks against 52 B for a merged 600-second one. Once a ``BLOCK_S`` window has closed (plus a margin
for late group commits), its blocks of one (GPU, job) are decoded, merged and written back as
one (zstd-compressed: the write path's blocks are LZ4, faster and ~8% larger), in one
transaction.

Safety: exactly the rows read are deleted (by ``ctid`` under ``FOR UPDATE`` on PostgreSQL, by
``rowid`` on SQLite), so a block a writer adds meanwhile is never lost, and two compactors do
not merge the same blocks twice (the second waits on the row locks, then no longer finds
them). A (GPU, ts) row stored in several blocks (a supplement row: ``unique_rows``; or a
sample stored twice by the race that ``unique_rows`` documents, two transactions writing the
same GPU-minute at once) becomes one row, each field its first stored value. Late batches for a window
compacted already just add a block; a later pass merges it while the window is within
``lookback_s``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, text

from gpufleet.storage.dialect import is_postgres
from gpufleet.storage.raw_samples import BLOCK_S, block_rows, write_block_rows
from gpufleet.storage.sample_codec import ZSTD, coalesce, decode_blocks

COMPACT_AFTER_S = 120.0  # a window is merged this long after it closed (late group commits)
LOOKBACK_S = 6 * 3600.0  # windows older than this are left as they are
_GROUPS_PER_TX = 500


def compact_windows(engine: Engine, now: float, *, lookback_s: float = LOOKBACK_S,
                    max_groups: int = 20_000) -> int:
    """Merge the blocks of each (GPU, job, closed window) holding more than one; returns the
    number of windows merged (at most about ``max_groups`` a call)."""
    hi = math.floor((now - COMPACT_AFTER_S) / BLOCK_S) * BLOCK_S  # windows starting before hi are closed
    lo = hi - lookback_s
    with engine.connect() as c:
        # The window number is floor(t0 / w): PostgreSQL's CAST rounds (a window's blocks starting
        # in its second half were numbered as the next window and never merged); SQLite's CAST
        # truncates, which is the floor for these positive times (it may lack FLOOR()).
        win = "CAST(FLOOR(t0 / :w) AS INTEGER)" if is_postgres(c) else "CAST(t0 / :w AS INTEGER)"
        groups = c.execute(text(
            f"SELECT gpu_pk, {win} AS win FROM gpu_sample_blocks WHERE t0 >= :lo AND t0 < :hi "
            "GROUP BY gpu_pk, job_pk, win HAVING count(*) > 1 ORDER BY win, gpu_pk LIMIT :m"),
            {"w": BLOCK_S, "lo": lo, "hi": hi, "m": max_groups}).all()
    merged = 0
    for i in range(0, len(groups), _GROUPS_PER_TX):
        part = groups[i:i + _GROUPS_PER_TX]
        with engine.begin() as c:
            merged += _merge(c, sorted({int(g) for g, _ in part}), min(w for _, w in part) * BLOCK_S,
                             (max(w for _, w in part) + 1) * BLOCK_S)
    return merged


def _merge(c: Connection, gpus: list[int], lo: float, hi: float) -> int:
    if is_postgres(c):
        rows = c.execute(text(
            "SELECT tableoid, ctid::text, gpu_pk, job_pk, t0, data FROM gpu_sample_blocks "
            "WHERE t0 >= :lo AND t0 < :hi AND gpu_pk = ANY(:g) ORDER BY gpu_pk, t0 FOR UPDATE"),
            {"lo": lo, "hi": hi, "g": gpus}).all()
    else:
        rows = c.execute(text(
            "SELECT 0, rowid, gpu_pk, job_pk, t0, data FROM gpu_sample_blocks "
            "WHERE t0 >= :lo AND t0 < :hi AND gpu_pk IN (SELECT value FROM json_each(:g)) ORDER BY gpu_pk, t0"),
            {"lo": lo, "hi": hi, "g": str(gpus)}).all()
    by_group: dict[tuple[int, int | None, int], list[Any]] = {}
    for r in rows:
        by_group.setdefault((r[2], r[3], math.floor(r[4] / BLOCK_S)), []).append(r)
    todo = [rs for rs in by_group.values() if len(rs) > 1]
    if not todo:
        return 0
    picked = [r for rs in todo for r in rs]
    ts, vals, counts = decode_blocks([bytes(r[5]) for r in picked])
    gpu = np.repeat([r[2] for r in picked], counts).astype(np.int64)
    job = np.repeat([-1 if r[3] is None else r[3] for r in picked], counts).astype(np.int64)
    # One row per (GPU, ts): a supplement block's fields join the row they complete, and of
    # a sample stored twice the first stored copy's values win (blocks in t0 order, stable sort).
    order = np.lexsort((ts, gpu))
    t, g, j, v = coalesce(ts[order], gpu[order], job[order], vals[:, order])
    new = block_rows(t, g, j, v, codec=ZSTD)  # off the hot path: smallest
    if is_postgres(c):
        by_oid: dict[int, list[str]] = {}
        for r in picked:
            by_oid.setdefault(int(r[0]), []).append(r[1])
        for oid, tids in by_oid.items():
            c.execute(text("DELETE FROM gpu_sample_blocks WHERE tableoid = :o AND ctid = ANY(CAST(:t AS tid[]))"),
                      {"o": oid, "t": tids})
    else:
        c.execute(text("DELETE FROM gpu_sample_blocks WHERE rowid IN (SELECT value FROM json_each(:r))"),
                  {"r": str([int(r[1]) for r in picked])})
    write_block_rows(c, new)
    return len(todo)
