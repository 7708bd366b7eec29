"""Every read of raw samples goes through here (the blocks of ``gpu_sample_blocks`` are
opaque to everything else): ``read_raw`` for samples as numpy arrays, ``count_raw_samples``
for tests and operations, and ``job_sample_matrix``, the goodput analysis's raw read (kept as the fallback once the
analysis reads minute features).

A (GPU, ts) row whose fields were stored by several writes (a supplement row beside the
first one: ``unique_rows``) is read as one row, field by field (``sample_codec.coalesce``);
``count_raw_samples`` counts it once (a supplement block's ``n`` is 0: ``raw_samples``).

Only blocks that can overlap the asked time range are fetched: a block never crosses a
``BLOCK_S`` window, so ``t0 >= floor(lo / BLOCK_S) * BLOCK_S`` bounds the index scan on
(gpu_pk, t0) or (job_pk, t0) from below."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection, func, select

from gpufleet.storage.fields import FIELD_INDEX, FIELDS, NAMES
from gpufleet.storage.models import gpu_sample_blocks as _b
from gpufleet.storage.raw_samples import BLOCK_S
from gpufleet.storage.sample_codec import coalesce, decode_blocks, decode_times


@dataclass(frozen=True, slots=True)
class RawSamples:
    """Samples sorted by (gpu_pk, ts): ``vals[i]`` is field ``fields[i]`` (NaN = absent);
    ``job_pk`` -1 = no job."""

    ts: np.ndarray
    gpu_pk: np.ndarray
    job_pk: np.ndarray
    vals: np.ndarray
    fields: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.ts)

    def field(self, name: str) -> np.ndarray:
        row: np.ndarray = self.vals[self.fields.index(name)]
        return row


def _where(q: Any, job_pk: int | None, gpu_pks: Iterable[int] | None, t0: float, t1: float) -> Any:
    if job_pk is not None:
        q = q.where(_b.c.job_pk == int(job_pk))
    if gpu_pks is not None:
        q = q.where(_b.c.gpu_pk.in_(sorted({int(g) for g in gpu_pks})))
    if math.isfinite(t0):
        q = q.where(_b.c.t0 >= math.floor(t0 / BLOCK_S) * BLOCK_S, _b.c.t1 >= t0)
    if math.isfinite(t1):
        q = q.where(_b.c.t0 < t1)
    return q


def read_raw(conn: Connection, *, job_pk: int | None = None, gpu_pks: Iterable[int] | None = None,
             t0: float = -math.inf, t1: float = math.inf, fields: Sequence[str] | None = None) -> RawSamples:
    """The raw samples with ``t0 <= ts < t1`` of job ``job_pk`` and/or GPUs ``gpu_pks`` (all
    when neither is given), with the values of ``fields`` (every catalog field by default)."""
    names = tuple(NAMES if fields is None else fields)
    unknown = [f for f in names if f not in FIELD_INDEX]
    if unknown:
        raise ValueError(f"unknown fields {unknown}")
    return samples_of(fetch_blocks(conn, job_pk=job_pk, gpu_pks=gpu_pks, t0=t0, t1=t1), t0=t0, t1=t1,
                      fields=None if fields is None else names)


def fetch_blocks(conn: Connection, *, job_pk: int | None = None, gpu_pks: Iterable[int] | None = None,
                 t0: float = -math.inf, t1: float = math.inf) -> list[tuple[int, int | None, bytes]]:
    """The stored blocks (gpu_pk, job_pk, data) that can hold samples with ``t0 <= ts < t1`` of
    job ``job_pk`` and/or GPUs ``gpu_pks``, by (gpu_pk, t0), undecoded: for a caller that asks
    ``stored_times`` first and decodes values (``samples_of``) only when it must."""
    q = _where(select(_b.c.gpu_pk, _b.c.job_pk, _b.c.data), job_pk, gpu_pks, t0, t1)
    return [(int(g), j, bytes(d)) for g, j, d in conn.execute(q.order_by(_b.c.gpu_pk, _b.c.t0)).all()]


def stored_times(blocks: Sequence[tuple[int, int | None, bytes]], *, t0: float = -math.inf,
                 t1: float = math.inf) -> tuple[np.ndarray, np.ndarray]:
    """(gpu_pk, ts) of every stored sample of ``blocks`` with ``t0 <= ts < t1``, a supplement's
    copy of a row included (no field decoded, nothing coalesced: a row may appear twice)."""
    ts, counts = decode_times([b[2] for b in blocks])
    gpu = np.repeat(np.array([b[0] for b in blocks], np.int64), counts)
    keep = (ts >= t0) & (ts < t1)
    return gpu[keep], ts[keep]


def samples_of(blocks: Sequence[tuple[int, int | None, bytes]], *, t0: float = -math.inf, t1: float = math.inf,
               fields: Sequence[str] | None = None) -> RawSamples:
    """``blocks`` (from ``fetch_blocks``) decoded as ``read_raw`` answers: the samples with
    ``t0 <= ts < t1``, one row per (GPU, ts), sorted by (gpu_pk, ts)."""
    names = tuple(NAMES if fields is None else fields)
    ts, vals, counts = decode_blocks([b[2] for b in blocks])
    gpu = np.repeat(np.array([b[0] for b in blocks], np.int64), counts)
    job = np.repeat(np.array([-1 if b[1] is None else b[1] for b in blocks], np.int64), counts)
    keep = (ts >= t0) & (ts < t1)
    order = np.lexsort((ts[keep], gpu[keep]))
    pick = np.flatnonzero(keep)[order]
    rowsel = [FIELD_INDEX[f] for f in names] if fields is not None else slice(None)
    # Coalesce before dropping fields: a supplement row holding none of ``fields`` still
    # has to fold into its row, not stand as a second one.
    ts, gpu, job, v = coalesce(ts[pick], gpu[pick], job[pick], vals[:, pick])
    return RawSamples(ts, gpu, job, v[rowsel], names)


def raw_records(conn: Connection, **where: Any) -> list[dict[str, Any]]:
    """``read_raw(conn, **where)`` as one dict per sample, shaped like a row of the old wide
    table: ts, gpu_pk, job_pk (None = no job) and every field (None = absent, i8 fields as
    int). For tests, exports and operations on small ranges; readers of many samples use
    the arrays."""
    r = read_raw(conn, **where)
    is_int = [FIELDS[FIELD_INDEX[f]].dtype == "i8" for f in r.fields]
    cols: list[list[Any]] = []
    for v, integer in zip(r.vals, is_int, strict=True):
        cols.append([None if x != x else (int(x) if integer else x) for x in v.tolist()])
    keys = ("ts", "gpu_pk", "job_pk", *r.fields)
    jobs = [None if j < 0 else j for j in r.job_pk.tolist()]
    rows = zip(r.ts.tolist(), r.gpu_pk.tolist(), jobs, *cols, strict=True)
    return [dict(zip(keys, row, strict=True)) for row in rows]


def count_raw_samples(conn: Connection, *, job_pk: int | None = None, gpu_pks: Iterable[int] | None = None) -> int:
    """How many raw samples are stored (a block's ``n``, nothing decoded; a (GPU, ts) row
    whose fields came in several writes counts once)."""
    q = _where(select(func.coalesce(func.sum(_b.c.n), 0)), job_pk, gpu_pks, -math.inf, math.inf)
    return int(conn.execute(q).scalar_one())


def job_sample_matrix(conn: Connection, job_pk: int, since: float, fields: Sequence[str]) -> np.ndarray:
    """(rows, 2 + len(fields)) float64 of job ``job_pk``'s samples with ts >= ``since``:
    ts, gpu_pk, then the fields (NaN = absent), sorted by (gpu_pk, ts). What the goodput
    analysis read from the wide raw table."""
    r = read_raw(conn, job_pk=job_pk, t0=since if math.isfinite(since) else -math.inf, fields=fields)
    out = np.empty((len(r), 2 + len(fields)))
    out[:, 0] = r.ts
    out[:, 1] = r.gpu_pk
    out[:, 2:] = r.vals.T
    return out


__all__ = ["RawSamples", "count_raw_samples", "fetch_blocks", "job_sample_matrix", "raw_records", "read_raw",
           "samples_of", "stored_times"]
