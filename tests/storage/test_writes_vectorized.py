"""The vectorised write-path encoders (``_rollup``, ``copy_buffer``, ``_pg_array``) against
straightforward copies of the implementations they replaced: same inputs, same outputs, bit
for bit (float results compared by their bits, NaN positions included; buffers as bytes).

The ``old_*`` functions below are the pre-vectorisation code, kept verbatim (renamed) as the
reference; only their module-level constants come from ``writes`` or are copied here."""

from __future__ import annotations

import contextlib
import struct
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.storage import copy_encoding, pg_arrays, rollups
from gpufleet.storage.copy_encoding import SAMPLE_COLUMNS
from gpufleet.storage.fields import FIELDS, NF
from gpufleet.storage.fields import ROLLUP as _ROLLUP
from gpufleet.storage.pg_arrays import _Float8Array, _Int4Array, _PgArray
from gpufleet.storage.rollups import BUCKET_S

# Wire-format constants of the reference, copied so a change in the write path cannot move both sides.
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_VAL_DTYPE = {"f4": ">f4", "f8": ">f8", "i8": ">i8"}
_VAL_SIZE = {"f4": 4, "f8": 8, "i8": 8}
_ELEM = {False: (701, ">f8", 8), True: (23, ">i4", 4)}

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


# --- reference: the replaced implementations -----------------------------------------------

def old_rollup(keys: np.ndarray, ts: np.ndarray, vals: np.ndarray, carry: np.ndarray | None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Aggregate rows by (key, minute): returns key, bucket, n, last_ts, (NF, groups)
    aggregates and the ``carry`` value of each group's newest row."""
    bucket = np.floor(ts / BUCKET_S) * BUCKET_S
    order = np.lexsort((ts, bucket, keys))
    k, b, t, v = keys[order], bucket[order], ts[order], vals[:, order]
    starts = np.flatnonzero(np.r_[True, (k[1:] != k[:-1]) | (b[1:] != b[:-1])])
    ends = np.r_[starts[1:], len(k)] - 1
    n = np.diff(np.r_[starts, len(k)])
    nan = np.isnan(v)
    out = np.full((NF, len(starts)), np.nan)
    pos = np.where(nan, -1, np.arange(len(k))[None, :])
    for j in range(NF):
        if nan[j].all():
            continue
        kind = _ROLLUP[j]
        if kind == "max":
            out[j] = np.fmax.reduceat(v[j], starts)
        elif kind == "last":
            last = np.maximum.reduceat(pos[j], starts)
            got = last >= 0
            out[j, got] = v[j, last[got]]
        else:  # mean; sum_rate rolls up as the mean rate too
            cnt = np.add.reduceat(~nan[j], starts)
            s = np.add.reduceat(np.where(nan[j], 0.0, v[j]), starts)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[j] = np.where(cnt > 0, s / np.maximum(cnt, 1), np.nan)
    c = carry[order][ends] if carry is not None else None
    return k[starts], b[starts], n, t[ends], out, c


def old_copy_buffer(ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray, vals: np.ndarray) -> bytes:
    """Rows in PostgreSQL's binary COPY format, built with numpy: the rows sharing a null
    pattern (usually all of them) form one packed record array. ``job_pk`` < 0 is null."""
    n = len(ts)
    nulls = np.vstack([np.isnan(vals), (job_pk < 0)[None, :]])  # (NF+1, n)
    packed = np.ascontiguousarray(np.packbits(nulls, axis=0).T)
    if n and (packed == packed[0]).all():
        groups: list[np.ndarray | slice] = [slice(None)]
    else:
        keys = packed.view(np.dtype((np.void, packed.shape[1]))).ravel()
        _, inv = np.unique(keys, return_inverse=True)
        groups = [np.nonzero(inv == k)[0] for k in range(int(inv.max()) + 1)] if n else []
    parts = [_COPY_HEADER]
    ncols = struct.pack(">h", len(SAMPLE_COLUMNS))
    for g in groups:
        first = 0 if isinstance(g, slice) else int(g[0])
        row_null = nulls[:, first]
        spec: list[tuple[str, str]] = [("c", ">i2"), ("l0", ">i4"), ("ts", ">f8"), ("l1", ">i4"), ("gpu", ">i4"),
                                       ("l2", ">i4")]
        if not row_null[NF]:
            spec.append(("job", ">i4"))
        for j, f in enumerate(FIELDS):
            spec.append((f"l{j + 3}", ">i4"))
            if not row_null[j]:
                spec.append((f"v{j}", _VAL_DTYPE[f.dtype]))
        m = n if isinstance(g, slice) else len(g)
        rec = np.empty(m, dtype=np.dtype(spec))
        rec["c"] = struct.unpack(">h", ncols)[0]
        rec["l0"] = 8
        rec["ts"] = ts[g]
        rec["l1"] = 4
        rec["gpu"] = gpu_pk[g]
        if row_null[NF]:
            rec["l2"] = -1
        else:
            rec["l2"] = 4
            rec["job"] = job_pk[g]
        for j, f in enumerate(FIELDS):
            if row_null[j]:
                rec[f"l{j + 3}"] = -1
            else:
                rec[f"l{j + 3}"] = _VAL_SIZE[f.dtype]
                rec[f"v{j}"] = vals[j][g]
        parts.append(rec.tobytes())
    parts.append(b"\xff\xff")
    return b"".join(parts)


def old_pg_array(a: np.ndarray, *, integer: bool) -> _PgArray:
    """``a`` as a binary array parameter; NaN becomes NULL. Built with numpy: formatting
    every rollup value as text (repr + join) was the largest Python cost of a group commit."""
    af = a.astype(np.float64)
    nan = np.isnan(af)
    oid, dt, size = _ELEM[integer]
    n = len(af)
    rec = np.empty(n, dtype=[("l", ">i4"), ("v", dt)])
    rec["l"] = np.where(nan, -1, size)
    rec["v"] = np.where(nan, 0, af).astype(dt) if integer else af
    has_null = bool(nan.any())
    body = rec.tobytes()
    if has_null:  # a null element is its length (-1) alone: drop its value bytes
        keep = np.ones((n, 4 + size), dtype=bool)
        keep[nan, 4:] = False
        body = np.frombuffer(body, dtype=np.uint8).reshape(n, 4 + size)[keep].tobytes()
    head = struct.pack(">iiIii", 1, int(has_null), oid, n, 1)
    return (_Int4Array if integer else _Float8Array)(head + body)


# --- inputs --------------------------------------------------------------------------------

_I8 = np.array([f.dtype == "i8" for f in FIELDS])
_NAN_MODES = ("none", "cells", "fields", "rows", "all", "mixed")


def _samples(seed: int, n: int, nkeys: int, nan_mode: str, neg_zeros: bool = True
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """keys, ts, vals, carry: unsorted rows over a few keys and minutes with repeated
    (key, bucket) groups, tied timestamps, exact bucket boundaries, many 0.0 (and -0.0 unless
    ``neg_zeros`` is false), large integers in the i8 fields, and NaN (null) laid out as
    ``nan_mode`` says."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(1, nkeys + 1, n).astype(np.int64) * rng.choice([1, 1_000_003])
    # offsets on a coarse grid (ties, multiples of 60) plus some fractional ones
    off = rng.integers(0, 6, n) * 30.0 + rng.choice([0.0, 0.0, 0.25, 29.999, 59.5], n)
    ts = 1_700_000_040.0 + off
    vals = rng.uniform(-1e6, 1e6, (NF, n))
    vals[rng.random((NF, n)) < 0.1] = 0.0
    if neg_zeros:
        vals[rng.random((NF, n)) < 0.05] = -0.0
    big = rng.choice([0.0, 1.0, 4294967295.0, 2.0**53 - 1, 2.0**53 + 2, 1e15, 9.0e15, 2.0**62], (int(_I8.sum()), n))
    small = rng.integers(0, 1_000_000, (int(_I8.sum()), n)).astype(np.float64)
    vals[_I8] = np.where(rng.random((int(_I8.sum()), n)) < 0.5, big, small)
    if nan_mode == "cells":
        vals[rng.random((NF, n)) < rng.uniform(0.01, 0.6)] = np.nan
    elif nan_mode == "fields":  # fields a GPU model does not report: null in every row
        vals[rng.random(NF) < 0.3] = np.nan
    elif nan_mode == "rows":  # samples missing every field
        vals[:, rng.random(n) < 0.3] = np.nan
    elif nan_mode == "all":
        vals[:] = np.nan
    elif nan_mode == "mixed":
        vals[rng.random(NF) < 0.2] = np.nan
        vals[:, rng.random(n) < 0.1] = np.nan
        vals[rng.random((NF, n)) < 0.05] = np.nan
    carry = rng.integers(-1, 4, n).astype(np.int64)
    return keys, ts, vals, carry


def _assert_same(old: Any, new: Any) -> None:
    """Equal arrays with equal dtypes; floats by their bits (NaN where NaN, -0.0 is not 0.0)."""
    if old is None or new is None:
        assert old is None and new is None
        return
    assert isinstance(new, np.ndarray)
    assert old.dtype == new.dtype and old.shape == new.shape
    np.testing.assert_array_equal(old, new)
    if old.dtype.kind == "f":
        nan = np.isnan(old)
        np.testing.assert_array_equal(nan, np.isnan(new))
        np.testing.assert_array_equal(np.where(nan, 0, old).view(np.uint64), np.where(nan, 0, new).view(np.uint64))


def _assert_rollup_same(old: tuple[Any, ...], new: tuple[Any, ...]) -> None:
    assert len(old) == len(new) == 6
    for a, b in zip(old, new, strict=True):
        _assert_same(a, b)


@contextlib.contextmanager
def _copy_path(path: str) -> Iterator[None]:
    """Force copy_buffer's block-per-pattern or byte-mask path for buffers with several patterns."""
    saved = copy_encoding._COPY_MASK_BASE, copy_encoding._COPY_MASK_ROWS
    forced = (0, 1 << 30) if path == "mask" else (1 << 30, 1 << 30)
    copy_encoding._COPY_MASK_BASE, copy_encoding._COPY_MASK_ROWS = forced
    try:
        yield
    finally:
        copy_encoding._COPY_MASK_BASE, copy_encoding._COPY_MASK_ROWS = saved


def _copy_args(seed: int, n: int, nan_mode: str, jobs: str) -> tuple[np.ndarray, ...]:
    keys, ts, vals, _ = _samples(seed, n, 4, nan_mode)
    rng = np.random.default_rng(seed + 1)
    gpu_pk = keys % 2_147_483_647
    job_pk = {"all": rng.integers(1, 2**31 - 1, n), "none": np.full(n, -1),
              "some": np.where(rng.random(n) < 0.4, -1, rng.integers(1, 50, n))}[jobs].astype(np.int64)
    return ts, gpu_pk, job_pk, vals


# --- _rollup -------------------------------------------------------------------------------

@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 120), nkeys=st.integers(1, 5),
       nan_mode=st.sampled_from(_NAN_MODES), with_carry=st.booleans(), neg_zeros=st.booleans())
def test_rollup_matches_reference(seed: int, n: int, nkeys: int, nan_mode: str, with_carry: bool,
                                  neg_zeros: bool) -> None:
    """Bit for bit, -0.0 included: with a -0.0 among the max fields _rollup must take
    numpy's sequential fmax loop, as the reference did (see test_rollup_signed_zero_ties)."""
    keys, ts, vals, carry = _samples(seed, n, nkeys, nan_mode, neg_zeros)
    c = carry if with_carry else None
    _assert_rollup_same(old_rollup(keys, ts, vals, c), rollups.rollup(keys, ts, vals, c))


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 120), nan_mode=st.sampled_from(_NAN_MODES))
def test_rollup_of_a_row_subset_by_order(seed: int, n: int, nan_mode: str) -> None:
    """write_batches passes the job rows as an ``order`` into the full arrays instead of
    masked copies: the same result as the reference on the masked copies."""
    keys, ts, vals, carry = _samples(seed, n, 3, nan_mode)
    job = np.where(carry < 0, -1, keys)
    rows = np.flatnonzero(job >= 0)
    if not len(rows):
        return
    order = rows[np.lexsort((ts[rows], job[rows]))]
    _assert_rollup_same(old_rollup(job[rows], ts[rows], vals[:, rows], None),
                        rollups.rollup(job, ts, vals, None, order=order))
    full = np.lexsort((ts, keys))
    _assert_rollup_same(old_rollup(keys, ts, vals, carry), rollups.rollup(keys, ts, vals, carry, order=full))


@pytest.mark.parametrize("nan_mode", _NAN_MODES)
def test_rollup_single_row(nan_mode: str) -> None:
    keys, ts, vals, carry = _samples(7, 1, 1, nan_mode)
    _assert_rollup_same(old_rollup(keys, ts, vals, carry), rollups.rollup(keys, ts, vals, carry))


def test_rollup_realistic_group_commit() -> None:
    """8 GPUs x 10 s x 25 batches, three jobs and idle GPUs: many rows per (GPU, minute)."""
    rng = np.random.default_rng(3)
    n = 2000
    ts = np.concatenate([1_700_000_000.0 + b * 10 + np.repeat(np.arange(10.0), 8) for b in range(25)])
    gpu = np.tile(np.arange(101, 109), 250).astype(np.int64)
    job = np.where(gpu < 105, 7, np.where(gpu < 107, 9, -1)).astype(np.int64)
    vals = rng.uniform(0, 1, (NF, n))
    vals[_I8] = rng.integers(0, 10**12, (int(_I8.sum()), n))
    for v in (vals, np.where(rng.random((NF, n)) < 0.05, np.nan, vals)):
        _assert_rollup_same(old_rollup(gpu, ts, v, job), rollups.rollup(gpu, ts, v, job))
        m = job >= 0
        _assert_rollup_same(old_rollup(job[m], ts[m], v[:, m], None), rollups.rollup(job[m], ts[m], v[:, m], None))


def test_rollup_signed_zero_ties() -> None:
    """A max field whose group holds 0.0 and -0.0 (the case where numpy's SIMD and
    sequential fmax loops disagree), found by the reference's own result."""
    for seg in ([0.0, -5.0, -0.0], [-0.0, 0.0], [0.0, -0.0], [-0.0, -0.0, 0.0, -0.0], [-0.0] * 9 + [0.0] * 9):
        n = len(seg)
        ts = 1_700_000_040.0 + np.arange(float(n))
        vals = np.ones((NF, n))
        vals[rollups.MAX_ROWS] = seg
        keys = np.ones(n, np.int64)
        _assert_rollup_same(old_rollup(keys, ts, vals, None), rollups.rollup(keys, ts, vals, None))


def test_rollup_of_no_rows_fails_like_the_reference() -> None:
    """Callers never roll up zero rows; the reference raised IndexError for it."""
    keys, ts, vals, carry = np.empty(0, np.int64), np.empty(0), np.empty((NF, 0)), np.empty(0, np.int64)
    with pytest.raises(IndexError):
        old_rollup(keys, ts, vals, carry)
    with pytest.raises(IndexError):
        rollups.rollup(keys, ts, vals, carry)


def test_rollup_kinds_cover_the_catalog() -> None:
    rows = np.sort(np.concatenate([rollups.MEAN_ROWS, rollups.MAX_ROWS, rollups.LAST_ROWS]))
    np.testing.assert_array_equal(rows, np.arange(NF))
    assert all(_ROLLUP[j] == "max" for j in rollups.MAX_ROWS)
    assert all(_ROLLUP[j] == "last" for j in rollups.LAST_ROWS)


# --- copy_buffer ---------------------------------------------------------------------------

@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 150), nan_mode=st.sampled_from(_NAN_MODES),
       jobs=st.sampled_from(("all", "none", "some")), path=st.sampled_from(("auto", "blocks", "mask")))
def test_copy_buffer_matches_reference(seed: int, n: int, nan_mode: str, jobs: str, path: str) -> None:
    args = _copy_args(seed, n, nan_mode, jobs)
    expected = old_copy_buffer(*args)
    with contextlib.nullcontext() if path == "auto" else _copy_path(path):
        got = copy_encoding.copy_buffer(*args)
    assert type(got) is bytes
    assert got == expected


@pytest.mark.parametrize("path", ["blocks", "mask"])
@pytest.mark.parametrize("npatterns", [2, 3, 9, 40])
def test_copy_buffer_several_patterns(path: str, npatterns: int) -> None:
    """Rows with a few distinct null patterns interleaved: blocks in pattern order, rows in
    input order within each (the reference's np.unique order), by either path."""
    rng = np.random.default_rng(npatterns)
    n = 300
    ts, gpu_pk, job_pk, vals = _copy_args(11, n, "none", "some")
    patterns = rng.random((npatterns, NF)) < 0.3
    vals = np.where(patterns[rng.integers(0, npatterns, n)].T, np.nan, vals)
    with _copy_path(path):
        assert copy_encoding.copy_buffer(ts, gpu_pk, job_pk, vals) == old_copy_buffer(ts, gpu_pk, job_pk, vals)


def test_copy_buffer_edge_shapes() -> None:
    ts, gpu_pk, job_pk, vals = _copy_args(5, 40, "none", "all")
    cases = [
        (ts[:0], gpu_pk[:0], job_pk[:0], vals[:, :0]),  # no rows
        (ts[:1], gpu_pk[:1], job_pk[:1], vals[:, :1]),  # one row
        (ts[:1], gpu_pk[:1], np.array([-1]), vals[:, :1]),
        (ts[:1], gpu_pk[:1], job_pk[:1], np.full((NF, 1), np.nan)),
        (ts, gpu_pk, job_pk, np.full((NF, 40), np.nan)),  # every value null
        (ts, gpu_pk, np.full(40, -1), np.full((NF, 40), np.nan)),
        (ts, gpu_pk, job_pk, vals),  # nothing null
        (ts, gpu_pk, np.full(40, -1), vals),  # only job_pk null, one pattern
        (ts, gpu_pk, np.where(np.arange(40) % 2, -1, job_pk), vals),  # job_pk null in every other row
    ]
    for args in cases:
        assert copy_encoding.copy_buffer(*args) == old_copy_buffer(*args)


def test_copy_buffer_realistic_group_commit() -> None:
    rng = np.random.default_rng(4)
    n = 2000
    ts = 1_700_000_000.0 + np.sort(rng.uniform(0, 250, n))
    gpu = np.tile(np.arange(101, 109), 250).astype(np.int64)
    job = np.where(gpu < 105, 7, np.where(gpu < 107, 9, -1)).astype(np.int64)
    vals = rng.uniform(0, 1, (NF, n))
    vals[_I8] = rng.integers(0, 10**15, (int(_I8.sum()), n))
    for v in (vals, np.where(rng.random((NF, n)) < 0.05, np.nan, vals)):
        for j in (job, np.abs(job)):
            assert copy_encoding.copy_buffer(ts, gpu, j, v) == old_copy_buffer(ts, gpu, j, v)


def test_copy_buffer_reuses_its_buffer_safely_across_calls_and_threads() -> None:
    """The per-thread scratch buffer: big, small, big again, and several threads at once
    (and a buffer larger than what a thread keeps)."""
    cases = [_copy_args(s, n, mode, "some") for s, (n, mode) in
             enumerate([(500, "none"), (3, "cells"), (700, "mixed"), (1, "none"), (200, "fields")])]
    expected = [old_copy_buffer(*a) for a in cases]
    for a, e in zip(cases * 2, expected * 2, strict=True):
        assert copy_encoding.copy_buffer(*a) == e
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(30):
                j = (i + k) % len(cases)
                assert copy_encoding.copy_buffer(*cases[j]) == expected[j]
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    saved = copy_encoding._SCRATCH_KEEP
    copy_encoding._SCRATCH_KEEP = 1000
    try:
        assert copy_encoding.copy_buffer(*cases[0]) == expected[0]
    finally:
        copy_encoding._SCRATCH_KEEP = saved


# --- _pg_array -----------------------------------------------------------------------------

@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 60), integer=st.booleans(),
       nan_frac=st.sampled_from([0.0, 0.0, 0.1, 0.5, 1.0]), as_int64=st.booleans())
def test_pg_array_matches_reference(seed: int, n: int, integer: bool, nan_frac: float, as_int64: bool) -> None:
    rng = np.random.default_rng(seed)
    if integer:
        a = rng.integers(-(2**31), 2**31, n).astype(np.float64)
    else:
        a = rng.choice([0.0, -0.0, 1.5, 1e300, -2.5e-300, 1_700_000_040.0], n) * rng.uniform(0.5, 2, n)
    a[rng.random(n) < nan_frac] = np.nan
    if integer and as_int64 and not np.isnan(a).any():
        a = a.astype(np.int64)  # keys and counts arrive as int64
    got = pg_arrays.pg_array(a, integer=integer)
    want = old_pg_array(a, integer=integer)
    assert type(got) is type(want)
    assert got.data == want.data


def _float8_elements(data: bytes) -> tuple[bool, bytes]:
    """A one-dimensional binary float8[]: (has a null bitmap, its elements' big-endian bytes)."""
    ndim, hasnull, oid, n, _lb = struct.unpack(">iiIii", data[:20])
    assert (ndim, oid) == (1, 701)
    elems = np.frombuffer(data[20:], dtype=np.dtype([("l", ">i4"), ("v", ">f8")]))
    assert len(elems) == n and (elems["l"] == 8).all()  # every element present, 8 bytes
    return bool(hasnull), elems["v"].tobytes()


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 35), n=st.integers(0, 40),
       nan_mode=st.sampled_from(("none", "cells", "rows")))
def test_pg_float_values_send_every_value_with_nan_as_a_value(seed: int, rows: int, n: int, nan_mode: str) -> None:
    """The upserts' float8[] parameters (array_rows reads them by subscript): every value bit
    for bit, NaN and -0.0 included, never a null bitmap; a row without NaN is exactly what
    the NULL-for-NaN reference encodes."""
    rng = np.random.default_rng(seed)
    mat = rng.uniform(-1e9, 1e9, (rows, n))
    mat[rng.random((rows, n)) < 0.1] = -0.0
    if nan_mode == "cells":
        mat[rng.random((rows, n)) < 0.2] = np.nan
    elif nan_mode == "rows":
        mat[rng.random(rows) < 0.5] = np.nan
    got = pg_arrays.pg_float_values(mat)
    assert len(got) == rows
    for j, g in enumerate(got):
        hasnull, values = _float8_elements(g.data)
        assert not hasnull and values == mat[j].astype(">f8").tobytes()
        if not np.isnan(mat[j]).any():
            assert g.data == old_pg_array(mat[j], integer=False).data


def test_pg_float_values_of_a_rollup() -> None:
    keys, ts, vals, carry = _samples(9, 300, 4, "mixed")
    agg = rollups.rollup(keys, ts, vals, carry)[4]
    for g, r in zip(pg_arrays.pg_float_values(agg), agg, strict=True):
        assert _float8_elements(g.data) == (False, r.astype(">f8").tobytes())
