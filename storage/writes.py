"""The write path: protocol batches -> dimensions, wide sample rows, rollups, events.

``write_batches(conn, batches, now)`` runs inside the caller's transaction, so a caller gets
all-or-nothing across everything it passes (the collector's group commit, an NDJSON import).
It is the only code that writes telemetry; ingest, import and tests all go through it.

Cost model (why it looks like this): per-row Python work is what limits a Python collector,
so samples stay columnar end to end. ``prepare`` turns a batch's columns into one float64
matrix (NaN = null; real NaNs are rejected first), ranges are checked with numpy, rollups are
computed with sorted reductions, and on PostgreSQL the rows are serialised straight into the
binary COPY format by numpy (strided views over one row buffer, a cached layout per null
pattern), so no Python object is created per row. SQLite gets one ``executemany`` of tuples
(WAL, one transaction).

Deadlocks between concurrent writers (several collector processes) are avoided by touching
shared rows in sorted key order; the caller retries the rare one that remains."""

from __future__ import annotations

import itertools
import math
import struct
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format
from sqlalchemy import Connection, and_, bindparam, case, literal_column, select, text, update
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

from gpufleet.catalog import CATALOG
from gpufleet.protocol import Batch
from gpufleet.storage import retention
from gpufleet.storage.models import (
    Allocation,
    Cluster,
    Event,
    Gpu,
    Job,
    Node,
    gpu_samples_1m,
    job_samples_1m,
)

FIELDS = CATALOG.fields
NAMES: tuple[str, ...] = CATALOG.names
FIELD_INDEX = {n: i for i, n in enumerate(NAMES)}
NF = len(FIELDS)
_IS_I8 = np.array([f.dtype == "i8" for f in FIELDS])
_MIN = np.array([f.min for f in FIELDS])
_MAX = np.array([f.max for f in FIELDS])
# Every catalog range is finite, so a range test also rejects +-inf (field_bounds_ok).
assert np.isfinite(_MIN).all() and np.isfinite(_MAX).all()
_ROLLUP = [f.rollup for f in FIELDS]
STALE_JOB_S = 300.0  # a job nobody reported for this long has ended
BUCKET_S = 60.0
_FLOAT_COLUMNS = list[list[float | None]]
_NUM_TYPES = {float, int}
_NUM_OR_NONE = {float, int, type(None)}


class BatchRejected(Exception):
    """A batch that can never be stored (4xx): ``detail`` names the field and row.
    ``index`` is the batch's position in the ``write_batches`` call, when known."""

    def __init__(self, detail: str, status: int = 422, index: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.index = index


@dataclass(slots=True)
class Prepared:
    """A batch with its samples as arrays: ``vals[j]`` is field ``NAMES[j]`` over all rows,
    NaN where the agent sent null or did not send the column."""

    batch: Batch
    ts: np.ndarray
    gpu: list[str]
    job: list[str | None]
    vals: np.ndarray
    columns: tuple[str, ...] = ()

    @property
    def n(self) -> int:
        return len(self.ts)

    @property
    def key(self) -> tuple[str, int]:
        return (self.batch.agent.boot_id, self.batch.agent.seq)


@dataclass(slots=True)
class BatchResult:
    stored: int
    duplicate: bool


@dataclass(slots=True)
class WriteResult:
    results: list[BatchResult] = field(default_factory=list)

    @property
    def stored(self) -> int:
        return sum(r.stored for r in self.results)

    @property
    def duplicate(self) -> bool:
        return bool(self.results) and all(r.duplicate for r in self.results)


def _first_bad(col: Sequence[Any], ok: set[type]) -> int:
    return next(i for i, v in enumerate(col) if type(v) not in ok)


def _numeric(name: str, col: Sequence[Any], allow_none: bool) -> np.ndarray:
    ok = _NUM_OR_NONE if allow_none else _NUM_TYPES
    if not set(map(type, col)) <= ok:
        i = _first_bad(col, ok)
        raise BatchRejected(f"samples.{name}[{i}]: expected a number{' or null' if allow_none else ''}, "
                            f"got {type(col[i]).__name__}")
    try:
        arr = np.array(col, dtype=np.float64)
    except OverflowError:
        i = next(i for i, v in enumerate(col) if isinstance(v, int) and abs(v) > 1e300)
        raise BatchRejected(f"samples.{name}[{i}]: integer too large") from None
    bad = ~np.isfinite(arr)
    if bad.any():
        nones = col.count(None) if allow_none else 0
        if int(bad.sum()) != nones or np.isinf(arr).any():
            i = next(i for i, v in enumerate(col) if isinstance(v, float) and not math.isfinite(v))
            raise BatchRejected(f"samples.{name}[{i}]: {col[i]!r} is not a finite number")
    return arr


def prepare(batch: Batch) -> Prepared:
    """Columns -> arrays, checked against the catalog (types, finiteness, ranges, integer
    fields). Raises BatchRejected naming the column and row."""
    s = batch.samples
    if not s:
        return Prepared(batch, np.empty(0), [], [], np.full((NF, 0), np.nan))
    if "ts" not in s:
        raise BatchRejected("samples: missing column 'ts'")
    if "gpu" not in s:
        raise BatchRejected("samples: missing column 'gpu'")
    n = len(s["ts"])
    for name, col in s.items():
        if name not in FIELD_INDEX and name not in ("ts", "gpu", "job"):
            raise BatchRejected(f"samples.{name}: unknown field (not in the metric catalog)")
        if len(col) != n:
            raise BatchRejected(f"samples.{name}: {len(col)} values, expected {n} (as many as samples.ts)")
    ts = _numeric("ts", s["ts"], allow_none=False)
    gpu = s["gpu"]
    if set(map(type, gpu)) - {str}:
        i = _first_bad(gpu, {str})
        raise BatchRejected(f"samples.gpu[{i}]: expected a GPU uuid string, got {type(gpu[i]).__name__}")
    job = s.get("job")
    if job is None:
        job = [None] * n
    elif set(map(type, job)) - {str, type(None)}:
        i = _first_bad(job, {str, type(None)})
        raise BatchRejected(f"samples.job[{i}]: expected a job id string or null, got {type(job[i]).__name__}")
    vals = np.full((NF, n), np.nan)
    present = [(FIELD_INDEX[name], name) for name in s if name in FIELD_INDEX]
    if present and n and _fast_fields(s, present, vals):
        return Prepared(batch, ts, list(gpu), list(job), vals, tuple(name for _, name in present))
    cols = []
    for name, col in s.items():
        j = FIELD_INDEX.get(name)
        if j is None:
            continue
        cols.append(name)
        arr = _numeric(name, col, allow_none=True)
        with np.errstate(invalid="ignore"):
            out = (arr < _MIN[j]) | (arr > _MAX[j])
            if _IS_I8[j]:
                out |= (arr != np.floor(arr)) & ~np.isnan(arr)  # null is fine, 1.5 is not
        if out.any():
            i = int(np.argmax(out))
            f = FIELDS[j]
            why = f.check(col[i]) or f"{name}: {col[i]!r} must be an integer"
            raise BatchRejected(f"samples.{name}[{i}]: {why.split(': ', 1)[1]}")
        vals[j] = arr
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
    return _MIN[idx][:, None], _MAX[idx][:, None], np.flatnonzero(_IS_I8[idx])


def field_bounds_ok(mat: np.ndarray, bounds: FieldBounds) -> bool:
    """Every value of ``mat`` within its field's range (so finite) and whole for integer
    fields. NaN ("not available") passes: it compares False both ways, and comparisons never
    warn on NaN, so no errstate (which costs more than the test) is needed."""
    lo, hi, int_rows = bounds
    if ((mat < lo) | (mat > hi)).any():
        return False
    if len(int_rows):
        m = mat[int_rows]
        if ((m != np.floor(m)) & ~np.isnan(m)).any():
            return False
    return True


# --- caches --------------------------------------------------------------------------------

@dataclass
class WriteCache:
    """Ids of dimension rows (immutable once created) and the last attributes written, so a
    steady stream of batches does not re-upsert unchanged nodes, GPUs and jobs. Per process;
    cleared by the caller after any failed transaction."""

    clusters: dict[str, int] = field(default_factory=dict)
    nodes: dict[tuple[int, str], int] = field(default_factory=dict)
    gpus: dict[str, tuple[int, int, tuple[Any, ...], float]] = field(default_factory=dict)  # uuid -> pk,node,attrs,seen
    jobs: dict[tuple[int, str], tuple[int, tuple[Any, ...]]] = field(default_factory=dict)
    job_times: dict[int, tuple[float, float]] = field(default_factory=dict)  # pk -> start, last written
    node_seen: dict[int, tuple[float, str]] = field(default_factory=dict)  # pk -> last_seen, version written
    # gpu_pk -> (open allocation's job_pk or None, its start, when read from the database)
    allocs: dict[int, tuple[int | None, float, float]] = field(default_factory=dict)

    def clear(self) -> None:
        self.clusters.clear()
        self.nodes.clear()
        self.gpus.clear()
        self.jobs.clear()
        self.job_times.clear()
        self.node_seen.clear()
        self.allocs.clear()


GPU_SEEN_EVERY_S = 600.0  # gpus.last_seen granularity (nodes.last_seen is exact; nothing reads the GPU one)
# jobs.last_sample_ts granularity for a long-lived cache (the collector's): a job's row is
# shared by every node of the job, so updating it in every group commit would serialise
# concurrent collector processes on that row lock. Stale-job detection works in minutes.
JOB_TOUCH_EVERY_S = 15.0
# How long a GPU's open allocation read from the database is trusted without reading it
# again. Well below STALE_JOB_S: another process closes allocations only of jobs silent that
# long, and a GPU still sending samples of the job refreshes the entry long before.
ALLOC_TRUST_S = 60.0
NODE_SEEN_EVERY_S = 5.0  # nodes.last_seen granularity (agents flush every ~10 s anyway)
GPU_MOVE_AFTER_S = 600.0  # a GPU uuid may move to another node once its old node is silent this long


def _insert(conn: Connection, table: Any) -> Any:
    mod = pg_dialect if conn.dialect.name == "postgresql" else sqlite_dialect
    return mod.insert(table)


# --- dimensions ----------------------------------------------------------------------------

def _cluster_ids(conn: Connection, names: Iterable[str], cache: WriteCache) -> dict[str, int]:
    todo = sorted({n for n in names if n not in cache.clusters})
    if todo:
        t = Cluster.__table__
        conn.execute(_insert(conn, t).on_conflict_do_nothing(index_elements=["name"]), [{"name": n} for n in todo])
        for cid, name in conn.execute(select(t.c.id, t.c.name).where(t.c.name.in_(todo))):
            cache.clusters[name] = cid
    return cache.clusters


def _node_ids(conn: Connection, keys: Iterable[tuple[int, str]], cache: WriteCache) -> dict[tuple[int, str], int]:
    todo = sorted({k for k in keys if k not in cache.nodes})
    if todo:
        t = Node.__table__
        conn.execute(_insert(conn, t).on_conflict_do_nothing(index_elements=["cluster_id", "name"]),
                     [{"cluster_id": c, "name": n} for c, n in todo])
        for cid in {c for c, _ in todo}:
            names = [n for c, n in todo if c == cid]
            for nid, name in conn.execute(select(t.c.id, t.c.name).where(t.c.cluster_id == cid, t.c.name.in_(names))):
                cache.nodes[(cid, name)] = nid
    return cache.nodes


def _gpu_ids(conn: Connection, per_node: dict[int, dict[str, Any]], now: float, cache: WriteCache,
             batch_of_node: dict[int, int]) -> dict[str, int]:
    """Upsert the GPUs each node reported (new, changed, or not marked seen for a while)."""
    t = Gpu.__table__
    out: dict[str, int] = {}
    todo: list[dict[str, Any]] = []
    for node_id, gpus in per_node.items():
        for uuid, g in gpus.items():
            attrs = (g.index, g.model, g.mig_profile, g.parent_uuid, g.memory_total_bytes)
            hit = cache.gpus.get(uuid)
            if hit and hit[1] == node_id and hit[2] == attrs and now - hit[3] < GPU_SEEN_EVERY_S:
                out[uuid] = hit[0]
                continue
            todo.append({"uuid": uuid, "node_id": node_id, "index": g.index, "model": g.model,
                         "mig_profile": g.mig_profile, "parent_uuid": g.parent_uuid,
                         "memory_total_bytes": g.memory_total_bytes, "last_seen": now})
    if not todo:
        return out
    todo.sort(key=lambda r: r["uuid"])
    uuids = [r["uuid"] for r in todo]
    existing = {r.uuid: r for r in conn.execute(
        select(t.c.uuid, t.c.node_id, Node.last_seen, Node.name).join(Node, Node.id == t.c.node_id)
        .where(t.c.uuid.in_(uuids)))}
    for r in todo:
        e = existing.get(r["uuid"])
        moved = e is not None and e.node_id != r["node_id"]
        if moved and e.last_seen is not None and now - e.last_seen < GPU_MOVE_AFTER_S:
            raise BatchRejected(f"gpus: uuid {r['uuid']!r} is being reported by node {e.name!r}", 409,
                                index=batch_of_node.get(r["node_id"]))
    ins = _insert(conn, t)
    conn.execute(ins.on_conflict_do_update(index_elements=["uuid"], set_={
        c: ins.excluded[c] for c in ("node_id", "index", "model", "mig_profile", "parent_uuid",
                                     "memory_total_bytes", "last_seen")}), todo)
    ids = dict(conn.execute(select(t.c.uuid, t.c.id).where(t.c.uuid.in_(uuids))).all())
    for r in todo:
        pk = ids[r["uuid"]]
        out[r["uuid"]] = pk
        cache.gpus[r["uuid"]] = (pk, r["node_id"], (r["index"], r["model"], r["mig_profile"], r["parent_uuid"],
                                                    r["memory_total_bytes"]), now)
    return out


_JOB_ATTRS = ("source", "user", "name", "account", "partition", "namespace", "num_nodes", "ntasks", "labels")


def _job_ids(conn: Connection, jobs: dict[tuple[int, str], Any], cache: WriteCache) -> dict[tuple[int, str], int]:
    """Upsert jobs (described by JobInfo, or bare when only referenced by samples)."""
    t = Job.__table__
    out: dict[tuple[int, str], int] = {}
    todo: list[dict[str, Any]] = []
    for key, info in jobs.items():
        if info is None:
            attrs: tuple[Any, ...] = ()
        else:
            attrs = (info.source, info.user, info.name, info.account, info.partition, info.namespace,
                     info.num_nodes, info.ntasks, tuple(sorted(info.labels.items())))
        hit = cache.jobs.get(key)
        if hit and (not attrs or hit[1] == attrs):
            out[key] = hit[0]
            continue
        row: dict[str, Any] = {"cluster_id": key[0], "job_id": key[1], "state": "running",
                               "start_ts": info.start_ts if info is not None else None, "end_ts": None,
                               "last_sample_ts": None}
        if info is None:
            row.update(dict.fromkeys(_JOB_ATTRS), source="unknown")
        else:
            row.update(zip(_JOB_ATTRS, (*attrs[:-1], dict(info.labels) or None), strict=True))
        todo.append((row, attrs))  # type: ignore[arg-type]
    if not todo:
        return out
    todo.sort(key=lambda ra: (ra[0]["cluster_id"], ra[0]["job_id"]))  # type: ignore[index]
    ins = _insert(conn, t)
    # A described job overwrites a bare one's attributes; a bare reference changes nothing.
    described = [r for r, a in todo if a]  # type: ignore[misc]
    bare = [r for r, a in todo if not a]  # type: ignore[misc]
    if described:
        start = case((and_(t.c.start_ts.is_not(None), t.c.start_ts < ins.excluded.start_ts), t.c.start_ts),
                     else_=ins.excluded.start_ts)
        conn.execute(ins.on_conflict_do_update(
            index_elements=["cluster_id", "job_id"],
            set_={**{c: ins.excluded[c] for c in _JOB_ATTRS},
                  "start_ts": case((ins.excluded.start_ts.is_(None), t.c.start_ts), else_=start)}), described)
    if bare:
        conn.execute(ins.on_conflict_do_nothing(index_elements=["cluster_id", "job_id"]), bare)
    for cid in sorted({r["cluster_id"] for r, _ in todo}):  # type: ignore[index]
        names = [r["job_id"] for r, _ in todo if r["cluster_id"] == cid]  # type: ignore[index]
        for pk, jid in conn.execute(select(t.c.id, t.c.job_id).where(t.c.cluster_id == cid, t.c.job_id.in_(names))):
            out[(cid, jid)] = pk
    for r, a in todo:  # type: ignore[misc]
        key = (r["cluster_id"], r["job_id"])
        if a or key not in cache.jobs:
            cache.jobs[key] = (out[key], a)
    return out


# --- samples -------------------------------------------------------------------------------

_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = b"\xff\xff"
_VAL_DTYPE = {"f4": ">f4", "f8": ">f8", "i8": ">i8"}
_VAL_SIZE = {"f4": 4, "f8": 8, "i8": 8}
SAMPLE_COLUMNS = ("ts", "gpu_pk", "job_pk", *NAMES)
_COPY_SQL = f"COPY gpu_samples ({', '.join(SAMPLE_COLUMNS)}) FROM STDIN WITH (FORMAT binary)"
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


_COPY_LAYOUTS: dict[bytes, _CopyLayout] = {}
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
    if len(_COPY_LAYOUTS) >= 1024:  # random null patterns must not grow it without bound
        _COPY_LAYOUTS.clear()
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


def _insert_samples(conn: Connection, ts: np.ndarray, gpu_pk: np.ndarray, job_pk: np.ndarray, vals: np.ndarray) -> None:
    if not len(ts):
        return
    if conn.dialect.name == "postgresql":
        buf = copy_buffer(ts, gpu_pk, job_pk, vals)
        raw = conn.connection.driver_connection
        with raw.cursor() as cur, cur.copy(_COPY_SQL) as cp:  # type: ignore[union-attr]
            cp.write(buf)
        return
    cols: list[Any] = [ts.tolist(), gpu_pk.tolist(), [None if j < 0 else j for j in job_pk.tolist()]]
    for j in range(NF):
        v = vals[j]
        nan = np.isnan(v)
        if nan.all():
            cols.append([None] * len(ts))
        elif _IS_I8[j]:
            cols.append([None if x else int(y) for x, y in zip(nan.tolist(), v.tolist(), strict=True)])
        elif nan.any():
            cols.append([None if x else y for x, y in zip(nan.tolist(), v.tolist(), strict=True)])
        else:
            cols.append(v.tolist())
    sql = f"INSERT INTO gpu_samples ({', '.join(SAMPLE_COLUMNS)}) VALUES ({', '.join('?' * len(SAMPLE_COLUMNS))})"
    conn.exec_driver_sql(sql, list(zip(*cols, strict=True)))


# --- rollups -------------------------------------------------------------------------------

# Catalog rows of each rollup kind, so a rollup runs one reduction per kind over all its
# fields instead of one per field (the per-field numpy calls were most of its cost).
# Anything that is not max or last rolls up as a mean (sum_rate too: the mean rate).
_MAX_ROWS = np.array([j for j, r in enumerate(_ROLLUP) if r == "max"], dtype=np.intp)
_LAST_ROWS = np.array([j for j, r in enumerate(_ROLLUP) if r == "last"], dtype=np.intp)
_MEAN_ROWS = np.array([j for j, r in enumerate(_ROLLUP) if r not in ("max", "last")], dtype=np.intp)
_NEG_ZERO_BITS = np.array(-0.0).view(np.int64)


def _rollup(keys: np.ndarray, ts: np.ndarray, vals: np.ndarray, carry: np.ndarray | None,
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
    if len(_MEAN_ROWS):
        vm = v[_MEAN_ROWS]
        if has_nan:
            nm = nan[_MEAN_ROWS]
            cnt = np.add.reduceat(~nm, starts, axis=1)
            s = np.add.reduceat(np.where(nm, 0.0, vm), starts, axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[_MEAN_ROWS] = np.where(cnt > 0, s / np.maximum(cnt, 1), np.nan)
        else:  # every count is the group size
            out[_MEAN_ROWS] = np.add.reduceat(vm, starts, axis=1) / n
    if len(_MAX_ROWS):
        vx = v[_MAX_ROWS]
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
            mx[nan[_MAX_ROWS].all(axis=1)] = np.nan
        out[_MAX_ROWS] = mx
    if len(_LAST_ROWS):
        vl = v[_LAST_ROWS]
        if has_nan:  # the newest row with a value, per field: the largest non-NaN position
            pos = np.where(nan[_LAST_ROWS], -1, np.arange(m))
            last = np.maximum.reduceat(pos, starts, axis=1)
            picked = np.take_along_axis(vl, np.maximum(last, 0), axis=1)
            out[_LAST_ROWS] = np.where(last >= 0, picked, np.nan)
        else:
            out[_LAST_ROWS] = vl[:, ends]
    c = carry[order[ends]] if carry is not None else None
    return k[starts], b[starts], n, t[ends], out, c


def _merge_sql(table: str) -> str:
    """ON CONFLICT updates folding a new partial aggregate into the stored one (the same SQL
    on PostgreSQL and SQLite; SET expressions see the row's old values)."""
    t, x = table, "excluded"
    sets = [f"n = {t}.n + {x}.n",
            f"last_ts = CASE WHEN {x}.last_ts > {t}.last_ts THEN {x}.last_ts ELSE {t}.last_ts END"]
    for f in FIELDS:
        o, w = f"{t}.{f.name}", f"{x}.{f.name}"
        if f.rollup == "max":
            e = f"CASE WHEN {o} IS NULL THEN {w} WHEN {w} > {o} THEN {w} ELSE {o} END"
        elif f.rollup == "last":
            e = (f"CASE WHEN {w} IS NULL THEN {o} WHEN {o} IS NULL THEN {w} "
                 f"WHEN {x}.last_ts >= {t}.last_ts THEN {w} ELSE {o} END")
        else:  # mean, weighted by samples folded in (per row, not per non-null value)
            e = (f"CASE WHEN {w} IS NULL THEN {o} WHEN {o} IS NULL THEN {w} "
                 f"ELSE ({o} * {t}.n + {w} * {x}.n) / ({t}.n + {x}.n) END")
        sets.append(f"{f.name} = {e}")
    if table == "gpu_samples_1m":
        sets.append(f"job_pk = CASE WHEN {x}.last_ts >= {t}.last_ts THEN {x}.job_pk ELSE {t}.job_pk END")
    return ", ".join(sets)


_PG_ARRAY = {"f4": "float8[]", "f8": "float8[]", "i8": "int8[]"}


def _rollup_sql(dialect: str, table: str, key_col: str) -> str:
    cols = [key_col, "bucket", "n", "last_ts"] + (["job_pk"] if table == "gpu_samples_1m" else []) + list(NAMES)
    conflict = f"ON CONFLICT ({key_col}, bucket) DO UPDATE SET {_merge_sql(table)}"
    if dialect == "postgresql":
        types = ["int4[]", "float8[]", "int4[]", "float8[]"] + (["int4[]"] if table == "gpu_samples_1m" else []) \
            + [_PG_ARRAY[f.dtype] for f in FIELDS]
        # One statement for all rows: each column arrives as one binary array parameter
        # (built with numpy, see _PgArray) and is unnested into rows. Integer fields travel as
        # float8 (null where NaN) and are cast; the statement is prepared once per connection.
        args = ", ".join(f"%b::{'float8[]::int8[]' if t == 'int8[]' else t}" for t in types)
        return f"INSERT INTO {table} ({', '.join(cols)}) SELECT * FROM unnest({args}) {conflict}"
    return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) {conflict}"


_SQL_CACHE: dict[tuple[str, str, str], str] = {}


def _upsert_rollup(conn: Connection, table: Any, key_col: str, keys: np.ndarray, buckets: np.ndarray,
                   n: np.ndarray, last_ts: np.ndarray, agg: np.ndarray, carry: np.ndarray | None) -> None:
    if not len(keys):
        return
    dialect = conn.dialect.name
    ck = (dialect, table.name, key_col)
    sql = _SQL_CACHE.get(ck)
    if sql is None:
        sql = _SQL_CACHE[ck] = _rollup_sql(dialect, table.name, key_col)
    # Sorted keys: concurrent writers lock rollup rows in the same order (no deadlocks).
    if dialect == "postgresql":
        arrays = [keys, buckets, n, last_ts] + ([np.where(carry < 0, np.nan, carry)] if carry is not None else [])
        params = [_pg_array(a, integer=k in (0, 2, 4)) for k, a in enumerate(arrays)]
        params += _pg_float_arrays(agg)
        _execute_prepared(conn, sql, params)
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


class _PgArray:
    """A one-dimensional PostgreSQL array already in binary wire format (see _pg_array)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _Float8Array(_PgArray):
    __slots__ = ()


class _Int4Array(_PgArray):
    __slots__ = ()


class _Float8ArrayDumper(Dumper):
    format = Format.BINARY
    oid = 1022  # float8[]

    def dump(self, obj: Any) -> bytes:
        return obj.data  # type: ignore[no-any-return]


class _Int4ArrayDumper(_Float8ArrayDumper):
    oid = 1007  # int4[]


# Global, but only for these private wrapper types: nothing else changes how it is dumped.
psycopg.adapters.register_dumper(_Float8Array, _Float8ArrayDumper)
psycopg.adapters.register_dumper(_Int4Array, _Int4ArrayDumper)
_ELEM = {False: (701, ">f8", 8), True: (23, ">i4", 4)}
_ELEM_REC = {False: np.dtype([("l", ">i4"), ("v", ">f8")]), True: np.dtype([("l", ">i4"), ("v", ">i4")])}


def _pg_array(a: np.ndarray, *, integer: bool) -> _PgArray:
    """``a`` as a binary array parameter; NaN becomes NULL. Built with numpy: formatting
    every rollup value as text (repr + join) was the largest Python cost of a group commit."""
    af = np.asarray(a, dtype=np.float64)
    nan = np.isnan(af)
    oid, dt, size = _ELEM[integer]
    n = len(af)
    rec = np.empty(n, dtype=_ELEM_REC[integer])
    if not nan.any():  # the usual case: no masking, no null bitmap
        rec["l"] = size
        rec["v"] = af.astype(dt) if integer else af
        return (_Int4Array if integer else _Float8Array)(struct.pack(">iiIii", 1, 0, oid, n, 1) + rec.tobytes())
    rec["l"] = np.where(nan, -1, size)
    rec["v"] = np.where(nan, 0, af).astype(dt) if integer else af
    # a null element is its length (-1) alone: drop its value bytes
    keep = np.ones((n, 4 + size), dtype=bool)
    keep[nan, 4:] = False
    body = np.frombuffer(rec.tobytes(), dtype=np.uint8).reshape(n, 4 + size)[keep].tobytes()
    return (_Int4Array if integer else _Float8Array)(struct.pack(">iiIii", 1, 1, oid, n, 1) + body)


def _pg_float_arrays(mat: np.ndarray) -> list[_PgArray]:
    """``_pg_array(row, integer=False)`` for every row of ``mat``: the rows without NaN (most
    rollup columns) are encoded by one numpy pass and sliced, instead of one call each."""
    rows, n = mat.shape
    nan_rows = np.isnan(mat).any(axis=1).tolist()
    rec = np.empty(mat.shape, dtype=_ELEM_REC[False])
    rec["l"] = 8
    rec["v"] = mat
    body, w = rec.tobytes(), n * 12
    head = struct.pack(">iiIii", 1, 0, 701, n, 1)
    return [_pg_array(mat[j], integer=False) if nan_rows[j] else _Float8Array(head + body[j * w:(j + 1) * w])
            for j in range(rows)]


def _execute_prepared(conn: Connection, sql: str, params: list[Any]) -> None:
    """Run the long upsert as a protocol-level prepared statement (psycopg ``prepare=True``):
    planned once per connection by the server. Unlike SQL ``PREPARE`` it survives rolled
    back transactions, and the values travel as plain text parameters (no list dumping)."""
    raw = conn.connection.driver_connection
    with raw.cursor() as cur:  # type: ignore[union-attr]
        cur.execute(sql, params, prepare=True)


# --- the write -----------------------------------------------------------------------------

def _dupe_result() -> BatchResult:
    return BatchResult(0, True)


def write_batches(conn: Connection, batches: Sequence[Batch | Prepared], now: float,
                  cache: WriteCache | None = None) -> WriteResult:
    """Store ``batches`` inside the caller's transaction. A batch whose (boot_id, seq) was
    stored before is acknowledged as a duplicate and not stored again. Raises BatchRejected
    (with ``index``) for a batch that can never be stored; the caller rolls back."""
    cache = cache if cache is not None else WriteCache()
    preps: list[Prepared] = []
    for i, b in enumerate(batches):
        try:
            preps.append(prepare(b) if isinstance(b, Batch) else b)
        except BatchRejected as e:
            e.index = i
            raise
    results: list[BatchResult | None] = [None] * len(preps)

    # Dimensions every batch needs, even a duplicate (the ledger row references its node).
    cids = _cluster_ids(conn, (p.batch.agent.cluster for p in preps), cache)
    node_key = [(cids[p.batch.agent.cluster], p.batch.agent.node) for p in preps]
    nids = _node_ids(conn, node_key, cache)

    # Idempotency: the ledger insert decides which batches are new; a concurrent writer
    # inserting the same key blocks here until it commits, then we see a conflict.
    seen: dict[tuple[str, int], int] = {}
    ledger: list[dict[str, Any]] = []
    for i, p in enumerate(preps):
        if p.key in seen:
            results[i] = _dupe_result()
            continue
        seen[p.key] = i
        ledger.append({"boot_id": p.key[0], "seq": p.key[1], "node_id": nids[node_key[i]],
                       "received_at": now, "rows": p.n})
    ledger.sort(key=lambda r: (r["boot_id"], r["seq"]))
    new_keys: set[tuple[str, int]] = set()
    if ledger:
        new_keys = _ledger_insert(conn, ledger)
    active: list[int] = []
    for i, p in enumerate(preps):
        if results[i] is None:
            if p.key in new_keys:
                active.append(i)
            else:
                results[i] = _dupe_result()
    if not active:
        return WriteResult([r for r in results if r is not None])

    # Nodes seen now (one update per node, in id order; at most every NODE_SEEN_EVERY_S per
    # process unless the agent version changed).
    node_seen: dict[int, tuple[float, str]] = {}
    for i in active:
        nid = nids[node_key[i]]
        ver = preps[i].batch.agent.version
        last = cache.node_seen.get(nid)
        if last is None or now - last[0] >= NODE_SEEN_EVERY_S or last[1] != ver:
            node_seen[nid] = (now, ver)
    if node_seen:
        conn.execute(update(Node.__table__).where(Node.__table__.c.id == bindparam("nid"))
                     .values(last_seen=bindparam("seen"), agent_version=bindparam("ver")),
                     [{"nid": k, "seen": v[0], "ver": v[1] or None} for k, v in sorted(node_seen.items())])
        cache.node_seen.update(node_seen)

    # GPUs: those listed in the batch; a sample's GPU must be listed or already known for the node.
    per_node: dict[int, dict[str, Any]] = {}
    batch_of_node: dict[int, int] = {}
    for i in active:
        nid = nids[node_key[i]]
        batch_of_node[nid] = i
        d = per_node.setdefault(nid, {})
        for g in preps[i].batch.gpus:
            d[g.uuid] = g
    gids = _gpu_ids(conn, per_node, now, cache, batch_of_node)
    unknown = sorted({u for i in active for u in set(preps[i].gpu) if u not in gids})
    if unknown:
        t = Gpu.__table__
        for uuid, pk, node_id in conn.execute(select(t.c.uuid, t.c.id, t.c.node_id).where(t.c.uuid.in_(unknown))):
            gids[uuid] = pk
            cache.gpus.setdefault(uuid, (pk, node_id, (), 0.0))
    for i in active:
        p = preps[i]
        nid = nids[node_key[i]]
        # Distinct GPUs only (a batch has a handful over 80+ rows); the row is looked up for
        # the message when one is wrong.
        bad = [u for u in set(p.gpu) if u not in gids or cache.gpus.get(u, (0, nid))[1] != nid]
        if bad:
            r = min(p.gpu.index(u) for u in bad)
            raise BatchRejected(f"samples.gpu[{r}]: GPU {p.gpu[r]!r} is not listed in this batch's gpus "
                                f"and not known for node {p.batch.agent.node!r}", index=i)

    # Jobs: described ones and the ones samples/allocations merely reference.
    jobs: dict[tuple[int, str], Any] = {}
    for i in active:
        cid = cids[preps[i].batch.agent.cluster]
        for jid in set(preps[i].job):
            if jid is not None:
                jobs.setdefault((cid, jid), None)
        for a in preps[i].batch.allocations:
            jobs.setdefault((cid, a.job_id), None)
        for info in preps[i].batch.jobs:
            jobs[(cid, info.job_id)] = info
    jpks = _job_ids(conn, jobs, cache)

    # Rows of every active batch as one set of arrays.
    ts = np.concatenate([preps[i].ts for i in active])
    gpu_parts, job_parts = [], []
    for i in active:
        p = preps[i]
        cid = cids[p.batch.agent.cluster]
        # Map the few distinct values, then the rows with a C-level map (no per-row bytecode).
        gmap = {u: gids[u] for u in set(p.gpu)}
        jmap = {j: (-1 if j is None else jpks[(cid, j)]) for j in set(p.job)}
        gpu_parts.append(np.fromiter(map(gmap.__getitem__, p.gpu), dtype=np.int64, count=p.n))
        job_parts.append(np.fromiter(map(jmap.__getitem__, p.job), dtype=np.int64, count=p.n))
    gpu_pk = np.concatenate(gpu_parts) if gpu_parts else np.empty(0, np.int64)
    job_pk = np.concatenate(job_parts) if job_parts else np.empty(0, np.int64)
    vals = np.concatenate([preps[i].vals for i in active], axis=1) if active else np.empty((NF, 0))

    if len(ts) and conn.dialect.name == "postgresql":
        _ensure_partitions_inline(conn, retention.days_of(ts))
    _insert_samples(conn, ts, gpu_pk, job_pk, vals)

    # Rows by (GPU, time): the GPU rollup and the allocation runs both walk this order.
    gpu_order = np.lexsort((ts, gpu_pk)) if len(ts) else None
    if len(ts):
        k, b, n, lt, agg, carry = _rollup(gpu_pk, ts, vals, job_pk, order=gpu_order)
        _upsert_rollup(conn, gpu_samples_1m, "gpu_pk", k, b, n, lt, agg, carry)
        has_job = job_pk >= 0
        if has_job.any():
            # Sorting the job rows' numbers (not masked copies of the arrays) lets _rollup
            # gather the sample matrix once.
            rows = np.flatnonzero(has_job)
            k, b, n, lt, agg, _ = _rollup(job_pk, ts, vals, None, order=rows[np.lexsort((ts[rows], job_pk[rows]))])
            _upsert_rollup(conn, job_samples_1m, "job_pk", k, b, n, lt, agg, None)
        _touch_jobs(conn, job_pk, ts, cache)

    _allocations(conn, preps, active, cids, gids, jpks, ts, gpu_pk, job_pk, order=gpu_order, cache=cache, now=now)
    _events(conn, preps, active, nids, node_key, gids)

    for i in active:
        results[i] = BatchResult(preps[i].n, False)
    return WriteResult([r for r in results if r is not None])


def _ledger_insert(conn: Connection, ledger: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """Insert idempotency keys; returns those that were new (not stored before)."""
    cols = ("boot_id", "seq", "node_id", "received_at", "rows")
    vals = [[r[c] for r in ledger] for c in cols]
    tail = "ON CONFLICT (boot_id, seq) DO NOTHING RETURNING boot_id, seq"
    if conn.dialect.name == "postgresql":
        sql = (f"INSERT INTO ingest_batches ({', '.join(cols)}) SELECT * FROM "
               f"unnest(%s::text[], %s::int8[], %s::int4[], %s::float8[], %s::int4[]) {tail}")
        rows = conn.exec_driver_sql(sql, tuple(vals)).all()
    else:
        rows = []
        for i in range(0, len(ledger), 1000):  # SQLite caps bound variables per statement
            part = ledger[i:i + 1000]
            sql = f"INSERT INTO ingest_batches ({', '.join(cols)}) VALUES " \
                  + ", ".join(["(?, ?, ?, ?, ?)"] * len(part)) + f" {tail}"
            rows += conn.exec_driver_sql(sql, tuple(r[c] for r in part for c in cols)).all()
    return {(b, int(q)) for b, q in rows}


def _ensure_partitions_inline(conn: Connection, days: set[int]) -> None:
    url = conn.engine.url.render_as_string(hide_password=True)
    todo = retention.missing_days(url, days)
    for table, day in todo:
        name = retention.partition_name(table, day)
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:n))"), {"n": name})
        conn.execute(text(retention.create_partition_sql(table, day)))
    # Marked known only by the caller's successful commit would be exact; marking now is
    # safe because a rollback leaves "no partition for row" errors, on which the collector
    # forgets the cache and retries.
    with retention._known_lock:
        for table, day in todo:
            retention._known.add((url, table, day))


def _touch_jobs(conn: Connection, job_pk: np.ndarray, ts: np.ndarray, cache: WriteCache) -> None:
    """start_ts / last_sample_ts from samples; a job sampled after it was marked ended runs again."""
    m = job_pk >= 0
    if not m.any():
        return
    jp, t = job_pk[m], ts[m]
    order = np.argsort(jp, kind="stable")
    jp, t = jp[order], t[order]
    starts = np.flatnonzero(np.r_[True, jp[1:] != jp[:-1]])
    lo, hi = np.minimum.reduceat(t, starts), np.maximum.reduceat(t, starts)
    todo = []
    for p, a, b in zip(jp[starts].tolist(), lo.tolist(), hi.tolist(), strict=True):
        seen = cache.job_times.get(p)
        if seen is None or a < seen[0] or b > seen[1] + JOB_TOUCH_EVERY_S:
            todo.append({"pk": p, "lo": a, "hi": b})
            cache.job_times[p] = (min(a, seen[0]) if seen else a, max(b, seen[1]) if seen else b)
    if not todo:
        return
    jt = Job.__table__
    lo_p, hi_p = bindparam("lo"), bindparam("hi")
    reopen = and_(jt.c.end_ts.is_not(None), hi_p > jt.c.end_ts)
    conn.execute(
        update(jt).where(jt.c.id == bindparam("pk")).values(
            start_ts=case((or_null_or_gt(jt.c.start_ts, lo_p), lo_p), else_=jt.c.start_ts),
            last_sample_ts=case((or_null_or_lt(jt.c.last_sample_ts, hi_p), hi_p), else_=jt.c.last_sample_ts),
            state=case((reopen, literal_column("'running'")), else_=jt.c.state),
            end_ts=case((reopen, None), else_=jt.c.end_ts),
        ),
        todo,
    )


def or_null_or_gt(col: Any, v: Any) -> Any:
    return col.is_(None) | (col > v)


def or_null_or_lt(col: Any, v: Any) -> Any:
    return col.is_(None) | (col < v)


def _allocations(conn: Connection, preps: list[Prepared], active: list[int], cids: dict[str, int],
                 gids: dict[str, int], jpks: dict[tuple[int, str], int], ts: np.ndarray, gpu_pk: np.ndarray,
                 job_pk: np.ndarray, order: np.ndarray | None = None, cache: WriteCache | None = None,
                 now: float = 0.0) -> None:
    """Open/close allocations as each GPU's job changes (from samples, ordered by time).
    ``order``: ``np.lexsort((ts, gpu_pk))`` when the caller already has it. With ``cache``,
    GPUs whose rows all continue the open allocation read recently are not read again (the
    steady state: a GPU keeps its job for hours, and this query was a group commit's largest
    remaining Python cost)."""
    since: dict[tuple[int, int], float] = {}
    for i in active:
        cid = cids[preps[i].batch.agent.cluster]
        for a in preps[i].batch.allocations:
            if a.gpu_uuid in gids and math.isfinite(a.since):
                since[(gids[a.gpu_uuid], jpks[(cid, a.job_id)])] = a.since
    if not len(ts):
        return
    # Runs of constant (GPU, job) in time order: only the change points are visited in Python.
    if order is None:
        order = np.lexsort((ts, gpu_pk))
    g, j, t = gpu_pk[order], job_pk[order], ts[order]
    change = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (j[1:] != j[:-1])])
    runs: dict[int, list[tuple[float, int | None]]] = {}
    for gg, jj, tt in zip(g[change].tolist(), j[change].tolist(), t[change].tolist(), strict=True):
        runs.setdefault(gg, []).append((tt, None if jj < 0 else jj))
    if cache is not None:
        known = cache.allocs
        for gpu in [gpu for gpu, rs in runs.items() if len(rs) == 1 and gpu in known]:
            jp0, start0, read_at = known[gpu]
            if rs_continue(runs[gpu][0], jp0, start0) and now - read_at < ALLOC_TRUST_S:
                del runs[gpu]
        if not runs:
            return
    at = Allocation.__table__
    gpus = sorted(runs)
    # Raw SQL with one array parameter: an IN list of thousands of GPUs is slow to compile.
    if conn.dialect.name == "postgresql":
        q = ("SELECT id, gpu_pk, job_pk, start_ts FROM allocations WHERE end_ts IS NULL "
             "AND gpu_pk = ANY(%s::int4[]) ORDER BY gpu_pk, start_ts")
        rows = conn.exec_driver_sql(q, (gpus,)).all()
    else:
        q = ("SELECT id, gpu_pk, job_pk, start_ts FROM allocations WHERE end_ts IS NULL "
             "AND gpu_pk IN (SELECT value FROM json_each(?)) ORDER BY gpu_pk, start_ts")
        rows = conn.exec_driver_sql(q, (msgspec.json.encode(gpus).decode(),)).all()
    open_rows = {g: (aid, jp, st) for aid, g, jp, st in rows}
    closes: list[dict[str, Any]] = []
    opens: list[dict[str, Any]] = []
    for gpu in sorted(runs):
        cur = open_rows.get(gpu)  # (alloc id or None for a new one, job_pk, start)
        writes = len(closes) + len(opens)
        for t0, jp in runs[gpu]:
            if cur is not None and t0 < cur[2]:
                continue  # an old batch arriving late: it cannot rewrite the GPU's history
            if cur is not None and cur[1] == jp:
                continue
            if cur is not None:
                if cur[0] is not None:
                    closes.append({"aid": cur[0], "end": t0})
                else:
                    opens[-1]["end_ts"] = t0
                cur = None
            if jp is not None:
                start = min(since.get((gpu, jp), t0), t0)
                opens.append({"job_pk": jp, "gpu_pk": gpu, "start_ts": start, "end_ts": None})
                cur = (None, jp, start)
        if cache is not None:
            if writes == len(closes) + len(opens):  # the database's state, confirmed unchanged
                cache.allocs[gpu] = (cur[1], cur[2], now) if cur is not None else (None, -math.inf, now)
            else:  # what we wrote may lose to a concurrent collector: read it next time
                cache.allocs.pop(gpu, None)
    if closes:
        conn.execute(update(at).where(at.c.id == bindparam("aid")).values(end_ts=bindparam("end")), closes)
    if opens:
        # A concurrent collector that opened the same GPU's allocation first wins; the
        # partial unique index makes this one a no-op instead of a second open row.
        ins = _insert(conn, at).on_conflict_do_nothing(index_elements=["gpu_pk"], index_where=at.c.end_ts.is_(None))
        closed = [o for o in opens if o["end_ts"] is not None]
        still_open = [o for o in opens if o["end_ts"] is None]
        if closed:
            conn.execute(at.insert(), closed)
        if still_open:
            conn.execute(ins, still_open)


def rs_continue(run: tuple[float, int | None], job_pk: int | None, start: float) -> bool:
    """A GPU's only run in a group (starting at ``run[0]``, of job ``run[1]``) continues its
    open allocation (``job_pk`` since ``start``; None = no open allocation): nothing to write."""
    return run[1] == job_pk and run[0] >= start


def _events(conn: Connection, preps: list[Prepared], active: list[int], nids: dict[tuple[int, str], int],
            node_key: list[tuple[int, str]], gids: dict[str, int]) -> None:
    rows = [{"ts": e.ts, "node_id": nids[node_key[i]], "gpu_pk": gids.get(e.gpu_uuid) if e.gpu_uuid else None,
             "kind": e.kind, "code": e.code, "message": e.message}
            for i in active for e in preps[i].batch.events]
    if rows:
        conn.execute(Event.__table__.insert(), rows)


def close_stale_jobs(conn: Connection, now: float, stale_after: float = STALE_JOB_S) -> int:
    """Mark running jobs that no node has reported for ``stale_after`` seconds as ended (at
    their last sample) and close their open allocations. Returns how many jobs ended."""
    jt, at = Job.__table__, Allocation.__table__
    cutoff = now - stale_after
    last = jt.c.last_sample_ts
    stale = select(jt.c.id).where(jt.c.state == "running",
                                  ((last.is_not(None)) & (last < cutoff))
                                  | (last.is_(None) & jt.c.start_ts.is_not(None) & (jt.c.start_ts < cutoff)))
    ids = sorted(conn.execute(stale).scalars().all())
    if not ids:
        return 0
    for chunk in (ids[i:i + 1000] for i in range(0, len(ids), 1000)):
        conn.execute(update(jt).where(jt.c.id.in_(chunk), jt.c.state == "running")
                     .values(state="ended", end_ts=case((last.is_(None), jt.c.start_ts), else_=last)))
        end = select(jt.c.end_ts).where(jt.c.id == at.c.job_pk).scalar_subquery()
        conn.execute(update(at).where(at.c.job_pk.in_(chunk), at.c.end_ts.is_(None)).values(end_ts=end))
    return len(ids)
