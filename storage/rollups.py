"""1-minute rollups (``gpu_samples_1m``, ``job_samples_1m``): ``rollup`` aggregates rows by
(key, minute) with sorted numpy reductions, ``upsert_rollup`` folds the partial aggregates
into the stored rows (ON CONFLICT merge, the same SQL on both databases). The seam where
minute features folded at ingest will grow: they take the same sorted rows."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import Connection

from gpufleet.storage.dialect import dialect_of
from gpufleet.storage.fields import FIELDS, NAMES, NF, ROLLUP
from gpufleet.storage.pg_arrays import NAN, array_rows, execute_prepared, pg_array, pg_float_values, with_count

BUCKET_S = 60.0

# --- rollups -------------------------------------------------------------------------------

# Catalog rows of each rollup kind, so a rollup runs one reduction per kind over all its
# fields instead of one per field (the per-field numpy calls were most of its cost).
# Anything that is not max or last rolls up as a mean (sum_rate too: the mean rate).
MAX_ROWS = np.array([j for j, r in enumerate(ROLLUP) if r == "max"], dtype=np.intp)
LAST_ROWS = np.array([j for j, r in enumerate(ROLLUP) if r == "last"], dtype=np.intp)
MEAN_ROWS = np.array([j for j, r in enumerate(ROLLUP) if r not in ("max", "last")], dtype=np.intp)
_NEG_ZERO_BITS = np.array(-0.0).view(np.int64)


def rollup(keys: np.ndarray, ts: np.ndarray, vals: np.ndarray, carry: np.ndarray | None,
            order: np.ndarray | None = None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Aggregate rows by (key, minute): returns key, bucket, n, last_ts, (NF, groups)
    aggregates and the ``carry`` value of each group's newest row.

    ``order``, when given, is ``np.lexsort((ts[rows], keys[rows]))`` mapped back to row numbers
    of ``rows`` (the rows to aggregate): callers that already sorted, or that aggregate a
    subset, pass it so the sample matrix is gathered once instead of masked then sorted."""
    if order is None:
        # (key, ts) sorts exactly like (key, bucket, ts): the bucket is a monotone function
        # of ts, so equal ts means equal bucket and the stable sort keeps the same ties.
        order = np.lexsort((ts, keys))
    k, t = keys[order], ts[order]
    b = np.floor(t / BUCKET_S) * BUCKET_S
    m = len(k)
    starts = np.flatnonzero(np.r_[True, (k[1:] != k[:-1]) | (b[1:] != b[:-1])])
    ends = np.r_[starts[1:], m] - 1
    n = np.diff(np.r_[starts, m])
    v = vals.take(order, axis=1)
    nan = np.isnan(v)
    has_nan = bool(nan.any())
    out = np.full((NF, len(starts)), np.nan)
    # The per-field code reduced strided rows (its column gather is Fortran-like); these
    # 2-d reductions run over contiguous rows. Sums do not care: numpy's pairwise summation
    # associates the same way whatever the stride. Max can care, see below.
    if len(MEAN_ROWS):
        vm = v[MEAN_ROWS]
        if has_nan:
            nm = nan[MEAN_ROWS]
            cnt = np.add.reduceat(~nm, starts, axis=1)
            s = np.add.reduceat(np.where(nm, 0.0, vm), starts, axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[MEAN_ROWS] = np.where(cnt > 0, s / np.maximum(cnt, 1), np.nan)
        else:  # every count is the group size
            out[MEAN_ROWS] = np.add.reduceat(vm, starts, axis=1) / n
    if len(MAX_ROWS):
        vx = v[MAX_ROWS]
        if vx.dtype != np.float64 or (vx.view(np.int64) == _NEG_ZERO_BITS).any():
            # numpy's fmax breaks a tie of 0.0 and -0.0 one way in its SIMD loop (contiguous
            # rows) and the other in its sequential one (strided rows, what the per-field
            # code ran on its column-gathered matrix). Only a -0.0 can tell them apart; then
            # Fortran order makes the rows strided and the result the old one, bit for bit.
            vx = np.asfortranarray(vx)
        mx = np.fmax.reduceat(vx, starts, axis=1)
        if has_nan:
            # A field null in every row stays the canonical NaN the per-field loop left
            # there (fmax would return the input's NaN, whatever its payload).
            mx[nan[MAX_ROWS].all(axis=1)] = np.nan
        out[MAX_ROWS] = mx
    if len(LAST_ROWS):
        vl = v[LAST_ROWS]
        if has_nan:  # the newest row with a value, per field: the largest non-NaN position
            pos = np.where(nan[LAST_ROWS], -1, np.arange(m))
            last = np.maximum.reduceat(pos, starts, axis=1)
            picked = np.take_along_axis(vl, np.maximum(last, 0), axis=1)
            out[LAST_ROWS] = np.where(last >= 0, picked, np.nan)
        else:
            out[LAST_ROWS] = vl[:, ends]
    c = carry[order[ends]] if carry is not None else None
    return k[starts], b[starts], n, t[ends], out, c


def _merge_sql(table: str, supplement: bool = False) -> str:
    """ON CONFLICT updates folding a new partial aggregate into the stored one (the same SQL
    on PostgreSQL and SQLite; SET expressions see the row's old values).

    ``supplement``: the partial aggregates fields of rows the stored aggregate already
    counted (``unique_rows``: a later request's fields of a stored (GPU, ts) row), so ``n``,
    ``last_ts`` and ``job_pk`` stay as they are, and a mean treats the partial's ``n`` rows as
    rows of the stored ``n`` that lacked the field: ``(o * (n - k) + w * k) / n``. Exact when
    the field is new for the stored minute (``o`` NULL: the usual split, each shard carrying
    its own series) or when every stored row lacking it gets it from this partial; the
    per-row weighting is the rule's general approximation (it holds no per-field counts).
    ``last`` keeps the partial's value only when it is as new as the stored row's newest."""
    t, x = table, "excluded"
    if supplement:
        sets = [f"n = {t}.n", f"last_ts = {t}.last_ts"]
    else:
        sets = [f"n = {t}.n + {x}.n",
                f"last_ts = CASE WHEN {x}.last_ts > {t}.last_ts THEN {x}.last_ts ELSE {t}.last_ts END"]
    for f in FIELDS:
        o, w = f"{t}.{f.name}", f"{x}.{f.name}"
        if f.rollup == "max":
            e = f"CASE WHEN {o} IS NULL THEN {w} WHEN {w} > {o} THEN {w} ELSE {o} END"
        elif f.rollup == "last":
            e = (f"CASE WHEN {w} IS NULL THEN {o} WHEN {o} IS NULL THEN {w} "
                 f"WHEN {x}.last_ts >= {t}.last_ts THEN {w} ELSE {o} END")
        elif supplement:
            e = (f"CASE WHEN {w} IS NULL THEN {o} WHEN {o} IS NULL THEN {w} "
                 f"WHEN {t}.n > {x}.n THEN ({o} * ({t}.n - {x}.n) + {w} * {x}.n) / {t}.n "
                 f"ELSE ({o} * {t}.n + {w} * {x}.n) / ({t}.n + {x}.n) END")
        else:  # mean, weighted by samples folded in (per row, not per non-null value)
            e = (f"CASE WHEN {w} IS NULL THEN {o} WHEN {o} IS NULL THEN {w} "
                 f"ELSE ({o} * {t}.n + {w} * {x}.n) / ({t}.n + {x}.n) END")
        sets.append(f"{f.name} = {e}")
    if table == "gpu_samples_1m" and not supplement:
        sets.append(f"job_pk = CASE WHEN {x}.last_ts >= {t}.last_ts THEN {x}.job_pk ELSE {t}.job_pk END")
    return ", ".join(sets)


def _rollup_sql(dialect: str, table: str, key_col: str, supplement: bool = False) -> str:
    cols = [key_col, "bucket", "n", "last_ts"] + (["job_pk"] if table == "gpu_samples_1m" else []) + list(NAMES)
    conflict = f"ON CONFLICT ({key_col}, bucket) DO UPDATE SET {_merge_sql(table, supplement)}"
    if dialect == "postgresql":
        # One statement for all rows: each column arrives as one binary array parameter
        # (built with numpy, see storage.pg_arrays) and is read row by row (array_rows). Fields
        # travel as float8 with NaN for absent (NULL again in the SQL), integer fields cast to
        # int8; the GPU row's job_pk as int4 with -1 for none. Prepared once per connection.
        job = table == "gpu_samples_1m"
        types = ["int4[]", "float8[]", "int4[]", "float8[]"] + (["int4[]"] if job else []) + ["float8[]"] * NF
        nulls = ["", "", "", ""] + (["-1"] if job else []) + [NAN] * NF
        casts = ["", "", "", ""] + ([""] if job else []) + ["int8" if f.dtype == "i8" else "" for f in FIELDS]
        return f"INSERT INTO {table} ({', '.join(cols)}) {array_rows(types, nulls, casts)} {conflict}"
    return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) {conflict}"


_SQL_CACHE: dict[tuple[str, str, str, bool], str] = {}


def upsert_rollup(conn: Connection, table: Any, key_col: str, keys: np.ndarray, buckets: np.ndarray,
                   n: np.ndarray, last_ts: np.ndarray, agg: np.ndarray, carry: np.ndarray | None,
                   supplement: bool = False) -> None:
    """Fold partial aggregates into the stored rows; ``supplement``: of rows already counted
    (``_merge_sql``)."""
    if not len(keys):
        return
    dialect = dialect_of(conn)
    ck = (dialect, table.name, key_col, supplement)
    sql = _SQL_CACHE.get(ck)
    if sql is None:
        sql = _SQL_CACHE[ck] = _rollup_sql(dialect, table.name, key_col, supplement)
    # Sorted keys: concurrent writers lock rollup rows in the same order (no deadlocks).
    if dialect == "postgresql":
        arrays = [keys, buckets, n, last_ts] + ([np.where(carry < 0, -1, carry)] if carry is not None else [])
        params = [pg_array(a, integer=k in (0, 2, 4)) for k, a in enumerate(arrays)]
        params += pg_float_values(agg)
        execute_prepared(conn, sql, with_count(params))
        return
    cols: list[list[Any]] = [keys.tolist(), buckets.tolist(), n.tolist(), last_ts.tolist()]
    if carry is not None:
        cols.append([None if c < 0 else c for c in carry.tolist()])
    for j, f in enumerate(FIELDS):
        v = agg[j]
        nan = np.isnan(v)
        if f.dtype == "i8":
            cols.append([None if x else int(y) for x, y in zip(nan.tolist(), v.tolist(), strict=True)])
        elif nan.any():
            cols.append([None if x else y for x, y in zip(nan.tolist(), v.tolist(), strict=True)])
        else:
            cols.append(v.tolist())
    conn.exec_driver_sql(sql, list(zip(*cols, strict=True)))
