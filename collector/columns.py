"""Sample columns -> arrays, checked against the metric catalog (types, finiteness, ranges,
integer fields): ``prepare`` for any decoded batch, ``prepare_typed`` for the columns the
fast decoder produced, ``field_bounds`` / ``field_bounds_ok`` for the packed fast path. The
one home of these rules; every refusal is a ``BatchRejected`` naming the column and row.

Cost model: per-row Python work is what limits a Python collector, so the usual valid batch
is converted and checked with a handful of numpy calls; only a batch that fails one of them
is walked column by column to name the first bad value."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import msgspec
import numpy as np

from gpufleet.collector.errors import reject
from gpufleet.protocol import Batch
from gpufleet.storage.fields import FIELD_INDEX, FIELDS, IS_I8, MAX, MIN, NF
from gpufleet.storage.prepared import Prepared

_FLOAT_COLUMNS = list[list[float | None]]
_NUM_TYPES = {float, int}
_NUM_OR_NONE = {float, int, type(None)}


def _first_bad(col: Sequence[Any], ok: set[type]) -> int:
    return next(i for i, v in enumerate(col) if type(v) not in ok)


def _numeric(name: str, col: Sequence[Any], allow_none: bool) -> np.ndarray:
    ok = _NUM_OR_NONE if allow_none else _NUM_TYPES
    if not set(map(type, col)) <= ok:
        i = _first_bad(col, ok)
        raise reject("samples", f"expected a number{' or null' if allow_none else ''}, got {type(col[i]).__name__}",
                     field=name, row=i)
    try:
        arr = np.array(col, dtype=np.float64)
    except OverflowError:
        i = next(i for i, v in enumerate(col) if isinstance(v, int) and abs(v) > 1e300)
        raise reject("samples", "integer too large", field=name, row=i) from None
    bad = ~np.isfinite(arr)
    if bad.any():
        nones = col.count(None) if allow_none else 0
        if int(bad.sum()) != nones or np.isinf(arr).any():
            i = next(i for i, v in enumerate(col) if isinstance(v, float) and not math.isfinite(v))
            raise reject("samples", f"{col[i]!r} is not a finite number", field=name, row=i)
    return arr


def prepare(batch: Batch) -> Prepared:
    """Columns -> arrays, checked against the catalog (types, finiteness, ranges, integer
    fields). Raises BatchRejected naming the column and row."""
    s = batch.samples
    if not s:
        return Prepared(batch, np.empty(0), [], [], np.full((NF, 0), np.nan))
    if "ts" not in s:
        raise reject("samples", "missing column 'ts'")
    if "gpu" not in s:
        raise reject("samples", "missing column 'gpu'")
    n = len(s["ts"])
    for name, col in s.items():
        if name not in FIELD_INDEX and name not in ("ts", "gpu", "job"):
            raise reject("samples", "unknown field (not in the metric catalog)", field=name)
        if len(col) != n:
            raise reject("samples", f"{len(col)} values, expected {n} (as many as samples.ts)", field=name)
    ts = _numeric("ts", s["ts"], allow_none=False)
    gpu_col = s["gpu"]
    if set(map(type, gpu_col)) - {str}:
        i = _first_bad(gpu_col, {str})
        raise reject("samples", f"expected a GPU uuid string, got {type(gpu_col[i]).__name__}", field="gpu", row=i)
    gpu = cast("list[str]", gpu_col)  # every entry checked to be a str just above
    job_col = s.get("job")
    if job_col is None:
        job: list[str | None] = [None] * n
    elif set(map(type, job_col)) - {str, type(None)}:
        i = _first_bad(job_col, {str, type(None)})
        raise reject("samples", f"expected a job id string or null, got {type(job_col[i]).__name__}", field="job",
                     row=i)
    else:
        job = cast("list[str | None]", job_col)  # every entry checked to be a str or None just above
    vals = np.full((NF, n), np.nan)
    present = [(FIELD_INDEX[name], name) for name in s if name in FIELD_INDEX]
    if present and n and _fast_fields(s, present, vals):
        check_unique_rows(ts, gpu)
        return Prepared(batch, ts, list(gpu), list(job), vals, tuple(name for _, name in present))
    cols = []
    for name, col in s.items():
        j = FIELD_INDEX.get(name)
        if j is None:
            continue
        cols.append(name)
        arr = _numeric(name, col, allow_none=True)
        with np.errstate(invalid="ignore"):
            out = (arr < MIN[j]) | (arr > MAX[j])
            if IS_I8[j]:
                out |= (arr != np.floor(arr)) & ~np.isnan(arr)  # null is fine, 1.5 is not
        if out.any():
            i = int(np.argmax(out))
            f = FIELDS[j]
            why = f.check(col[i]) or f"{name}: {col[i]!r} must be an integer"
            raise reject("samples", why.split(": ", 1)[1], field=name, row=i)
        vals[j] = arr
    check_unique_rows(ts, gpu)
    return Prepared(batch, ts, list(gpu), list(job), vals, tuple(cols))


def prepare_typed(batch: Batch, s: dict[str, Any]) -> Prepared | None:
    """``prepare`` for columns a typed decoder already produced (``ts``: floats, ``gpu``:
    strings, ``job``: strings or None, fields: floats or None; ``ts`` and fields may also be
    float64 numpy arrays). Returns None when anything is
    wrong: the caller then runs the generic ``prepare``, which names the field and row."""
    if not s:
        return Prepared(batch, np.empty(0), [], [], np.full((NF, 0), np.nan))
    n = len(s["ts"])
    if any(len(c) != n for c in s.values()):
        return None
    ts = np.array(s["ts"], dtype=np.float64)
    if not np.isfinite(ts).all():
        return None
    vals = np.full((NF, n), np.nan)
    present = [(FIELD_INDEX[name], name) for name in s if name in FIELD_INDEX]
    if present and n and not _fast_fields(s, present, vals, typed=True):
        return None
    if n > 1 and repeated_row(ts, _codes(s["gpu"])) is not None:
        return None
    job = s.get("job")
    return Prepared(batch, ts, s["gpu"], job if job is not None else [None] * n, vals,
                    tuple(name for _, name in present))


def _fast_fields(s: dict[str, list[Any]], present: list[tuple[int, str]], vals: np.ndarray,
                 typed: bool = False) -> bool:
    """All field columns converted and checked at once (the common, valid case). Returns
    False when anything looks wrong; the per-column path then finds and names the error."""
    cols = [s[name] for _, name in present]
    try:
        # One C pass: every value a number or null (a string or bool fails). 3x faster
        # than collecting the element types in Python. Typed decoders already did it.
        if not typed:
            msgspec.convert(cols, _FLOAT_COLUMNS)
        mat = np.array(cols, dtype=np.float64)
    except (msgspec.ValidationError, OverflowError, ValueError, TypeError):
        return False
    nan = np.isnan(mat)
    # Only list columns can hold nulls (a numpy column from the collector's fast decode
    # has none), so any NaN beyond the lists' None count is a real NaN, not a null.
    if nan.any() and int(nan.sum()) != sum(c.count(None) for c in cols if isinstance(c, list)):
        return False  # a real NaN, not a null
    idx = np.array([j for j, _ in present])
    if not field_bounds_ok(mat, field_bounds(idx)):
        return False
    vals[idx] = mat
    return True


FieldBounds = tuple[np.ndarray, np.ndarray, np.ndarray]


def field_bounds(idx: np.ndarray) -> FieldBounds:
    """For the catalog fields ``idx`` (rows of a value matrix): their minimums and maximums as
    columns, and which rows are integer fields. Callers seeing the same fields batch after
    batch may keep it."""
    return MIN[idx][:, None], MAX[idx][:, None], np.flatnonzero(IS_I8[idx])


def field_bounds_ok(mat: np.ndarray, bounds: FieldBounds) -> bool:
    """Every value of ``mat`` within its field's range (so finite) and whole for integer
    fields. NaN ("not available") passes: it compares False both ways, and comparisons never
    warn on NaN, so no errstate (which costs more than the test) is needed."""
    lo, hi, int_rows = bounds
    if ((mat < lo) | (mat > hi)).any():
        return False
    # A fraction lies above its floor; a whole number equals it, and a NaN compares False (so
    # "not available" passes); the values are finite here (inside their ranges). Four numpy
    # calls instead of seven (!=, isnan, ~, & around the floor): this check was the collector's
    # largest self time under py-spy (9% of the GIL, 1,000-connection ingest bench).
    if len(int_rows):
        m = mat[int_rows]
        return not (np.floor(m) < m).any()
    return True


def _codes(gpu: Sequence[str]) -> np.ndarray:
    codes = {u: k for k, u in enumerate(dict.fromkeys(gpu))}
    return np.fromiter(map(codes.__getitem__, gpu), dtype=np.int64, count=len(gpu))


def repeated_row(ts: np.ndarray, gpu: np.ndarray) -> tuple[int, int] | None:
    """(row, earlier row) of the first row repeating an earlier row's (gpu, ts), or None.
    ``gpu``: any integer code per row (the packed indices, or ``_codes``). Rows in (ts, gpu)
    order, what agents send, are decided with a few comparisons and no sort."""
    if len(ts) < 2:
        return None
    d = ts[1:] - ts[:-1]
    if ((d > 0) | ((d == 0) & (gpu[1:] > gpu[:-1]))).all():
        return None
    order = np.lexsort((gpu, ts))  # stable: the first of equal keys stays first
    same = np.flatnonzero((ts[order][1:] == ts[order][:-1]) & (gpu[order][1:] == gpu[order][:-1]))
    if not len(same):
        return None
    later = order[same + 1]
    k = int(np.argmin(later))
    return int(later[k]), int(order[same[k]])


def check_unique_rows(ts: np.ndarray, gpu: Sequence[str]) -> None:
    """A GPU has one sample per instant: a batch repeating a (gpu, ts) is malformed (an agent
    never produces one), refused naming both rows rather than silently picking one."""
    if len(ts) < 2:
        return
    hit = repeated_row(ts, _codes(gpu))
    if hit is not None:
        r, first = hit
        raise reject("samples", f"GPU {gpu[r]!r} already has a sample at {float(ts[r]):.3f} (row {first})",
                     field="ts", row=r)
