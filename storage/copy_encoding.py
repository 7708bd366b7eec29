"""The old wide raw layout's rows (``gpu_samples``: ``ts, gpu_pk, job_pk`` and one column per
catalog field) in PostgreSQL's binary COPY format, built with numpy: ``copy_buffer``. Since
migration 0012 the product stores raw samples as blocks (``raw_samples``); this encoder stays
as the wide reference writer of bench/ingest/raw_layouts.py and of the migration test, which
builds a database at the previous revision.

Why: per-row Python work is what limits a Python collector, so rows are serialised
straight from the sample arrays (strided views over one row buffer, a cached layout per
null pattern) and no Python object is created per row."""

from __future__ import annotations

import itertools
import struct
import threading
from dataclasses import dataclass

import numpy as np
from cachetools import LRUCache
from sqlalchemy import Connection

from gpufleet.storage.dialect import is_postgres
from gpufleet.storage.fields import FIELDS, NAMES, NF

_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = b"\xff\xff"
_VAL_DTYPE = {"f4": ">f4", "f8": ">f8", "i8": ">i8"}
_VAL_SIZE = {"f4": 4, "f8": 8, "i8": 8}
SAMPLE_COLUMNS = ("ts", "gpu_pk", "job_pk", *NAMES)
# Rows with many null patterns are built once at full width and the null values' bytes cut
# out with a byte mask (~100 us + 0.8 us a row here) rather than block by block (~28 us a
# pattern): the mask wins above about 4 + rows / 32 patterns.
_COPY_MASK_BASE, _COPY_MASK_ROWS = 4, 32
# Rows are assembled in a per-thread buffer kept between calls (up to this size): a fresh
# buffer per call next to the returned bytes made malloc hand the pages back and fault
# them in again every time, which cost more than building the rows.
_SCRATCH_KEEP = 4 << 20
_scratch_local = threading.local()


def _scratch(nbytes: int) -> np.ndarray:
    buf: np.ndarray | None = getattr(_scratch_local, "buf", None)
    if buf is None or len(buf) < nbytes:
        buf = np.empty(nbytes, np.uint8)
        if nbytes <= _SCRATCH_KEEP:
            _scratch_local.buf = buf
    return buf[:nbytes]


@dataclass(frozen=True, slots=True)
class _CopyLayout:
    """Byte layout of one COPY row for one null pattern: ``template`` holds the constant
    words (field count, lengths); each value is written through a strided view."""

    size: int
    template: np.ndarray  # uint8, one row
    job: int  # offset of job_pk's value; -1 when null
    values: tuple[tuple[int, int, str], ...]  # (field, offset, big-endian dtype) of each non-null field
    # Byte offsets of the length words and (NF+1, 8) byte columns of the values (4-byte
    # ones padded by repeats) of each field, job_pk last as in the null pattern: only the
    # full-width layout's are used (to null cells of rows built at full width).
    len_at: np.ndarray
    val_at: np.ndarray


# The collector sees a handful of null patterns (GPU models, rows with and without a
# job); random patterns must not grow it without bound.
_COPY_LAYOUTS: LRUCache[bytes, _CopyLayout] = LRUCache(1024)
_TS_AT, _GPU_AT = 6, 18  # every layout starts: count, len, ts, len, gpu_pk
_NO_NULLS = np.zeros(NF + 1, bool)


def _copy_layout(null: np.ndarray) -> _CopyLayout:
    """Layout for the null pattern ``null`` (NF field flags, then job_pk's), cached: the
    collector sees a handful of patterns (GPU models, rows with and without a job)."""
    key = null.tobytes()
    hit = _COPY_LAYOUTS.get(key)
    if hit is not None:
        return hit
    words: list[tuple[int, str, int]] = []  # (offset, dtype, value) of constant words
    off = 0

    def word(dt: str, value: int) -> None:
        nonlocal off
        words.append((off, dt, value))
        off += int(dt[2:])

    word(">i2", len(SAMPLE_COLUMNS))
    word(">i4", 8)
    off += 8  # ts
    word(">i4", 4)
    off += 4  # gpu_pk
    job_len_at = off
    word(">i4", -1 if null[NF] else 4)
    job = -1 if null[NF] else off
    job_val_at = np.minimum(np.arange(8), 3) + off
    off += 0 if null[NF] else 4
    len_at: list[int] = []
    val_at: list[np.ndarray] = []
    values: list[tuple[int, int, str]] = []
    for j, f in enumerate(FIELDS):
        size = _VAL_SIZE[f.dtype]
        len_at.append(off)
        word(">i4", -1 if null[j] else size)
        val_at.append(np.minimum(np.arange(8), size - 1) + off)
        if not null[j]:
            values.append((j, off, _VAL_DTYPE[f.dtype]))
            off += size
    template = np.zeros(off, np.uint8)
    for at, dt, value in words:
        template[at:at + int(dt[2:])] = np.frombuffer(np.array(value, dt).tobytes(), np.uint8)
    layout = _CopyLayout(off, template, job, tuple(values), np.array([*len_at, job_len_at]),
                         np.array([*val_at, job_val_at]))
    _COPY_LAYOUTS[key] = layout
    return layout


def _copy_rows(lay: _CopyLayout, out: np.ndarray, ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray,
               vals: np.ndarray) -> None:
    """Fill ``out`` (uint8, len(ts) * lay.size, contiguous) with the rows in ``lay``'s layout
    (the values of fields ``lay`` has as null are not written)."""
    m, size = len(ts), lay.size
    out.reshape(m, size)[:] = lay.template
    # One assignment per column, each a strided view over the rows: numpy casts and
    # byte-swaps in its inner loop. (A 2-d view over adjacent same-type fields was slower:
    # numpy iterates the short field axis innermost.)
    np.ndarray(m, ">f8", out, _TS_AT, (size,))[:] = ts
    np.ndarray(m, ">i4", out, _GPU_AT, (size,))[:] = gpu_pk
    if lay.job >= 0:
        np.ndarray(m, ">i4", out, lay.job, (size,))[:] = job_pk
    for j, off, dt in lay.values:
        np.ndarray(m, dt, out, off, (size,))[:] = vals[j]


def copy_buffer(ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray, vals: np.ndarray) -> bytes:
    """Rows in PostgreSQL's binary COPY format, built with numpy: the rows sharing a null
    pattern (usually all of them) form one block, blocks in the order of their packed null
    bits, rows in input order within a block. ``job_pk`` < 0 is null."""
    n = len(ts)
    if not n:
        return _COPY_HEADER + _COPY_TRAILER
    nan = np.isnan(vals)
    nojob = job_pk < 0
    if not nan.any() and not nojob.any():  # the usual group commit: one pattern, no nulls
        blocks = [(_copy_layout(_NO_NULLS), 0, n)]
    else:
        nulls = np.vstack([nan, nojob[None, :]])  # (NF+1, n)
        if (nulls == nulls[:, :1]).all():
            blocks = [(_copy_layout(nulls[:, 0]), 0, n)]
        else:
            order, starts = _null_pattern_order(nulls)
            ts, gpu_pk, job_pk, vals = ts[order], gpu_pk[order], job_pk[order], vals.take(order, axis=1)
            if len(starts) > _COPY_MASK_BASE + n // _COPY_MASK_ROWS:
                return b"".join((_COPY_HEADER, _copy_masked(ts, gpu_pk, job_pk, vals, nulls[:, order]),
                                 _COPY_TRAILER))
            bounds = [*starts.tolist(), n]
            blocks = [(_copy_layout(nulls[:, order[lo]]), lo, hi) for lo, hi in itertools.pairwise(bounds)]
    head, tail = len(_COPY_HEADER), len(_COPY_TRAILER)
    total = head + sum((hi - lo) * lay.size for lay, lo, hi in blocks) + tail
    out = _scratch(total)
    out[:head] = np.frombuffer(_COPY_HEADER, np.uint8)
    at = head
    for lay, lo, hi in blocks:
        end = at + (hi - lo) * lay.size
        if lo == 0 and hi == n:
            _copy_rows(lay, out[at:end], ts, gpu_pk, job_pk, vals)
        else:
            _copy_rows(lay, out[at:end], ts[lo:hi], gpu_pk[lo:hi], job_pk[lo:hi], vals[:, lo:hi])
        at = end
    out[at:] = np.frombuffer(_COPY_TRAILER, np.uint8)
    return out.tobytes()


# The null flags of a row read as binary numbers (field 0 the most significant bit, job_pk
# the least), in chunks of at most 52 bits so float64 holds them exactly and one BLAS
# product computes them: sorting by them orders the patterns like their packbits bytes.
_CODE_CHUNKS = [(lo, min(lo + 52, NF + 1)) for lo in range(0, NF + 1, 52)]
_CODE_WEIGHTS = [2.0 ** np.arange(hi - lo - 1, -1, -1) for lo, hi in _CODE_CHUNKS]


def _null_pattern_order(nulls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows (columns of ``nulls``) grouped by null pattern, patterns in the order of their
    bits (first flag most significant), rows in input order within a pattern; and where
    each pattern's rows start in that order."""
    codes = [w @ nulls[lo:hi].astype(np.float64) for w, (lo, hi) in zip(_CODE_WEIGHTS, _CODE_CHUNKS, strict=True)]
    order = np.lexsort(codes[::-1])
    change = np.zeros(len(order) - 1, bool)
    for c in codes:
        sc = c[order]
        change |= sc[1:] != sc[:-1]
    return order, np.flatnonzero(np.r_[True, change])


def _copy_masked(ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray, vals: np.ndarray,
                 nulls: np.ndarray) -> bytes:
    """Rows with many different null patterns: every row at full width, then each null
    value's length word set to -1 and its value bytes dropped (one boolean mask)."""
    full = _copy_layout(_NO_NULLS)
    n = len(ts)
    flat = _scratch(n * full.size)
    with np.errstate(invalid="ignore"):  # NaN cast into i8 fields: those bytes are dropped
        _copy_rows(full, flat, ts, gpu_pk, job_pk, vals)
    buf = flat.reshape(n, full.size)
    rows, cols = np.nonzero(nulls.T)  # null cells: (row, field), job_pk as field NF
    buf[rows[:, None], full.len_at[cols][:, None] + np.arange(4)] = 0xFF
    keep = np.ones(buf.shape, bool)
    keep[rows[:, None], full.val_at[cols]] = False
    return buf[keep].tobytes()


def insert_wide_rows(conn: Connection, ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray,
                     vals: np.ndarray) -> None:
    """Rows into a ``gpu_samples`` table of the wide layout (migration 0012's downgrade, the
    test that builds a database at the revision before it): binary COPY on PostgreSQL, one
    executemany of plain tuples on SQLite. ``job_pk`` < 0 is null, NaN is NULL."""
    cols = ", ".join(SAMPLE_COLUMNS)
    if is_postgres(conn):
        raw = conn.connection.driver_connection
        # the DBAPI connection is Optional in SQLAlchemy's types; set on a checked-out connection
        with raw.cursor() as cur, cur.copy(  # type: ignore[union-attr]
                f"COPY gpu_samples ({cols}) FROM STDIN WITH (FORMAT binary)") as cp:
            cp.write(copy_buffer(ts, gpu_pk, job_pk, vals))
        return
    data: list[list[object]] = [ts.tolist(), gpu_pk.tolist(), [None if j < 0 else j for j in job_pk.tolist()]]
    for j, f in enumerate(FIELDS):
        data.append([None if x != x else (int(x) if f.dtype == "i8" else x) for x in vals[j].tolist()])
    conn.exec_driver_sql(f"INSERT INTO gpu_samples ({cols}) VALUES ({', '.join('?' * len(SAMPLE_COLUMNS))})",
                         list(zip(*data, strict=True)))
