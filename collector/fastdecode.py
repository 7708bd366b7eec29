"""A faster decode for the common case: the body decoded with each sample column typed
(``ts`` numbers, ``gpu`` strings, ``job`` strings or null, fields numbers or null) instead of
the protocol's generic ``float | int | str | None`` cells, so no second pass is needed to
reject strings among numbers. Anything this decoder refuses goes through the generic
``protocol.decode`` + ``collector.columns.prepare`` path, which produces the precise error, so
both paths accept and reject exactly the same bodies (tests/collector/test_packed.py). The
packed columns' structure is checked by ``protocol.check_packed`` (its one home) with the
index extremes computed here by numpy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import msgspec
import numpy as np

from gpufleet import protocol
from gpufleet.collector.columns import FieldBounds, field_bounds, field_bounds_ok, prepare_typed, repeated_row
from gpufleet.collector.errors import BatchRejected
from gpufleet.collector.validate import check_gpus, check_jobs
from gpufleet.protocol import (
    Allocation,
    Batch,
    CollectiveAgg,
    Event,
    GpuInfo,
    GpuNic,
    JobInfo,
    NicSample,
    Packed,
    ProgressWindow,
)
from gpufleet.storage.fields import FIELD_INDEX, NF
from gpufleet.storage.prepared import Prepared


class _Batch(msgspec.Struct, forbid_unknown_fields=True):
    agent: protocol.AgentInfo
    v: int = protocol.PROTOCOL_VERSION
    gpus: msgspec.Raw = msgspec.Raw()  # decoded and checked through _DimCache; empty = absent
    jobs: msgspec.Raw = msgspec.Raw()
    allocations: list[Allocation] = []
    samples: dict[str, msgspec.Raw] = {}
    events: list[Event] = []
    packed: Packed | None = None
    # The optional sections, decoded with the protocol's own structs (so the progress bounds in
    # their annotations are the same check here); their value checks (check_fabric) run in
    # check_batch on both paths, never here.
    progress: list[ProgressWindow] = []
    collectives: list[CollectiveAgg] = []
    nics: list[NicSample] = []
    gpu_nics: list[GpuNic] = []


def _batch(b: _Batch, gpus: list[GpuInfo], jobs: list[JobInfo]) -> Batch:
    """The protocol Batch the fast path hands on: every section but the samples (which
    travel as Prepared arrays), so storage.writes.SECTION_WRITERS see them."""
    return Batch(agent=b.agent, v=b.v, gpus=gpus, jobs=jobs, allocations=b.allocations, samples={},
                 events=b.events, progress=b.progress, collectives=b.collectives, nics=b.nics,
                 gpu_nics=b.gpu_nics)


# A msgpack array of float64 values only (what msgspec and the agent write for float
# columns): one type byte 0xcb + 8 big-endian bytes per element after the array header.
_F64 = np.dtype([("tag", "u1"), ("v", ">f8")])


def _f64_payload(col: msgspec.Raw) -> tuple[int, memoryview] | None:
    """(n, the elements' bytes) of a msgpack array whose size fits n float64 elements or n
    one-byte integers, or None (then msgspec decodes the column). The type bytes are checked later, for all
    columns at once: per-column numpy calls cost more than the decoding they replace."""
    raw = memoryview(col)
    if not raw:
        return None
    t = raw[0]
    if 0x90 <= t <= 0x9F:
        n, head = t & 0x0F, 1
    elif t == 0xDC and len(raw) >= 3:
        n, head = int.from_bytes(raw[1:3], "big"), 3
    elif t == 0xDD and len(raw) >= 5:
        n, head = int.from_bytes(raw[1:5], "big"), 5
    else:
        return None
    if n == 0 or len(raw) not in (head + 9 * n, head + n):
        return None
    return n, raw[head:]


_T = TypeVar("_T")
# msgspec's two decoders share ``decode(buf) -> T``; which one a call gets depends on the body's format.
_Decoder = msgspec.msgpack.Decoder[_T] | msgspec.json.Decoder[_T]


class _DimCache(Generic[_T]):
    """Decoded and checked ``gpus`` / ``jobs`` lists by their encoded bytes: an agent sends
    the same lists in every batch, and checking 8 GPUs' strings costs more than the rest of a
    packed batch's decode. Bounded: cleared when full (a miss only costs the check). A plain
    dict, not a cachetools LRU, on purpose: this is looked up twice per request on the hot
    path, and an LRU lookup (~0.4 us, a linked-list update per hit) measured 2x the dict's
    total here, for an eviction order that does not matter (agents' lists are few and steady)."""

    def __init__(self, items: type[list[_T]], check: Callable[[list[_T]], None], limit: int = 50_000) -> None:
        self.dec: dict[str, _Decoder[list[_T]]] = {"msgpack": msgspec.msgpack.Decoder(items),
                                                    "json": msgspec.json.Decoder(items)}
        self.check = check
        self.limit = limit
        self.cache: dict[tuple[str, bytes], list[_T]] = {}

    def get(self, raw: msgspec.Raw, fmt: str) -> list[_T] | None:
        """The list, or None when it does not decode or breaks a limit (the generic path then
        names the problem)."""
        if not raw:
            return []
        key = (fmt, bytes(raw))
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        try:
            items = self.dec[fmt].decode(raw)
            self.check(items)
        except (msgspec.DecodeError, msgspec.ValidationError, BatchRejected, RecursionError):
            return None
        if len(self.cache) >= self.limit:
            self.cache.clear()
        self.cache[key] = items
        return items


_gpus = _DimCache(list[GpuInfo], check_gpus)
_jobs = _DimCache(list[JobInfo], check_jobs)

_TYPES = {"ts": list[float], "gpu": list[str], "job": list[str | None], "val": list[float | None]}
_decoders: dict[str, tuple[_Decoder[_Batch], dict[str, _Decoder[Any]]]] = {
    "msgpack": (msgspec.msgpack.Decoder(_Batch), {k: msgspec.msgpack.Decoder(t) for k, t in _TYPES.items()}),
    "json": (msgspec.json.Decoder(_Batch), {k: msgspec.json.Decoder(t) for k, t in _TYPES.items()}),
}


def _numpy_columns(fast: list[tuple[str, msgspec.Raw, int, memoryview]], decoded: dict[str, Any],
                   cols: dict[str, _Decoder[Any]]) -> None:
    """Number columns straight to numpy (no Python float per value) when every element is a
    msgpack float64 (type byte 0xcb, what msgspec and the agent write for floats) or every
    element a positive fixint; any other column (nulls, larger ints, float32) goes through
    msgspec. A NaN in a numpy column is still
    rejected by prepare_typed, which counts nulls in list columns only."""
    n = fast[0][2]
    if any(f[2] != n for f in fast):  # unequal lengths: prepare_typed rejects them
        for name, raw, _, _ in fast:
            decoded[name] = cols["ts" if name == "ts" else "val"].decode(raw)
        return
    floats = [f for f in fast if len(f[3]) == 9 * n]
    small = [f for f in fast if len(f[3]) == n]
    if floats:
        rec = np.frombuffer(b"".join([f[3] for f in floats]), dtype=_F64).reshape(len(floats), n)
        ok = (rec["tag"] == 0xCB).all(axis=1).tolist()
        mat = rec["v"].astype(np.float64)
        for r, (name, raw, _, _) in enumerate(floats):
            decoded[name] = mat[r] if ok[r] else cols["ts" if name == "ts" else "val"].decode(raw)
    if small:
        # Integer fields (counters, bitmasks) are usually small: n bytes all below 0x80 are
        # n positive fixints (any other msgpack element starts with a byte >= 0x80).
        b = np.frombuffer(b"".join([f[3] for f in small]), dtype=np.uint8).reshape(len(small), n)
        ok = cast("list[bool]", (b < 0x80).all(axis=1).tolist())  # all(axis=1) of a 2-D array: 1-D, a list
        mat = b.astype(np.float64)
        for r, (name, raw, _, _) in enumerate(small):
            decoded[name] = mat[r] if ok[r] else cols["ts" if name == "ts" else "val"].decode(raw)


def decode_prepared(body: bytes, content_type: str | None) -> Prepared | None:
    """The batch as Prepared arrays, or None when the generic path must handle it (any
    decode or validation problem: it then names the field and row). A Prepared from here has
    had its ``gpus`` and ``jobs`` lists through check_gpus / check_jobs (check_batch's
    ``dims_checked``)."""
    ct = (content_type or protocol.MSGPACK).split(";")[0].strip().lower()
    fmt = "json" if ct == protocol.JSON else "msgpack" if ct in (
        protocol.MSGPACK, "application/x-msgpack", "application/vnd.msgpack") else None
    if fmt is None:
        return None
    top, cols = _decoders[fmt]
    try:
        b = top.decode(body)
        if b.v != protocol.PROTOCOL_VERSION:
            return None
        gpus, jobs = _gpus.get(b.gpus, fmt), _jobs.get(b.jobs, fmt)
        if gpus is None or jobs is None:
            return None
        if b.packed is not None:
            return None if b.samples else _from_packed(b, b.packed, gpus, jobs)
        s = b.samples
        if s and ("ts" not in s or "gpu" not in s):
            return None
        decoded: dict[str, Any] = {}
        fast: list[tuple[str, msgspec.Raw, int, memoryview]] = []
        for name, raw in s.items():
            if name == "gpu":
                decoded[name] = cols["gpu"].decode(raw)
            elif name == "job":
                decoded[name] = cols["job"].decode(raw)
            elif name == "ts" or name in FIELD_INDEX:
                p = _f64_payload(raw) if fmt == "msgpack" else None
                if p is None:
                    decoded[name] = cols["ts" if name == "ts" else "val"].decode(raw)
                else:
                    decoded[name] = None  # filled below, keeping the column order
                    fast.append((name, raw, *p))
            else:
                return None
        if fast:
            _numpy_columns(fast, decoded, cols)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None  # the generic decode names it (deep nesting included)
    return prepare_typed(_batch(b, gpus, jobs), decoded)


# A dict for the same reason as _DimCache (one lookup per request); bounded by not adding.
_FIELD_ARRAYS: dict[tuple[str, ...], tuple[np.ndarray, FieldBounds] | None] = {}


def _field_arrays(fields: list[str]) -> tuple[np.ndarray, FieldBounds] | None:
    """(catalog indices, their field_bounds) for a field list, or None when a name is
    unknown or repeated. Agents send the same list batch after batch: cached."""
    key = tuple(fields)
    hit = _FIELD_ARRAYS.get(key, False)
    if hit is not False:
        return hit  # type: ignore[return-value]  # not the False default: a cached entry (arrays or None)
    idx = [FIELD_INDEX.get(f, -1) for f in fields]
    out = None
    if -1 not in idx and len(set(idx)) == len(idx):
        ia = np.array(idx, dtype=np.intp)
        out = (ia, field_bounds(ia))
    if len(_FIELD_ARRAYS) < 1024:
        _FIELD_ARRAYS[key] = out
    return out


def _from_packed(b: _Batch, p: Packed, gpus_info: list[GpuInfo], jobs_info: list[JobInfo]) -> Prepared | None:
    """Binary columns -> Prepared with a handful of numpy calls whatever the row count. A
    structural problem raises ProtocolError (``protocol.check_packed``); a value problem
    returns None: the generic path then names the field and row."""
    n = p.n
    if n <= 0:
        protocol.check_packed(p)  # a negative n is refused there; no rows: the generic path
        return None
    gi = np.frombuffer(p.gpu, dtype="<u2") if len(p.gpu) == 2 * n else None
    ji = np.frombuffer(p.job, dtype="<i4") if p.job and len(p.job) == 4 * n else None
    protocol.check_packed(p, gpu_max=int(gi.max()) if gi is not None else None,
                          job_min=int(ji.min()) if ji is not None else None,
                          job_max=int(ji.max()) if ji is not None else None)
    assert gi is not None  # check_packed refused any other length
    k = len(p.fields)
    fa = _field_arrays(p.fields) if k else None
    if k and fa is None:
        return None
    ts = np.frombuffer(p.ts, dtype="<f8")
    if not np.isfinite(ts).all() or repeated_row(ts, gi) is not None:
        return None  # the generic path names the value or the repeated row
    vals = np.full((NF, n), np.nan)
    if fa is not None:
        idx, bounds = fa
        mat = np.frombuffer(p.values, dtype="<f8").reshape(k, n)
        if not field_bounds_ok(mat, bounds):  # NaN passes: packed NaN is "not available"
            return None
        vals[idx] = mat
    gpus = p.gpus
    gpu = [gpus[i] for i in gi.tolist()]
    if ji is not None:
        table: list[str | None] = [*p.jobs, None]  # index -1 picks the None at the end
        job = [table[i] for i in ji.tolist()]
    else:
        job = [None] * n
    return Prepared(_batch(b, gpus_info, jobs_info), ts, gpu, job, vals, tuple(p.fields))
