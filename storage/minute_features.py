"""Minute features folded at ingest: raw samples -> mergeable per-(job, GPU, minute) state
(``gpu_minute_features``) and per-(job, hour) histograms (``job_hist_features``), written in
the raw write's transaction. The analysis reads only these (analysis.runner), so its cost
follows GPU-minutes, not the sampling rate, and a restarted worker reads exactly what a warm
one read.

A state holds sums and counts (every mean, the busy share, SM clock while busy, throttle
share), maxima and minima (NULL = the signal never reported in that minute: unknown is not
zero), and the first/last sample's time and busy bit so busy<->idle switches merge across
batch boundaries. ``fold`` makes states from arrays (pure), ``merge_states`` merges two states
of the same key (pure, the test's model), and ``MERGE_SQL`` is the same merge as the
upsert's ON CONFLICT clause (one rule table, ``RULES``, builds both).

Histograms are per job-hour, not per job-minute: one 400-count row per job per batch (as
cheap as the job rollup row the same write already upserts), and a job's p50/p95 sum a few
rows instead of 60 per hour. The minutes' means do not need it, only the job-wide quantiles.

What cannot merge exactly: a batch that lands *inside* a minute's stored span (a late batch
filling a gap between two stored ones) cannot know the busy bits of its neighbours, so that
minute's switch count misses up to two boundary switches; ``interior`` counts such merges.
Batches that arrive before or after the stored span (in order, late, or reversed) merge
exactly, and the batch ledger makes every batch fold once. Fields that complete rows folded
before (a remote-write sender's shards: ``unique_rows``) fold as the change they make to
those rows (``field_merge``): exact for every sum, count and extreme; the busy-switch count
and first/last busy bits stay as they were unless the late field is ``sm_active`` itself and
changes a row's busy bit, and then ``interior`` counts it (the switch count is unknown there,
as for a late batch inside the span)."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Connection

from gpufleet.storage.dialect import dialect_of
from gpufleet.storage.pg_arrays import NAN, array_rows, execute_prepared, pg_array, pg_float_values, with_count

BUCKET_S = 60
HIST_SPAN_S = 3600  # one histogram row per job-hour

# Per-minute means of these raw columns (feature name -> catalog column).
MEAN_OF: dict[str, str] = {
    "sm": "sm_active", "occ": "sm_occupancy", "tensor": "tensor_active", "dram": "dram_active",
    "gpu_util": "gpu_util", "fp32": "fp32_active", "fp64": "fp64_active", "power": "power_w",
    "clock": "sm_clock_mhz", "nvl_tx": "nvlink_tx_bytes_s", "nvl_rx": "nvlink_rx_bytes_s",
    "ib_tx": "ib_tx_bytes_s", "ib_rx": "ib_rx_bytes_s", "pcie_rx": "pcie_rx_bytes_s",
}
MAX_OF: dict[str, str] = {
    "fb_used_max": "fb_used_bytes", "fb_total": "fb_total_bytes", "xid_max": "xid_last",
    "ecc_max": "ecc_dbe_volatile", "remap_max": "row_remap_failure", "nvl_err_max": "nvlink_error_count",
    "replay_max": "pcie_replay_count",
}
MIN_OF: dict[str, str] = {"ecc_min": "ecc_dbe_volatile", "nvl_err_min": "nvlink_error_count",
                          "replay_min": "pcie_replay_count"}
HIST_FIELDS: dict[str, str] = {"sm_active": "sm", "sm_occupancy": "occ", "tensor_active": "tensor",
                               "dram_active": "dram"}
HIST_BINS = 100  # ratios in 0.01 steps: p50/p95 exact to a percentage point
HIST_LEN = HIST_BINS * len(HIST_FIELDS)
# Every raw column the fold reads.
RAW_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(
    [*MEAN_OF.values(), "clock_event_reasons", *MAX_OF.values(), *MIN_OF.values()]))

# Stored state columns and how two states of one key merge (the SQL and numpy share this).
KEY = ("job_pk", "bucket", "gpu_pk")
RULES: dict[str, str] = {
    "n": "add",
    **{f"{f}_sum": "add" for f in MEAN_OF}, **{f"{f}_n": "add" for f in MEAN_OF},
    **{f: "max" for f in MAX_OF}, **{f: "min" for f in MIN_OF},
    "nsm": "add", "nb": "add", "busy_sm_sum": "add", "ncb": "add", "clock_busy_sum": "add",
    "nrb": "add", "nthr": "add", "reasons_or": "or", "xid_crit": "max",
    "trans": "trans", "interior": "interior",
    "first_busy": "first_busy", "last_busy": "last_busy", "first_ts": "min", "last_ts": "max",
}
STATE = tuple(RULES)
INT_COLUMNS = frozenset(c for c in STATE if c in ("n", "nsm", "nb", "ncb", "nrb", "nthr", "reasons_or", "trans",
                                                    "interior", "first_busy", "last_busy") or c.endswith("_n"))
NULLABLE = frozenset([*MAX_OF, *MIN_OF])


@dataclass(frozen=True)
class FoldParams:
    busy_sm_active: float
    throttle_mask: int
    critical_xids: tuple[int, ...]


@lru_cache(maxsize=4)
def _load_params(path: str) -> FoldParams:
    d = tomllib.loads((Path(__file__).with_name("fold.toml")).read_text())
    if path:
        d.update(tomllib.loads(Path(path).read_text()))
    return FoldParams(float(d["busy_sm_active"]), int(d["throttle_mask"]),
                      tuple(int(x) for x in d["critical_xids"]))


def fold_params() -> FoldParams:
    """storage/fold.toml, or the file GPUFLEET_FOLD names (its keys override)."""
    return _load_params(os.environ.get("GPUFLEET_FOLD", ""))


@dataclass
class Folded:
    """States of sorted, unique keys (``job_pk``, ``bucket`` = minute start in epoch seconds,
    ``gpu_pk``) and job-hour histograms (``hist_job``, ``hist_hour``, ``hist`` (K, HIST_LEN))."""

    job_pk: np.ndarray
    bucket: np.ndarray
    gpu_pk: np.ndarray
    cols: dict[str, np.ndarray]
    hist_job: np.ndarray
    hist_hour: np.ndarray
    hist: np.ndarray

    def __len__(self) -> int:
        return len(self.job_pk)


def _seg(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.add.reduceat(x, starts) if len(x) else np.zeros(0)


def fold(ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray, cols: Mapping[str, np.ndarray],
         params: FoldParams | None = None) -> Folded:
    """Fold raw rows (any order; ``job_pk`` < 0 = no job, skipped: the analysis reads by job)
    into states. ``cols`` maps catalog names to row-aligned float arrays (NaN = missing)."""
    p = params or fold_params()
    ts = np.asarray(ts, dtype=np.float64)
    jk = np.asarray(job_pk, dtype=np.int64)
    gk = np.asarray(gpu_pk, dtype=np.int64)
    rows = np.flatnonzero(jk >= 0)
    minute = np.floor(ts[rows] / BUCKET_S).astype(np.int64)
    # Time order inside each (job, minute, GPU): the order switches are counted in.
    order = rows[np.lexsort((ts[rows], gk[rows], minute, jk[rows]))]
    if not len(order):
        z = np.zeros(0, np.int64)
        return Folded(z, np.zeros(0), z, {c: np.zeros(0) for c in STATE}, z, z, np.zeros((0, HIST_LEN), np.int64))
    t, j, g = ts[order], jk[order], gk[order]
    m = np.floor(t / BUCKET_S).astype(np.int64)
    new = np.r_[True, (j[1:] != j[:-1]) | (m[1:] != m[:-1]) | (g[1:] != g[:-1])]
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:], len(t)] - 1
    n_rows = len(t)

    def col(name: str) -> np.ndarray:
        c = cols.get(name)
        return np.full(n_rows, np.nan) if c is None else np.asarray(c, dtype=np.float64)[order]

    out: dict[str, np.ndarray] = {"n": np.diff(np.r_[starts, n_rows]).astype(np.float64)}
    for feat, name in MEAN_OF.items():
        x = col(name)
        ok = ~np.isnan(x)
        out[f"{feat}_sum"] = _seg(np.where(ok, x, 0.0), starts)
        out[f"{feat}_n"] = _seg(ok.astype(np.float64), starts)
    for table, ufunc in ((MAX_OF, np.fmax), (MIN_OF, np.fmin)):
        for feat, name in table.items():
            out[feat] = ufunc.reduceat(col(name), starts)  # NaN where the whole minute lacked it
    sm = col("sm_active")
    sm_ok = ~np.isnan(sm)
    busy = sm_ok & (sm >= p.busy_sm_active)
    out["nsm"] = _seg(sm_ok.astype(np.float64), starts)
    out["nb"] = _seg(busy.astype(np.float64), starts)
    out["busy_sm_sum"] = _seg(np.where(busy, sm, 0.0), starts)
    clk = col("sm_clock_mhz")
    cb = busy & ~np.isnan(clk)
    out["ncb"] = _seg(cb.astype(np.float64), starts)
    out["clock_busy_sum"] = _seg(np.where(cb, clk, 0.0), starts)
    reasons = col("clock_event_reasons")
    rok = busy & ~np.isnan(reasons)
    bits = np.where(rok, reasons, 0).astype(np.int64) & p.throttle_mask
    thr = rok & (bits != 0)
    out["nrb"] = _seg(rok.astype(np.float64), starts)
    out["nthr"] = _seg(thr.astype(np.float64), starts)
    out["reasons_or"] = np.bitwise_or.reduceat(bits, starts).astype(np.float64)  # throttle reasons seen
    xid = col("xid_last")
    codes = np.nan_to_num(xid).astype(np.int64)
    crit = np.where(np.isin(codes, np.asarray(p.critical_xids, dtype=np.int64)), xid, 0.0)
    out["xid_crit"] = np.fmax.reduceat(crit, starts)
    sw = np.zeros(n_rows)
    sw[1:] = ((busy[1:] != busy[:-1]) & ~new[1:]).astype(np.float64)
    out["trans"] = _seg(sw, starts)
    out["interior"] = np.zeros(len(starts))
    out["first_ts"], out["last_ts"] = t[starts], t[ends]
    out["first_busy"], out["last_busy"] = busy[starts].astype(np.float64), busy[ends].astype(np.float64)

    # Histograms per (job, hour): one bincount over (group, field, bin).
    hour = np.floor(t / HIST_SPAN_S).astype(np.int64)
    hnew = np.r_[True, (j[1:] != j[:-1]) | (hour[1:] != hour[:-1])]
    # Rows are sorted by (job, minute, ...), so (job, hour) groups are contiguous too.
    hgroup = np.cumsum(hnew) - 1
    hstarts = np.flatnonzero(hnew)
    parts = []
    for fi, name in enumerate(HIST_FIELDS):
        x = col(name)
        ok = ~np.isnan(x)
        b = np.clip((x[ok] * HIST_BINS).astype(np.int64), 0, HIST_BINS - 1)
        parts.append(hgroup[ok] * HIST_LEN + fi * HIST_BINS + b)
    hist = np.bincount(np.concatenate(parts), minlength=len(hstarts) * HIST_LEN).reshape(len(hstarts), HIST_LEN)
    return Folded(j[starts], (m[starts] * BUCKET_S).astype(np.float64), g[starts], out,
                  j[hstarts], hour[hstarts], hist.astype(np.int64))


def merge_states(o: Mapping[str, np.ndarray], x: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The state of a key after ``x`` is folded into the stored ``o`` (row-aligned arrays):
    exactly what ``MERGE_SQL`` computes in the upsert."""
    after = x["first_ts"] > o["last_ts"]
    before = x["last_ts"] < o["first_ts"]
    out: dict[str, np.ndarray] = {}
    for c, rule in RULES.items():
        a, b = o[c], x[c]
        if rule == "add":
            out[c] = a + b
        elif rule == "max":
            out[c] = np.where(np.isnan(a) | (b > a), b, a)
        elif rule == "min":
            out[c] = np.where(np.isnan(a) | (b < a), b, a)
        elif rule == "or":
            out[c] = (a.astype(np.int64) | b.astype(np.int64)).astype(np.float64)
        elif rule == "first_busy":
            out[c] = np.where(x["first_ts"] < o["first_ts"], b, a)
        elif rule == "last_busy":
            out[c] = np.where(x["last_ts"] > o["last_ts"], b, a)
        elif rule == "trans":
            edge = np.where(after, np.abs(o["last_busy"] - x["first_busy"]),
                            np.where(before, np.abs(x["last_busy"] - o["first_busy"]), 0.0))
            out[c] = a + b + edge
        else:  # interior
            out[c] = a + b + np.where(after | before, 0.0, 1.0)
    return out


def merge_folded(a: Folded, b: Folded) -> Folded:
    """``b`` folded into ``a`` (keys matched): the pure model of upserting ``b`` after ``a``."""
    ka = list(zip(a.job_pk.tolist(), a.bucket.tolist(), a.gpu_pk.tolist(), strict=True))
    kb = list(zip(b.job_pk.tolist(), b.bucket.tolist(), b.gpu_pk.tolist(), strict=True))
    keys = sorted(set(ka) | set(kb))
    ia, ib = {k: i for i, k in enumerate(ka)}, {k: i for i, k in enumerate(kb)}
    cols: dict[str, np.ndarray] = {}
    for c in STATE:
        cols[c] = np.array([a.cols[c][ia[k]] if k in ia else b.cols[c][ib[k]] for k in keys], dtype=np.float64)
    both = [i for i, k in enumerate(keys) if k in ia and k in ib]
    if both:
        o = {c: np.array([a.cols[c][ia[keys[i]]] for i in both]) for c in STATE}
        x = {c: np.array([b.cols[c][ib[keys[i]]] for i in both]) for c in STATE}
        merged = merge_states(o, x)
        for c in STATE:
            cols[c][both] = merged[c]
    hk = sorted(set(zip(a.hist_job.tolist(), a.hist_hour.tolist(), strict=True))
                | set(zip(b.hist_job.tolist(), b.hist_hour.tolist(), strict=True)))
    hist = np.zeros((len(hk), HIST_LEN), np.int64)
    pos = {k: i for i, k in enumerate(hk)}
    for f in (a, b):
        for r, k in enumerate(zip(f.hist_job.tolist(), f.hist_hour.tolist(), strict=True)):
            hist[pos[k]] += f.hist[r]
    arr = np.array(keys, dtype=np.float64).reshape(-1, 3)
    return Folded(arr[:, 0].astype(np.int64), arr[:, 1], arr[:, 2].astype(np.int64), cols,
                  np.array([k[0] for k in hk], np.int64), np.array([k[1] for k in hk], np.int64), hist)


# --- SQL ---------------------------------------------------------------------------------

FEATURE_TABLE = "gpu_minute_features"
HIST_TABLE = "job_hist_features"


def _merge_expr(c: str, rule: str, supplement: bool = False) -> str:
    """``supplement``: the state folds fields of rows already counted (``field_merge``): its
    ``interior`` is the count itself (not one more merge inside the span)."""
    t, x = FEATURE_TABLE, "excluded"
    o, w = f"{t}.{c}", f"{x}.{c}"
    after, before = f"{x}.first_ts > {t}.last_ts", f"{x}.last_ts < {t}.first_ts"
    if rule == "add":
        return f"{o} + {w}"
    if rule == "max":
        return f"CASE WHEN {o} IS NULL OR {w} > {o} THEN {w} ELSE {o} END"
    if rule == "min":
        return f"CASE WHEN {o} IS NULL OR {w} < {o} THEN {w} ELSE {o} END"
    if rule == "or":
        return f"({o} | {w})"
    if rule == "first_busy":
        return f"CASE WHEN {x}.first_ts < {t}.first_ts THEN {w} ELSE {o} END"
    if rule == "last_busy":
        return f"CASE WHEN {x}.last_ts > {t}.last_ts THEN {w} ELSE {o} END"
    if rule == "trans":
        return (f"{o} + {w} + CASE WHEN {after} THEN ABS({t}.last_busy - {x}.first_busy) "
                f"WHEN {before} THEN ABS({x}.last_busy - {t}.first_busy) ELSE 0 END")
    if supplement:
        return f"{o} + {w}"  # interior
    return f"{o} + {w} + CASE WHEN {after} OR {before} THEN 0 ELSE 1 END"  # interior


MERGE_SQL = ", ".join(f"{c} = {_merge_expr(c, r)}" for c, r in RULES.items())
_COLS = (*KEY, *STATE)
_INT_KEYED = INT_COLUMNS | {"job_pk", "gpu_pk"}  # the columns that travel as int4


def _feature_sql(dialect: str, supplement: bool = False) -> str:
    merge = ", ".join(f"{c} = {_merge_expr(c, r, supplement)}" for c, r in RULES.items()) if supplement else MERGE_SQL
    conflict = f"ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET {merge}"
    if dialect == "postgresql":
        # Rows read from one array parameter per column (pg_arrays.array_rows): integer
        # columns int4, the others float8 with NaN for NULL (pg_float_values).
        types = ["int4[]" if c in _INT_KEYED else "float8[]" for c in _COLS]
        nulls = ["" if c in _INT_KEYED else NAN for c in _COLS]
        rows = array_rows(types, nulls, [""] * len(_COLS))
        return f"INSERT INTO {FEATURE_TABLE} ({', '.join(_COLS)}) {rows} {conflict}"
    return f"INSERT INTO {FEATURE_TABLE} ({', '.join(_COLS)}) VALUES ({', '.join('?' * len(_COLS))}) {conflict}"


# The element-wise sum by subscript: unnest(h, excluded.h) WITH ORDINALITY + array_agg(ORDER BY)
# materialised and sorted 400 pairs per row, 105 us of PostgreSQL CPU per job-hour row against
# 41 us for this (same arrays; tests/storage compares the stored histograms).
_HIST_MERGE_PG = (f"h = ARRAY(SELECT {HIST_TABLE}.h[k] + excluded.h[k] FROM generate_series(1, {HIST_LEN}) AS k), "
                  f"folds = {HIST_TABLE}.folds + 1")
# Parameters: job_pk, hour, the flat histograms, job_pk again (its length: pg_arrays.array_rows).
_HIST_SQL_PG = (f"INSERT INTO {HIST_TABLE} (job_pk, hour, folds, h) "
                f"SELECT (%b::int4[])[i], (%b::int4[])[i], 1, (%b::int4[])[(i - 1) * {HIST_LEN} + 1 : i * {HIST_LEN}] "
                "FROM generate_series(1, cardinality(%b::int4[])) AS i "
                f"ON CONFLICT (job_pk, hour) DO UPDATE SET {_HIST_MERGE_PG}")
_SQL: dict[tuple[str, bool], str] = {}


def upsert_folded(conn: Connection, f: Folded, supplement: bool = False) -> None:
    """Fold ``f`` into the stored states inside the caller's transaction. Keys go in sorted
    order, so concurrent writers lock shared rows in one order (no deadlocks). ``supplement``:
    ``f`` is a change to rows already folded (``field_merge``)."""
    if not len(f):
        return
    dialect = dialect_of(conn)
    sql = _SQL.get((dialect, supplement))
    if sql is None:
        sql = _SQL[(dialect, supplement)] = _feature_sql(dialect, supplement)
    arrays = [f.job_pk, f.bucket, f.gpu_pk] + [f.cols[c] for c in STATE]
    if dialect == "postgresql":
        floats = iter(pg_float_values(np.array([a for c, a in zip(_COLS, arrays, strict=True) if c not in _INT_KEYED],
                                               dtype=np.float64)))
        params = [pg_array(a, integer=True) if c in _INT_KEYED else next(floats)
                  for c, a in zip(_COLS, arrays, strict=True)]
        execute_prepared(conn, sql, with_count(params))
        # Every job-hour in one statement: the histograms travel as one flat array, sliced per row.
        execute_prepared(conn, _HIST_SQL_PG, with_count([pg_array(f.hist_job, integer=True),
                                                         pg_array(f.hist_hour, integer=True),
                                                         pg_array(f.hist.ravel(), integer=True)]))
        return
    pycols: list[list[Any]] = []
    for c, a in zip(_COLS, arrays, strict=True):
        if c in _INT_KEYED:
            pycols.append(a.astype(np.int64).tolist())
        elif c in NULLABLE:
            pycols.append([None if v != v else v for v in a.tolist()])
        else:
            pycols.append(a.tolist())
    conn.exec_driver_sql(sql, list(zip(*pycols, strict=True)))
    # SQLite has no arrays: read, add, write back. The raw insert earlier in this transaction
    # already holds SQLite's one write lock, so nobody else can change the row in between.
    for job, hour, h in zip(f.hist_job.tolist(), f.hist_hour.tolist(), f.hist, strict=True):
        old = conn.exec_driver_sql(f"SELECT h, folds FROM {HIST_TABLE} WHERE job_pk = ? AND hour = ?",
                                   (job, hour)).first()
        total = h.astype("<i4") if old is None else np.frombuffer(old[0], dtype="<i4") + h.astype("<i4")
        folds = 1 if old is None else int(old[1]) + 1
        conn.exec_driver_sql(f"INSERT INTO {HIST_TABLE} (job_pk, hour, folds, h) VALUES (?, ?, ?, ?) "
                             "ON CONFLICT (job_pk, hour) DO UPDATE SET folds = excluded.folds, h = excluded.h",
                             (job, hour, folds, total.astype("<i4").tobytes()))


def raw_columns(vals: np.ndarray) -> dict[str, np.ndarray]:
    """The fold's columns of ``vals`` (catalog order) as the raw store holds them: f4 fields
    through float32, as a raw read returns them."""
    from gpufleet.storage.fields import FIELD_INDEX, FIELDS

    cols = {}
    for name in RAW_FIELDS:
        v = vals[FIELD_INDEX[name]]
        cols[name] = v.astype(np.float32).astype(np.float64) if FIELDS[FIELD_INDEX[name]].dtype == "f4" else v
    return cols


def fold_rows(conn: Connection, ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray, vals: np.ndarray) -> None:
    """The write path's hook: fold the stored rows (``vals`` in catalog order)."""
    upsert_folded(conn, fold(ts, gpu_pk, job_pk, raw_columns(vals)))


# --- reading -----------------------------------------------------------------------------

@dataclass
class HistRow:
    hour: int
    folds: int
    h: np.ndarray  # (HIST_LEN,) int64


def read_hist(conn: Connection, job_pk: int) -> list[HistRow]:
    """The job's histogram rows by hour, with each row's fold counter (it changes whenever a
    batch folds into that hour: how a warm reader finds the hours to re-read)."""
    mark = "%s" if dialect_of(conn) == "postgresql" else "?"
    rows = conn.exec_driver_sql(f"SELECT hour, folds, h FROM {HIST_TABLE} WHERE job_pk = {mark} ORDER BY hour",
                                (job_pk,)).fetchall()
    out = []
    for hour, folds, h in rows:
        arr = np.asarray(h, dtype=np.int64) if isinstance(h, list) else np.frombuffer(h, dtype="<i4").astype(np.int64)
        out.append(HistRow(int(hour), int(folds), arr))
    return out


READ_COLUMNS = ("bucket", "gpu_pk", *STATE)


def read_states(conn: Connection, job_pk: int, t_from: float, t_to: float) -> np.ndarray:
    """(rows, len(READ_COLUMNS)) float64 of the job's states with ``t_from <= bucket < t_to``,
    ordered by (bucket, gpu); NULL reads as NaN. PostgreSQL sends them with binary COPY
    (fixed-width rows parsed by numpy: no Python object per value)."""
    ncol = len(READ_COLUMNS)
    if dialect_of(conn) == "postgresql":
        sel = ", ".join(f"COALESCE({c}::float8, 'NaN'::float8)" for c in READ_COLUMNS)
        sql = (f"COPY (SELECT {sel} FROM {FEATURE_TABLE} WHERE job_pk = {int(job_pk)} "
               f"AND bucket >= {float(t_from)!r} AND bucket < {float(t_to)!r} ORDER BY bucket, gpu_pk) "
               "TO STDOUT (FORMAT binary)")
        dbapi = conn.connection.driver_connection
        if dbapi is None:
            raise RuntimeError("the database connection is closed")
        buf = bytearray()
        with dbapi.cursor() as cur, cur.copy(sql) as cp:
            for chunk in cp:
                buf += chunk
        # 19-byte header (signature, flags, extension length 0), then per row: int16 field
        # count and (int32 length 8, float8) per field; a 2-byte -1 trailer.
        rec = np.dtype([("nf", ">i2"), ("v", [("l", ">i4"), ("x", ">f8")], (ncol,))])
        body = bytes(buf[19:len(buf) - 2])
        data = np.frombuffer(body, dtype=rec)["v"]["x"].astype(np.float64)
        return data.reshape(-1, ncol)
    sel = ", ".join(f"IFNULL({c}, -1.0)" if c in NULLABLE else c for c in READ_COLUMNS)
    rows = conn.exec_driver_sql(
        f"SELECT {sel} FROM {FEATURE_TABLE} WHERE job_pk = ? AND bucket >= ? AND bucket < ? ORDER BY bucket, gpu_pk",
        (job_pk, float(t_from), float(t_to))).fetchall()
    if not rows:
        return np.zeros((0, ncol))
    from itertools import chain

    data = np.fromiter(chain.from_iterable(rows), dtype=np.float64, count=len(rows) * ncol).reshape(-1, ncol)
    for c in NULLABLE:  # every nullable column is a non-negative counter or size
        k = READ_COLUMNS.index(c)
        data[data[:, k] < 0, k] = np.nan
    return data


# --- backfill (migration 0011) -----------------------------------------------------------

def backfill(conn: Connection, *, chunk_jobs: int = 64) -> int:
    """Fold every stored raw sample that has a job into empty feature tables (what migration
    0011 runs, so jobs stored before it keep their analysis). Returns the rows folded."""
    pg = dialect_of(conn) == "postgresql"
    jobs = [int(r[0]) for r in conn.exec_driver_sql(
        "SELECT DISTINCT job_pk FROM gpu_samples WHERE job_pk IS NOT NULL ORDER BY job_pk").fetchall()]
    sel = ", ".join(f"COALESCE({c}, 'NaN'::float8)" if pg else c for c in RAW_FIELDS)
    total = 0
    for i in range(0, len(jobs), chunk_jobs):
        part = jobs[i:i + chunk_jobs]
        rows = conn.exec_driver_sql(
            f"SELECT ts, gpu_pk, job_pk, {sel} FROM gpu_samples WHERE job_pk IN ({', '.join(map(str, part))})"
        ).fetchall()
        if not rows:
            continue
        data = np.array([[np.nan if v is None else float(v) for v in r] for r in rows], dtype=np.float64)
        cols = {name: data[:, 3 + k] for k, name in enumerate(RAW_FIELDS)}
        upsert_folded(conn, fold(data[:, 0], data[:, 1].astype(np.int64), data[:, 2].astype(np.int64), cols))
        total += len(rows)
    return total
